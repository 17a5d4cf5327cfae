"""Warp kernels of one physics substep, one thread per environment (float32).

The algorithm is the one of :mod:`bcg.sim.reference` (read that module for the maths). One substep is eight
launches: ``fk_rnea`` -> ``composite`` -> ``mass_tau`` -> ``factor_free`` -> ``contact_setup`` -> ``pgs`` ->
``apply_contact`` -> ``limit_guard_integrate``. Spatial vectors are (angular, linear) about a point that moves with the robot, the root
position o = q[0:3]; body placements ``X_w`` are relative to o (the ground plane is z = -q[2] there). Only
differences of nearby positions then enter float32 arithmetic, so the dynamics are the same 3 km from the world
origin as at it (inertias about the world origin lose 1e-4 of the mass matrix at 30 m). Warp quaternions are x, y,
z, w inside the kernels, while the state arrays ``q`` keep MuJoCo's w, x, y, z.

Autodiff discipline (docs/simulator.md). Every loop bound is a run-time value, so Warp does not unroll
the loops, and its adjoint of a dynamic loop does not replay loop-carried values. Therefore:

* a loop-carried accumulator is only ever updated linearly (``acc = acc + x * y`` of array loads), and it is stored
  to a write-once array slot and re-loaded before any non-linear use (``sqrt``, division, product, clamp);
* no ``while`` loops: tree walks go over a precomputed ancestor table;
* every array is written once per substep (the caller gives each substep its own scratch);
* the logistic is written as ``0.5 * (1 + tanh(x / 2))`` so its adjoint cannot overflow;
* ``sqrt`` of the friction norm is only taken inside the branch where the norm is positive.
"""

from __future__ import annotations

import warp as wp

from bcg.sim import model as _model

# Warp's info messages (its init banner, a line per module load) off; its warnings still show
wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)

ROOT_NQ = wp.constant(7)  # qpos entries of the free root (position, quaternion w x y z); hinges follow
ROOT_NV = wp.constant(6)  # qvel entries of the free root (linear world, angular body); hinges follow
# Violations beyond these are pushed out no faster than at this depth: the Baumgarte rate beta * d / h grows without
# bound otherwise (a root 1 m under the floor left at 70 m/s, a hinge 100 rad past its limit at 1e7 rad/s).
PUSH_OUT_DEPTH = wp.constant(0.05)  # [m]
PUSH_OUT_ANGLE = wp.constant(0.25)  # [rad]

__all__ = [
    "fk_rnea",
    "composite",
    "mass_tau",
    "factor_free",
    "contact_setup",
    "pgs",
    "apply_contact",
    "limit_guard_integrate",
]


@wp.func
def crossm(v: wp.spatial_vector, m: wp.spatial_vector):
    """Spatial motion cross product v x m."""
    w = wp.spatial_top(v)
    vo = wp.spatial_bottom(v)
    mw = wp.spatial_top(m)
    mv = wp.spatial_bottom(m)
    return wp.spatial_vector(wp.cross(w, mw), wp.cross(w, mv) + wp.cross(vo, mw))


@wp.func
def crossf(v: wp.spatial_vector, f: wp.spatial_vector):
    """Spatial force cross product v x* f."""
    w = wp.spatial_top(v)
    vo = wp.spatial_bottom(v)
    n = wp.spatial_top(f)
    ff = wp.spatial_bottom(f)
    return wp.spatial_vector(wp.cross(w, n) + wp.cross(vo, ff), wp.cross(w, ff))


@wp.func
def inertia_apply(IO: wp.mat33, h: wp.vec3, m: float, v: wp.spatial_vector):
    """Spatial inertia (rotational inertia about the origin, first moment m c, mass) times a motion vector."""
    w = wp.spatial_top(v)
    vo = wp.spatial_bottom(v)
    return wp.spatial_vector(IO * w + wp.cross(h, vo), m * vo + wp.cross(w, h))


@wp.func
def sigmoid(x: float):
    return 0.5 * (1.0 + wp.tanh(0.5 * x))


DROPOUT_CELL = wp.constant(_model.DROPOUT_CELL)  # [1/m]


@wp.func
def dropout_draw(pc: wp.vec3, z_root: float, c: int, substep: int):
    """U[0, 1) draw of sphere c's contact dropout in a substep: Warp's PCG hash chained over the sphere's position
    relative to the root (10 um cells), the root height, the sphere and the substep (``reference.dropout_draw`` is
    the same hash in torch)."""
    ix = int(wp.floor(pc[0] * DROPOUT_CELL))
    iy = int(wp.floor(pc[1] * DROPOUT_CELL))
    iz = int(wp.floor((pc[2] + z_root) * DROPOUT_CELL))
    st = wp.rand_init(ix, iy)
    st = wp.rand_init(wp.randi(st), iz)
    st = wp.rand_init(wp.randi(st), c + 64 * substep)
    return wp.randf(st)


@wp.kernel
def fk_rnea(
    # state in
    q: wp.array2d(dtype=float),
    qd: wp.array2d(dtype=float),
    # model (physical parameters [P, ...], P = 1 or N)
    body_parent: wp.array(dtype=int),
    body_pos: wp.array(dtype=wp.vec3),
    body_quat: wp.array(dtype=wp.quat),
    body_axis: wp.array(dtype=wp.vec3),
    body_mass: wp.array2d(dtype=float),
    body_com: wp.array2d(dtype=wp.vec3),
    body_inertia: wp.array2d(dtype=wp.mat33),
    gravity: wp.vec3,
    # outputs (each written once per substep)
    X_w: wp.array2d(dtype=wp.transform),
    S: wp.array2d(dtype=wp.spatial_vector),
    v_b: wp.array2d(dtype=wp.spatial_vector),
    a_b: wp.array2d(dtype=wp.spatial_vector),
    IO_w: wp.array2d(dtype=wp.mat33),
    h_w: wp.array2d(dtype=wp.vec3),
    f_b: wp.array2d(dtype=wp.spatial_vector),
):
    """Forward kinematics (relative to o, see the module docstring), motion subspaces S [N, nv], twists, bias
    accelerations and RNEA body forces.

    Physical parameters (mass, COM, inertia) are [P, nb] with P = 1 (shared) or N (one row per environment).
    """
    e = wp.tid()
    pe = e % body_mass.shape[0]
    nb = body_parent.shape[0]
    for i in range(nb):
        X = wp.transform_identity()
        v = wp.spatial_vector()
        a = wp.spatial_vector()
        if i == 0:
            r = wp.normalize(wp.quat(q[e, 4], q[e, 5], q[e, 6], q[e, 3]))
            p0 = wp.vec3()  # the root is the origin o of the spatial coordinates
            X = wp.transform(p0, r)
            v_lin = wp.vec3(qd[e, 0], qd[e, 1], qd[e, 2])
            omega = wp.quat_rotate(r, wp.vec3(qd[e, 3], qd[e, 4], qd[e, 5]))
            v = wp.spatial_vector(omega, v_lin + wp.cross(p0, omega))
            a = wp.spatial_vector(wp.vec3(), wp.cross(v_lin, omega) - gravity)
            for k in range(3):
                ek = wp.vec3()
                ek[k] = 1.0
                S[e, k] = wp.spatial_vector(wp.vec3(), ek)
                ak = wp.quat_rotate(r, ek)
                S[e, 3 + k] = wp.spatial_vector(ak, wp.cross(p0, ak))
        else:
            par = body_parent[i]
            X_j = wp.transform(body_pos[i], body_quat[i]) * wp.transform(
                wp.vec3(), wp.quat_from_axis_angle(body_axis[i], q[e, ROOT_NQ - 1 + i]))
            X = X_w[e, par] * X_j
            a_w = wp.quat_rotate(wp.transform_get_rotation(X), body_axis[i])
            S_i = wp.spatial_vector(a_w, wp.cross(wp.transform_get_translation(X), a_w))
            S[e, ROOT_NV - 1 + i] = S_i
            v_j = S_i * qd[e, ROOT_NV - 1 + i]
            v = v_b[e, par] + v_j
            a = a_b[e, par] + crossm(v, v_j)
        X_w[e, i] = X
        v_b[e, i] = v
        a_b[e, i] = a
        R = wp.quat_to_matrix(wp.transform_get_rotation(X))
        c = wp.transform_point(X, body_com[pe, i])
        m = body_mass[pe, i]
        IO = R * body_inertia[pe, i] * wp.transpose(R) + m * (
            wp.dot(c, c) * wp.identity(n=3, dtype=float) - wp.outer(c, c))
        h = m * c
        IO_w[e, i] = IO
        h_w[e, i] = h
        f_b[e, i] = inertia_apply(IO, h, m, a) + crossf(v, inertia_apply(IO, h, m, v))


@wp.kernel
def composite(
    # model
    body_mass: wp.array2d(dtype=float),
    body_subtree_end: wp.array(dtype=int),
    # from fk_rnea
    IO_w: wp.array2d(dtype=wp.mat33),
    h_w: wp.array2d(dtype=wp.vec3),
    f_b: wp.array2d(dtype=wp.spatial_vector),
    # outputs (each written once per substep)
    IC_O: wp.array2d(dtype=wp.mat33),
    IC_h: wp.array2d(dtype=wp.vec3),
    IC_m: wp.array2d(dtype=float),
    F_sub: wp.array2d(dtype=wp.spatial_vector),
):
    """Subtree sums: composite inertias (CRBA) and accumulated RNEA forces (bodies in depth-first order)."""
    e = wp.tid()
    pe = e % body_mass.shape[0]
    nb = body_mass.shape[1]
    for i in range(nb):
        IO = wp.mat33()
        h = wp.vec3()
        m = float(0.0)
        f = wp.spatial_vector()
        for j in range(i, body_subtree_end[i]):
            IO = IO + IO_w[e, j]
            h = h + h_w[e, j]
            m = m + body_mass[pe, j]
            f = f + f_b[e, j]
        IC_O[e, i] = IO
        IC_h[e, i] = h
        IC_m[e, i] = m
        F_sub[e, i] = f


@wp.func
def actuator_torque(u: float, qd: float, limit: float, speed: float):
    """Actuator torque law with a torque-speed envelope, and its two slopes.

    tau = L (sat(u / L + e) - e), sat(y) = y / (1 + y^4)^(1/4), e = (qd / v0)^7: the smooth saturation of the PD
    torque u at the limit L, where the back-EMF-like shift e (v0 = ``speed``, the no-load speed) leaves the torque
    unchanged at rest and nearly so below saturation (by e (1 - sat') L), and takes away the driving torque in the direction of motion as qd
    nears v0 (to 1 % at 0.52 v0, 10 % at 0.72 v0, all of it at v0). Returns (tau, d tau / d u, partial d tau / d qd
    through e); the last is <= 0, a damping, so the implicit term it gives is positive.
    """
    w = qd / speed
    w2 = w * w
    w6 = w2 * w2 * w2
    shift = limit * w6 * w
    y = (u + shift) / limit
    y2 = y * y
    base = 1.0 + y2 * y2
    slope = wp.pow(base, -1.25)
    return wp.vec3((u + shift) * wp.pow(base, -0.25) - shift, slope, limit * (slope - 1.0) * 7.0 * w6 / speed)


@wp.func
def limit_absorption(violation: float, kappa: float, impedance: float):
    """Joint-limit stiffness ratio g = a / (1 - a) for the absorbed fraction a = impedance * sigmoid(kappa r)."""
    a = impedance * sigmoid(kappa * violation)
    return a / (1.0 - a)


@wp.kernel
def mass_tau(
    # state in
    q: wp.array2d(dtype=float),
    qd: wp.array2d(dtype=float),
    targets: wp.array2d(dtype=float),
    # model (physical parameters [P, ...], P = 1 or N)
    dof_body: wp.array(dtype=int),
    dof_ancestors: wp.array2d(dtype=int),
    dof_ancestor_count: wp.array(dtype=int),
    dof_armature: wp.array2d(dtype=float),
    dof_damping: wp.array2d(dtype=float),
    dof_actuator: wp.array(dtype=int),
    dof_limited: wp.array(dtype=int),
    dof_range: wp.array(dtype=wp.vec2),
    kp: wp.array2d(dtype=float),
    kd: wp.array2d(dtype=float),
    torque_limit: wp.array2d(dtype=float),
    actuator_speed: wp.array(dtype=float),
    # parameters
    limit_kappa: float,
    limit_impedance: float,
    beta: float,
    dt: float,
    pd_lookahead: float,
    # from fk_rnea and composite
    S: wp.array2d(dtype=wp.spatial_vector),
    IC_O: wp.array2d(dtype=wp.mat33),
    IC_h: wp.array2d(dtype=wp.vec3),
    IC_m: wp.array2d(dtype=float),
    F_sub: wp.array2d(dtype=wp.spatial_vector),
    # outputs (each written once per substep)
    H: wp.array3d(dtype=float),
    tau: wp.array2d(dtype=float),
):
    """Mass matrix H [N, nv, D] depth-indexed (armature, implicit damping, PD and joint limits on the diagonal) and
    the force tau [N, nv].

    Depth-indexed rows (H, L and L_tmp, D = the deepest dof's ancestor count + 1): H is nonzero only at (a, a) and
    (a, b) for b an ancestor of a, and row a keeps (a, b) at column depth(b) = dof_ancestor_count[b], so the
    diagonal is at count[a] and slots past it are never written or read. Armature, damping and gains are [P, nv]
    / [P, nu] and the torque limits [P, nu] with P = 1 (shared) or N (per environment). Every term is linearly implicit in the new velocity
    qd+: a force f(qd+) ~ f(qd) + f'(qd) (qd+ - qd) puts f(qd) into tau and -dt f'(qd) on the diagonal of H.
    """
    e = wp.tid()
    pe = e % dof_armature.shape[0]
    pg = e % kp.shape[0]
    pt = e % torque_limit.shape[0]
    nv = dof_body.shape[0]
    for a in range(nv):
        i = dof_body[a]
        S_a = S[e, a]
        F = inertia_apply(IC_O[e, i], IC_h[e, i], IC_m[e, i], S_a)
        h_diag = dof_armature[pe, a] + dt * dof_damping[pe, a]
        u = -wp.dot(S_a, F_sub[e, i]) - dof_damping[pe, a] * qd[e, a]
        act = dof_actuator[a]
        qa = float(0.0)
        if a >= ROOT_NV:
            qa = q[e, a + 1]
        if act >= 0:
            # PD u = kp (q* - q - lookahead dt qd+) - kd qd+ (lookahead 1: the end-of-step position, 0: MuJoCo's
            # start-of-step one), then the soft saturation
            k_p = kp[pg, act]
            k_d = kd[pg, act]
            pd = k_p * (targets[e, act] - qa - pd_lookahead * dt * qd[e, a]) - k_d * qd[e, a]
            act_tau = actuator_torque(pd, qd[e, a], torque_limit[pt, act], actuator_speed[act])
            u = u + act_tau[0]
            h_diag = h_diag + act_tau[1] * dt * (k_d + pd_lookahead * dt * k_p) - dt * act_tau[2]
        h_aa = wp.dot(S_a, F) + h_diag
        if dof_limited[a] != 0:
            # Joint limit as an implicit damper towards a reference velocity: with g = a / (1 - a) the new
            # velocity of a lone joint is (1 - a) qd_free + a v_ref, MuJoCo's soft-constraint mix at d = a. The
            # activation reads the position predicted at the end of the substep, so a fast joint is caught before
            # it crosses the limit; v_ref backs a violation out at the Baumgarte rate beta r / h and is zero inside
            # the range, so the damper never pulls a joint towards its limit.
            lo_hi = dof_range[a]
            r_hi = qa - lo_hi[1]
            r_lo = lo_hi[0] - qa
            g_hi = limit_absorption(r_hi + dt * qd[e, a], limit_kappa, limit_impedance)
            g_lo = limit_absorption(r_lo - dt * qd[e, a], limit_kappa, limit_impedance)
            v_hi = -beta * wp.clamp(r_hi, 0.0, PUSH_OUT_ANGLE) / dt
            v_lo = beta * wp.clamp(r_lo, 0.0, PUSH_OUT_ANGLE) / dt
            c = h_aa / dt  # g * c * dt = g * h_aa
            u = u - g_hi * c * (qd[e, a] - v_hi) - g_lo * c * (qd[e, a] - v_lo)
            h_aa = h_aa * (1.0 + g_hi + g_lo)
        tau[e, a] = u
        ca = dof_ancestor_count[a]
        H[e, a, ca] = h_aa
        for k in range(ca):  # the k-th nearest ancestor is at depth ca - 1 - k
            H[e, a, ca - 1 - k] = wp.dot(S[e, dof_ancestors[a, k]], F)


@wp.func
def chain_dof(a0: int, c: int, dof_ancestors: wp.array2d(dtype=int)):
    """Entry c of the kinematic chain that ends at dof a0: a0 itself, then its ancestors, nearest first."""
    d = a0
    if c > 0:
        d = dof_ancestors[a0, c - 1]
    return d


@wp.kernel
def factor_free(
    # state in
    qd: wp.array2d(dtype=float),
    # from mass_tau
    H: wp.array3d(dtype=float),
    tau: wp.array2d(dtype=float),
    # model
    dof_ancestors: wp.array2d(dtype=int),
    dof_ancestor_count: wp.array(dtype=int),
    dof_subtree_end: wp.array(dtype=int),
    dt: float,
    # outputs (each written once per substep)
    L: wp.array3d(dtype=float),
    L_tmp: wp.array3d(dtype=float),
    y: wp.array2d(dtype=float),
    y_tmp: wp.array2d(dtype=float),
    x: wp.array2d(dtype=float),
    x_tmp: wp.array2d(dtype=float),
    v_free: wp.array2d(dtype=float),
):
    """Tree-sparse factorisation H = L^T L (Featherstone's LTL: L[k, i] != 0 only for i = k or i an ancestor of k,
    so there is no fill-in, and L is depth-indexed like H: L(k, i) at L[e, k, depth(i)], see ``mass_tau``),
    x = H^-1 tau, free velocity v* = qd + dt x.

    Processed from the last dof to the first; the descendants of dof k are the contiguous range
    (k, dof_subtree_end[k]), so every entry is computed once from entries already final:
    L[k, i] = (H[k, i] - sum_{m below k} L[m, k] L[m, i]) / L[k, k].
    """
    e = wp.tid()
    nv = qd.shape[1]
    for kk in range(nv):
        k = nv - 1 - kk
        end = dof_subtree_end[k]
        dk = dof_ancestor_count[k]  # depth of k: the column of L(m, k) in every row m below k
        s = H[e, k, dk]
        for m in range(k + 1, end):
            s = s - L[e, m, dk] * L[e, m, dk]
        L_tmp[e, k, dk] = s  # store-and-reload before sqrt (loop-carried value)
        l_kk = wp.sqrt(L_tmp[e, k, dk])
        L[e, k, dk] = l_kk
        # every ancestor i of k, by its depth, two at a time: L(m, k) is loaded once for both, and the two sums
        # are independent (each still summed over m in order)
        for pair in range(dk // 2):
            d0 = 2 * pair
            d1 = d0 + 1
            t0 = H[e, k, d0]
            t1 = H[e, k, d1]
            for m in range(k + 1, end):
                l_mk = L[e, m, dk]
                t0 = t0 - l_mk * L[e, m, d0]
                t1 = t1 - l_mk * L[e, m, d1]
            L_tmp[e, k, d0] = t0
            L_tmp[e, k, d1] = t1
            L[e, k, d0] = L_tmp[e, k, d0] / l_kk
            L[e, k, d1] = L_tmp[e, k, d1] / l_kk
        if dk % 2 == 1:
            di = dk - 1
            t = H[e, k, di]
            for m in range(k + 1, end):
                t = t - L[e, m, dk] * L[e, m, di]
            L_tmp[e, k, di] = t
            L[e, k, di] = L_tmp[e, k, di] / l_kk
    # L^T y = tau (from the last dof up), then L x = y (from the root down)
    for kk in range(nv):
        k = nv - 1 - kk
        dk = dof_ancestor_count[k]
        t = tau[e, k]
        for m in range(k + 1, dof_subtree_end[k]):
            t = t - L[e, m, dk] * y[e, m]
        y_tmp[e, k] = t
        y[e, k] = y_tmp[e, k] / L[e, k, dk]
    for i in range(nv):
        t = y[e, i]
        di = dof_ancestor_count[i]
        for c in range(di):
            t = t - L[e, i, di - 1 - c] * x[e, dof_ancestors[i, c]]
        x_tmp[e, i] = t
        x[e, i] = x_tmp[e, i] / L[e, i, di]
    for a in range(nv):
        v_free[e, a] = qd[e, a] + dt * x[e, a]


@wp.func
def row_support(k: int):
    """Nonzero entries of the spatial force G = (p x n, n) of contact row k (0: n = e_z, 1: e_x, 2: e_y): the two
    angular entries, lower index first, and the linear entry (which is 1)."""
    a = (k + 2) % 3
    i0 = wp.min((a + 1) % 3, (a + 2) % 3)
    i1 = wp.max((a + 1) % 3, (a + 2) % 3)
    return wp.vec3i(i0, i1, 3 + a)


@wp.func
def chain_position(a: int, k: int, dof_ancestor_count: wp.array(dtype=int), dof_ancestors: wp.array2d(dtype=int)):
    """Index c of dof k in the chain that ends at dof a (``chain_dof(a, c) == k``), or -1 when k is not on it."""
    c = dof_ancestor_count[a] - dof_ancestor_count[k]
    found = int(-1)
    if c >= 0:
        if chain_dof(a, c, dof_ancestors) == k:
            found = c
    return found


@wp.func
def normal_weight(a_ii: float, a_foot: float, s: float):
    """Gauss-Seidel weight of a normal row whose regulariser is a_foot (1 - s) / s instead of a_ii (1 - s) / s:
    the row's update lambda <- w (lambda - r / a_ii) with w = a_ii s / (a_ii s + a_foot (1 - s))."""
    return a_ii * s / (a_ii * s + a_foot * (1.0 - s))


@wp.kernel
def contact_setup(
    # state in
    q: wp.array2d(dtype=float),
    # from fk_rnea
    X_w: wp.array2d(dtype=wp.transform),
    S: wp.array2d(dtype=wp.spatial_vector),
    # model
    sphere_body: wp.array(dtype=int),
    sphere_pos: wp.array(dtype=wp.vec3),
    sphere_radius: wp.array(dtype=float),
    sphere_foot: wp.array(dtype=int),
    foot_body: wp.array(dtype=int),
    body_last_dof: wp.array(dtype=int),
    foot_shared: wp.array2d(dtype=int),
    dof_ancestors: wp.array2d(dtype=int),
    dof_ancestor_count: wp.array(dtype=int),
    # from factor_free
    L: wp.array3d(dtype=float),
    v_free: wp.array2d(dtype=float),
    # the substep's start velocity (read by the soft contact's bias only)
    qd: wp.array2d(dtype=float),
    # parameters
    kappa: float,
    bias_gains: wp.array2d(dtype=float),
    dropout: wp.array(dtype=float),
    dropout_depth: float,
    substep: int,
    dt: float,
    # outputs (each written once per substep)
    J_foot: wp.array3d(dtype=float),
    foot_twist: wp.array2d(dtype=wp.spatial_vector),
    foot_twist0: wp.array2d(dtype=wp.spatial_vector),
    Y: wp.array3d(dtype=float),
    Y_tmp: wp.array3d(dtype=float),
    Lam: wp.array3d(dtype=float),
    G: wp.array2d(dtype=wp.spatial_vector),
    P: wp.array3d(dtype=float),
    A: wp.array3d(dtype=float),
    w: wp.array2d(dtype=float),
    s_act: wp.array2d(dtype=float),
    depth: wp.array2d(dtype=float),
    A_foot: wp.array2d(dtype=wp.vec2),
    s_norm: wp.array2d(dtype=float),
):
    """Contact rows, Delassus matrix A = J H^-1 J^T [N, 3nc, 3nc], bias w [N, 3nc] and the activations.

    Each sphere has a normal (e_z) and two tangent (e_x, e_y) rows at its lowest point p; row r is G_r^T J_foot
    with the spatial force G_r = (p x n, n), so only the 6 rows of each contact body need a solve with the factor
    of H = L^T L: Y = L^-T J_foot^T, Lam = Y^T Y, A = G Lam G^T. J_foot and Y must arrive zeroed.

    s_act [N, nc] = sigmoid(kappa d) weights the tangent rows; s_norm [N, nc] weights the normal rows with the
    regulariser of the foot's mean normal entry (see ``normal_weight``); A_foot [N, nf] holds (sum, count) of the
    foot's normal entries. bias_gains [N or 1, 3] are the normal rows' (g_free, g_start, g_depth) per environment
    (``ContactParams.normal_bias_gains``; not differentiated). dropout [N or 1] is the probability that a sphere less
    than dropout_depth [m] deep at the substep's start has no contact in it (s_act = 0; ``ContactParams.dropout``),
    drawn from a hash of the sphere's position, the sphere and the substep (``dropout_draw``).
    """
    e = wp.tid()
    nc = sphere_body.shape[0]
    nf = foot_body.shape[0]
    eg = e % bias_gains.shape[0]  # one row per environment, or the model's own row for all
    g_free = bias_gains[eg, 0]
    g_start = bias_gains[eg, 1]
    g_depth = bias_gains[eg, 2]
    p_drop = dropout[e % dropout.shape[0]]
    for f in range(nf):
        a0 = body_last_dof[foot_body[f]]
        S0 = S[e, a0]
        for m6 in range(6):
            J_foot[e, 6 * f + m6, a0] = S0[m6]
        t = S0 * v_free[e, a0]
        t0 = S0 * qd[e, a0]
        for k in range(dof_ancestor_count[a0]):
            b = dof_ancestors[a0, k]
            S_b = S[e, b]
            for m6 in range(6):
                J_foot[e, 6 * f + m6, b] = S_b[m6]
            t = t + S_b * v_free[e, b]
            t0 = t0 + S_b * qd[e, b]
        foot_twist[e, f] = t
        foot_twist0[e, f] = t0
    z_root = q[e, 2]
    for c in range(nc):
        f = sphere_foot[c]
        rad = sphere_radius[c]
        pc = wp.transform_point(X_w[e, sphere_body[c]], sphere_pos[c])
        d = rad - (pc[2] + z_root)
        depth[e, c] = d
        s_c = sigmoid(kappa * d)
        if p_drop > 0.0 and d < dropout_depth:
            if dropout_draw(pc, z_root, c, substep) < p_drop:
                s_c = 0.0
        s_act[e, c] = s_c
        p = wp.vec3(pc[0], pc[1], pc[2] - rad)
        for k in range(3):
            n = wp.vec3()
            n[(k + 2) % 3] = 1.0  # k = 0: e_z (normal), 1: e_x, 2: e_y
            G_r = wp.spatial_vector(wp.cross(p, n), n)
            r = 3 * c + k
            G[e, r] = G_r
            w_r = wp.dot(G_r, foot_twist[e, f])
            if k == 0:  # the normal row's bias (ContactParams.normal_bias_gains: Baumgarte or soft)
                w_r = (g_free * w_r + g_start * wp.dot(G_r, foot_twist0[e, f])
                       - g_depth * wp.clamp(d, 0.0, PUSH_OUT_DEPTH) / dt)
            w[e, r] = w_r
    # Y = L^-T J_foot^T: solving L^T Y_r = J_r^T only touches the foot's own chain (Y is zero elsewhere)
    # (the six rows of a foot together, as one spatial vector: each entry of L is loaded once for all six)
    for f in range(nf):
        a0 = body_last_dof[foot_body[f]]
        d0 = dof_ancestor_count[a0]  # chain entry c (chain_dof) is at depth d0 - c
        r0 = 6 * f
        for c in range(d0 + 1):
            k = chain_dof(a0, c, dof_ancestors)
            t6 = wp.spatial_vector(J_foot[e, r0, k], J_foot[e, r0 + 1, k], J_foot[e, r0 + 2, k],
                                   J_foot[e, r0 + 3, k], J_foot[e, r0 + 4, k], J_foot[e, r0 + 5, k])
            for c2 in range(c):
                m = chain_dof(a0, c2, dof_ancestors)
                y6 = wp.spatial_vector(Y[e, r0, m], Y[e, r0 + 1, m], Y[e, r0 + 2, m], Y[e, r0 + 3, m],
                                       Y[e, r0 + 4, m], Y[e, r0 + 5, m])
                t6 = t6 - L[e, m, d0 - c] * y6
            l_kk = L[e, k, d0 - c]
            for m6 in range(6):
                Y_tmp[e, r0 + m6, k] = t6[m6]
                Y[e, r0 + m6, k] = Y_tmp[e, r0 + m6, k] / l_kk
    # Lam = Y Y^T (inverse operational-space inertia of the contact bodies), a 6 x 6 block per pair of feet, summed
    # over the dofs both chains share: the tail of the first foot's chain (Y is zero off a row's chain, so this is
    # the whole sum, in its order)
    for f1 in range(nf):
        a1 = body_last_dof[foot_body[f1]]
        n1 = dof_ancestor_count[a1] + 1
        q1 = 6 * f1
        for f2 in range(f1 + 1):
            q2 = 6 * f2
            blk = wp.spatial_matrix()
            for c in range(n1 - foot_shared[f1, f2], n1):
                k = chain_dof(a1, c, dof_ancestors)
                y1 = wp.spatial_vector(Y[e, q1, k], Y[e, q1 + 1, k], Y[e, q1 + 2, k], Y[e, q1 + 3, k],
                                       Y[e, q1 + 4, k], Y[e, q1 + 5, k])
                y2 = wp.spatial_vector(Y[e, q2, k], Y[e, q2 + 1, k], Y[e, q2 + 2, k], Y[e, q2 + 3, k],
                                       Y[e, q2 + 4, k], Y[e, q2 + 5, k])
                blk = blk + wp.outer(y1, y2)
            for i6 in range(6):
                for j6 in range(6):
                    Lam[e, q1 + i6, q2 + j6] = blk[i6, j6]
                    if f2 < f1:
                        Lam[e, q2 + j6, q1 + i6] = blk[i6, j6]
    # G_r = (p x n, n) with n = e_a has three nonzeros: two angular entries (i0 < i1, the axes other than a) and
    # the linear entry 3 + a, which is 1 (``row_support``); P = G Lam and A = P G^T sum over those alone, in the
    # same order as the dense sums (whose other terms are exact zeros). Each row's entries are read once, outside
    # the loop over the other index.
    for r in range(3 * nc):
        G_r = G[e, r]
        sup = row_support(r % 3)
        b = 6 * sphere_foot[r // 3]
        g0 = G_r[sup[0]]
        g1 = G_r[sup[1]]
        for j in range(6 * nf):
            P[e, r, j] = g0 * Lam[e, b + sup[0], j] + g1 * Lam[e, b + sup[1], j] + Lam[e, b + sup[2], j]
    for r2 in range(3 * nc):  # A is symmetric: column r2 from the diagonal down, mirrored
        G2 = G[e, r2]
        sup = row_support(r2 % 3)
        b = 6 * sphere_foot[r2 // 3]
        g0 = G2[sup[0]]
        g1 = G2[sup[1]]
        j0 = b + sup[0]
        j1 = b + sup[1]
        j2 = b + sup[2]
        for r1 in range(r2, 3 * nc):
            acc = P[e, r1, j0] * g0 + P[e, r1, j1] * g1 + P[e, r1, j2]
            A[e, r1, r2] = acc
            if r1 > r2:
                A[e, r2, r1] = acc
    # the foot's mean normal Delassus entry (summed, stored and re-loaded before the division)
    for f in range(nf):
        acc_a = float(0.0)
        cnt = float(0.0)
        for c in range(nc):
            if sphere_foot[c] == f:
                acc_a = acc_a + A[e, 3 * c, 3 * c]
                cnt = cnt + 1.0
        A_foot[e, f] = wp.vec2(acc_a, cnt)
    for c in range(nc):
        sums = A_foot[e, sphere_foot[c]]
        s_norm[e, c] = normal_weight(A[e, 3 * c, 3 * c], sums[0] / sums[1], s_act[e, c])


@wp.kernel
def pgs(
    # from contact_setup
    A: wp.array3d(dtype=float),
    w: wp.array2d(dtype=float),
    s_act: wp.array2d(dtype=float),
    s_norm: wp.array2d(dtype=float),
    depth: wp.array2d(dtype=float),
    # model and parameters
    mu: wp.array(dtype=float),
    iterations: int,
    substep: int,
    # outputs (each written once per substep)
    lam: wp.array3d(dtype=float),
    residual: wp.array3d(dtype=float),
    impulse: wp.array3d(dtype=float),
    depth_out: wp.array3d(dtype=float),
):
    """Projected Gauss-Seidel with the activation inside the update (docs/method.md §2.2 variant b): the normal row of
    sphere c is weighted by s_norm (its foot's regulariser), its tangent block by s_act.

    lam [N, iterations + 1, 3nc] holds the impulses after each sweep (slot 0 is the zero start and is never
    written). The normal impulses and depths of this substep go to impulse/depth_out[:, substep, :].
    """
    e = wp.tid()
    nc = s_act.shape[1]
    nr = 3 * nc
    for it in range(iterations):
        for c in range(nc):
            i = 3 * c
            i1 = i + 1
            i2 = i + 2
            s = s_act[e, c]
            # the three rows' sums over the other contacts' impulses in one pass (each impulse loaded once, three
            # independent accumulators): this sweep's below the block, the last sweep's above it
            acc = w[e, i]
            acc1 = w[e, i1]
            acc2 = w[e, i2]
            for j in range(i):
                l_j = lam[e, it + 1, j]
                acc = acc + A[e, i, j] * l_j
                acc1 = acc1 + A[e, i1, j] * l_j
                acc2 = acc2 + A[e, i2, j] * l_j
            for j in range(i + 3, nr):
                l_j = lam[e, it, j]
                acc = acc + A[e, i, j] * l_j
                acc1 = acc1 + A[e, i1, j] * l_j
                acc2 = acc2 + A[e, i2, j] * l_j
            # the block's own terms: the normal row sees its tangents' last impulses, the tangent rows the new normal
            residual[e, it, i] = acc + A[e, i, i] * lam[e, it, i] + A[e, i, i1] * lam[e, it, i1] + A[
                e, i, i2] * lam[e, it, i2]
            lam[e, it + 1, i] = wp.max(s_norm[e, c] * (lam[e, it, i] - residual[e, it, i] / A[e, i, i]), 0.0)
            l_n = lam[e, it + 1, i]
            residual[e, it, i1] = acc1 + A[e, i1, i] * l_n + A[e, i1, i1] * lam[e, it, i1] + A[e, i1, i2] * lam[
                e, it, i2]
            residual[e, it, i2] = acc2 + A[e, i2, i] * l_n + A[e, i2, i1] * lam[e, it, i1] + A[e, i2, i2] * lam[
                e, it, i2]
            r1 = residual[e, it, i1]
            r2 = residual[e, it, i2]
            a11 = A[e, i1, i1]
            a12 = A[e, i1, i2]
            a22 = A[e, i2, i2]
            det = a11 * a22 - a12 * a12
            t1 = s * (lam[e, it, i1] - (a22 * r1 - a12 * r2) / det)
            t2 = s * (lam[e, it, i2] - (a11 * r2 - a12 * r1) / det)
            limit = mu[e % mu.shape[0]] * lam[e, it + 1, i]
            norm2 = t1 * t1 + t2 * t2
            scale = float(1.0)
            if norm2 > limit * limit:
                scale = limit / wp.sqrt(norm2)
            lam[e, it + 1, i1] = t1 * scale
            lam[e, it + 1, i2] = t2 * scale
    for c in range(nc):
        impulse[e, substep, c] = lam[e, iterations, 3 * c]
        depth_out[e, substep, c] = depth[e, c]


@wp.kernel
def apply_contact(
    # from factor_free, contact_setup and pgs
    v_free: wp.array2d(dtype=float),
    Y: wp.array3d(dtype=float),
    G: wp.array2d(dtype=wp.spatial_vector),
    L: wp.array3d(dtype=float),
    lam: wp.array3d(dtype=float),
    # model
    sphere_foot: wp.array(dtype=int),
    dof_ancestors: wp.array2d(dtype=int),
    dof_ancestor_count: wp.array(dtype=int),
    iterations: int,
    # outputs (each written once per substep)
    foot_impulse: wp.array2d(dtype=wp.spatial_vector),
    z: wp.array2d(dtype=float),
    dv_tmp: wp.array2d(dtype=float),
    dv: wp.array2d(dtype=float),
    v_contact: wp.array2d(dtype=float),
):
    """v+ = v* + H^-1 J^T lambda = v* + L^-1 (Y^T F) with F the spatial impulse on each contact body (L
    depth-indexed, see ``mass_tau``)."""
    e = wp.tid()
    nf = foot_impulse.shape[1]
    nc = sphere_foot.shape[0]
    nv = v_free.shape[1]
    for f in range(nf):
        F = wp.spatial_vector()
        for r in range(3 * nc):
            if sphere_foot[r // 3] == f:
                F = F + G[e, r] * lam[e, iterations, r]
        foot_impulse[e, f] = F
    for i in range(nv):
        acc = float(0.0)
        for f in range(nf):
            for m6 in range(6):
                acc = acc + Y[e, 6 * f + m6, i] * foot_impulse[e, f][m6]
        z[e, i] = acc
    for i in range(nv):
        t = z[e, i]
        di = dof_ancestor_count[i]
        for c in range(di):
            t = t - L[e, i, di - 1 - c] * dv[e, dof_ancestors[i, c]]
        dv_tmp[e, i] = t
        dv[e, i] = dv_tmp[e, i] / L[e, i, di]
    for a in range(nv):
        v_contact[e, a] = v_free[e, a] + dv[e, a]


@wp.func
def tri_index(j: int, m: int):
    """Slot of the symmetric pair (j, m) in a packed lower triangle."""
    hi = wp.max(j, m)
    return hi * (hi + 1) // 2 + wp.min(j, m)


@wp.func
def smoothstep(y: float):
    """0 for y <= 0, 1 for y >= 1, y^2 (3 - 2 y) between (C1)."""
    t = wp.clamp(y, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


@wp.func
def guard_allowance(r: float, width: float, dt: float):
    """Speed [rad/s] at which a joint at violation r may still approach its limit: w softplus(-r / w) / dt, i.e.
    -r / dt well inside the range, decaying to 0 past the limit (max(-r, 0) / dt with the corner rounded over w)."""
    x = -r / width
    # softplus with one branch per side: both derivatives are sigmoid(x), so a joint exactly at its limit (x = 0,
    # common: the guard stops joints there) gets 1/2 (max(x, 0) + log(1 + exp(-|x|)) split the tie between two
    # adjoints and gave -1/2)
    sp = float(0.0)
    if x > 20.0:
        sp = x  # log(1 + exp(-x)) < 2.1e-9 x: below float32 resolution, and the common case (far inside)
    elif x > 0.0:
        sp = x + wp.log(1.0 + wp.exp(-x))
    elif x > -20.0:
        sp = wp.log(1.0 + wp.exp(x))
    return width * sp / dt


@wp.kernel
def limit_guard_integrate(
    # state in
    q: wp.array2d(dtype=float),
    # from factor_free and apply_contact
    L: wp.array3d(dtype=float),
    v_contact: wp.array2d(dtype=float),
    # model
    limit_dof: wp.array(dtype=int),
    num_limited: int,
    dof_range: wp.array(dtype=wp.vec2),
    dof_ancestors: wp.array2d(dtype=int),
    dof_ancestor_count: wp.array(dtype=int),
    # parameters
    guard_window: float,
    guard_width: float,
    iterations: int,
    dt: float,
    # outputs (each written once per substep; rows of joints the guard leaves alone are not written)
    lim_sign: wp.array2d(dtype=float),
    excess: wp.array2d(dtype=float),
    gate: wp.array2d(dtype=float),
    Yl: wp.array3d(dtype=float),
    Dl: wp.array2d(dtype=float),
    lam_l: wp.array3d(dtype=float),
    residual_l: wp.array3d(dtype=float),
    z_l: wp.array2d(dtype=float),
    dv_l: wp.array2d(dtype=float),
    guard_on: wp.array(dtype=float),
    q_out: wp.array2d(dtype=float),
    qd_out: wp.array2d(dtype=float),
):
    """The joint-limit guard (reference.limit_guard), then semi-implicit Euler.

    Row j stops limited joint a = limit_dof[j] at the position it may reach this substep: its excess speed
    e = s v_a - guard_allowance(r) over the limit nearer to q_a + h v_a (sign s, violation r) is removed by a one-sided impulse along
    -s e_a (a projected Gauss-Seidel row, lambda >= 0), weighted by gate = smoothstep((e + window) / (window / 2)),
    which is 1 for rows near binding and 0 for rows far from it. Only rows with gate > 0 take part:
    Yl [N, nl, chain] holds y = L^-T e_a on the joint's chain (``chain_dof`` order) times L's diagonal, y_k L_kk
    (the value before the division, stored once and divided where read, so that no second copy is kept), Dl
    [N, nl (nl + 1) / 2] the packed H^-1 entries of the pairs, lam_l [N, iterations + 1, nl] the impulses after each
    sweep (slot 0 the zero start), dv_l [N, nv] the velocity change times L's diagonal likewise. guard_on [N]
    (arrives zeroed) marks the environments with a joint that could be in the window; the others skip the guard
    (its outputs but q_out and qd_out are then not written).
    """
    e = wp.tid()
    nv = v_contact.shape[1]
    # cheap detection first (no differentiable outputs, so its adjoint costs nothing): a row can be in the window,
    # excess > -window, only if the joint would end the substep within window * h of a limit (the allowance is at
    # least -r / h), so environments with no such joint skip the guard in both passes
    for j in range(num_limited):
        a = limit_dof[j]
        p_end = q[e, a + 1] + dt * v_contact[e, a]
        lo_hi = dof_range[a]
        if guard_window > 0.0 and wp.min(lo_hi[1] - p_end, p_end - lo_hi[0]) < dt * guard_window:
            guard_on[e] = 1.0  # an array, not a loop-carried flag: the adjoint reads it back (docs/simulator.md)
    if guard_on[e] > 0.0:
        for j in range(num_limited):
            a = limit_dof[j]
            qa = q[e, a + 1]
            lo_hi = dof_range[a]
            # the limit nearer to where the joint would end the substep; the side changes only at mid-range, where
            # neither row is stopped (both excesses are negative there), so the guard stays continuous
            s = float(-1.0)
            r = lo_hi[0] - qa
            if qa + dt * v_contact[e, a] >= 0.5 * (lo_hi[0] + lo_hi[1]):
                s = 1.0
                r = qa - lo_hi[1]
            lim_sign[e, j] = s
            ex = s * v_contact[e, a] - guard_allowance(r, guard_width, dt)
            excess[e, j] = ex
            g = float(0.0)
            if guard_window > 0.0:
                g = smoothstep((ex + guard_window) / (0.5 * guard_window))
            gate[e, j] = g
        # L^T y = e_a touches the joint's own chain only (the contact rows' Y solve with J = e_a)
        for j in range(num_limited):
            if gate[e, j] > 0.0:
                a = limit_dof[j]
                da = dof_ancestor_count[a]  # chain entry c is at depth da - c
                for c in range(da + 1):
                    t = float(0.0)
                    if c == 0:
                        t = 1.0
                    for c2 in range(c):
                        m = chain_dof(a, c2, dof_ancestors)
                        t = t - L[e, m, da - c] * Yl[e, j, c2] / L[e, m, da - c2]
                    Yl[e, j, c] = t
        # (H^-1)_ab = y_a . y_b over the dofs the two chains share
        for j in range(num_limited):
            if gate[e, j] > 0.0:
                a = limit_dof[j]
                for m in range(j + 1):
                    if gate[e, m] > 0.0:
                        b = limit_dof[m]
                        acc = float(0.0)
                        da = dof_ancestor_count[a]
                        for c in range(da + 1):
                            k = chain_dof(a, c, dof_ancestors)
                            cb = chain_position(b, k, dof_ancestor_count, dof_ancestors)
                            if cb >= 0:
                                l_kk = L[e, k, da - c]
                                acc = acc + Yl[e, j, c] * Yl[e, m, cb] / (l_kk * l_kk)
                        Dl[e, tri_index(j, m)] = acc
        for j in range(num_limited):
            if gate[e, j] > 0.0:
                lam_l[e, 0, j] = 0.0
        for it in range(iterations):
            for j in range(num_limited):
                if gate[e, j] > 0.0:
                    acc = excess[e, j]
                    for m in range(num_limited):
                        if gate[e, m] > 0.0:
                            if m < j:
                                acc = acc - lim_sign[e, j] * lim_sign[e, m] * Dl[e, tri_index(j, m)] * lam_l[e, it + 1, m]
                            else:
                                acc = acc - lim_sign[e, j] * lim_sign[e, m] * Dl[e, tri_index(j, m)] * lam_l[e, it, m]
                    residual_l[e, it, j] = acc
                    lam_l[e, it + 1, j] = wp.max(
                        gate[e, j] * (lam_l[e, it, j] + residual_l[e, it, j] / Dl[e, tri_index(j, j)]), 0.0)
        # dv = H^-1 sum_j e_a (-s lam) = L^-1 z with z = -sum_j s lam y_a, accumulated over each row's chain (z_l
        # arrives zeroed)
        for j in range(num_limited):
            if gate[e, j] > 0.0:
                a = limit_dof[j]
                da = dof_ancestor_count[a]
                for c in range(da + 1):
                    k = chain_dof(a, c, dof_ancestors)
                    z_l[e, k] += -lim_sign[e, j] * lam_l[e, iterations, j] * Yl[e, j, c] / L[e, k, da - c]
        for i in range(nv):
            t = z_l[e, i]
            di = dof_ancestor_count[i]
            for c in range(di):
                b = dof_ancestors[i, c]  # at depth di - 1 - c
                t = t - L[e, i, di - 1 - c] * dv_l[e, b] / L[e, b, di - 1 - c]
            dv_l[e, i] = t
        for a in range(nv):
            qd_out[e, a] = v_contact[e, a] + dv_l[e, a] / L[e, a, dof_ancestor_count[a]]
    else:
        for a in range(nv):
            qd_out[e, a] = v_contact[e, a]
    for k in range(3):
        q_out[e, k] = q[e, k] + dt * qd_out[e, k]
    # root quaternion (w, x, y, z): q <- normalize(q + dt/2 q (0, omega_body))
    qw = q[e, 3]
    qx = q[e, 4]
    qy = q[e, 5]
    qz = q[e, 6]
    wx = qd_out[e, 3]
    wy = qd_out[e, 4]
    wz = qd_out[e, 5]
    hw = 0.5 * dt
    nw = qw + hw * (-qx * wx - qy * wy - qz * wz)
    nx = qx + hw * (qw * wx + qy * wz - qz * wy)
    ny = qy + hw * (qw * wy - qx * wz + qz * wx)
    nz = qz + hw * (qw * wz + qx * wy - qy * wx)
    inv = 1.0 / wp.sqrt(nw * nw + nx * nx + ny * ny + nz * nz)
    q_out[e, 3] = nw * inv
    q_out[e, 4] = nx * inv
    q_out[e, 5] = ny * inv
    q_out[e, 6] = nz * inv
    for a in range(ROOT_NV, nv):
        q_out[e, a + 1] = q[e, a + 1] + dt * qd_out[e, a]
