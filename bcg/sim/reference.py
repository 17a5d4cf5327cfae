"""The engine's algorithm in plain PyTorch: the test oracle (float64 capable) and a readable specification.

Everything here is batched over environments (leading dimension ``N``) and differentiable with torch autograd.
It implements exactly what the Warp kernels in :mod:`bcg.sim.kernels` implement, in the same order:

1. forward kinematics, RNEA bias forces and CRBA mass matrix in spatial coordinates about the root position o
   (spatial vectors are (angular, linear); body inertias are kept about o, so float32 dynamics do not depend on
   where the robot is; the ground plane is z = -q_z in these coordinates);
2. free velocity v* = v + h H^-1 tau. Every force is linearly implicit in v*: f(v*) ~ f(v) + f'(v) (v* - v).
   The actuator torque is the PD law u = kp (q* - q - h v*) - kd v* through ``actuator_torque``, a smooth saturation
   with a torque-speed envelope; its implicit term is tau_u (h kd + h^2 kp) - h tau_v (the two slopes of the law).
   A limited joint near or past a limit (violation r, positive past it) is pulled towards
   v_ref = -beta max(r, 0) / h (back out a violation at the Baumgarte rate; zero inside the range, so it never pulls
   a joint towards its limit) by an implicit damper of ratio g = a / (1 - a) to the joint's diagonal, a = impedance *
   sigmoid(limit_kappa (r + h v)) on the predicted violation: a lone joint then moves at (1 - a) v_free + a v_ref,
   MuJoCo's soft-constraint mix;
3. contact: every sphere against z = 0 with penetration d = radius - z_centre, activation s = sigmoid(kappa d),
   rows (e_z, e_x, e_y) at the sphere's lowest point, Delassus A = J H^-1 J^T, bias w = J v* - beta max(d, 0) / h;
4. projected Gauss-Seidel, ``iterations`` sweeps from zero, each contact's block update weighted by its activation
   (docs/method.md §2.2 variant b): the tangent block by s, i.e. the regulariser A_tt (1 - s) / s; the normal row
   by the regulariser a_foot (1 - s) / s, a_foot the mean normal Delassus entry of the sphere's foot (one compliance
   per foot, as MuJoCo's per-body diagApprox; a per-sphere A_nn made the heel 3x stiffer than the toe and leaned
   the standing robot forward), i.e. the weight A_nn s / (A_nn s + a_foot (1 - s)); friction projected onto the
   disc of radius mu lambda_n;
5. v+ = v* + H^-1 J^T lambda;
6. the joint-limit guard (``limit_guard``): a limited joint that v+ would carry past its limit by the end of the
   substep (or deeper past it) is stopped there by one-sided impulses through H^-1, the contact impulses held;
7. semi-implicit Euler, root quaternion q <- normalize(q + h/2 q (0, omega_body)).

State layout is MuJoCo's (see :mod:`bcg.sim.model`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bcg.sim.model import DROPOUT_CELL, SimModel
from bcg.sim.types import ContactReport, Physics

PUSH_OUT_DEPTH = 0.05
"""Contact penetrations beyond this [m] are pushed out no faster than at it (the Baumgarte rate is capped)."""
PUSH_OUT_ANGLE = 0.25
"""Joint-limit violations beyond this [rad] are backed out no faster than at it."""

__all__ = [
    "PUSH_OUT_ANGLE",
    "PUSH_OUT_DEPTH",
    "DROPOUT_CELL",
    "dropout_draw",
    "ContactReport",
    "Kinematics",
    "forward_kinematics",
    "mass_matrix",
    "bias_forces",
    "substep",
    "step",
    "quat_mul_wxyz",
    "quat_to_matrix_wxyz",
    "actuator_torque",
]


class Kinematics(NamedTuple):
    """World-frame placement of every body. Shapes: rot [N, nb, 3, 3], pos [N, nb, 3] (body origins, m)."""

    rot: torch.Tensor
    pos: torch.Tensor


def quat_to_matrix_wxyz(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] of (not necessarily unit) quaternions [..., 4] in w, x, y, z order."""
    q = q / torch.linalg.norm(q, dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, -1).reshape(q.shape[:-1] + (3, 3))


def quat_mul_wxyz(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a (x) b of quaternions [..., 4] in w, x, y, z order."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], -1)


def _axis_angle_matrix(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [N, 3, 3] about a fixed unit axis [3] by angles [N] (Rodrigues)."""
    K = torch.zeros(3, 3, dtype=axis.dtype, device=axis.device)
    K[0, 1], K[0, 2], K[1, 0], K[1, 2], K[2, 0], K[2, 1] = -axis[2], axis[1], axis[2], -axis[0], -axis[1], axis[0]
    eye = torch.eye(3, dtype=axis.dtype, device=axis.device)
    s, c = torch.sin(angle)[:, None, None], torch.cos(angle)[:, None, None]
    return eye + s * K + (1 - c) * (K @ K)


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.cross(a, b, dim=-1)


def _crossm(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Spatial motion cross product v x m, both [N, 6] (angular, linear)."""
    w, vo, mw, mv = v[:, :3], v[:, 3:], m[:, :3], m[:, 3:]
    return torch.cat([_cross(w, mw), _cross(w, mv) + _cross(vo, mw)], -1)


def _crossf(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Spatial force cross product v x* f, both [N, 6]."""
    w, vo, n, ff = v[:, :3], v[:, 3:], f[:, :3], f[:, 3:]
    return torch.cat([_cross(w, n) + _cross(vo, ff), _cross(w, ff)], -1)


def _inertia_apply(IO: torch.Tensor, h: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Spatial inertia (I about the origin [N,3,3], first moment h = m c [N,3], mass m [N]) times motion v [N,6]."""
    w, vo = v[:, :3], v[:, 3:]
    ang = (IO @ w[:, :, None])[:, :, 0] + _cross(h, vo)
    lin = m[:, None] * vo + _cross(w, h)
    return torch.cat([ang, lin], -1)


class _Tree(NamedTuple):
    rot: list[torch.Tensor]  # nb x [N,3,3]
    pos: list[torch.Tensor]  # nb x [N,3]
    S: list[torch.Tensor]  # nv x [N,6]
    vel: list[torch.Tensor]  # nb x [N,6]
    IO: list[torch.Tensor]
    h: list[torch.Tensor]
    f: list[torch.Tensor]


def _constants(model: SimModel, like: torch.Tensor) -> dict[str, torch.Tensor]:
    kw = dict(dtype=like.dtype, device=like.device)
    return {
        "body_pos": torch.as_tensor(model.body_pos, **kw),
        "body_rot": quat_to_matrix_wxyz(torch.as_tensor(model.body_quat_wxyz, **kw)),
        "axis": torch.as_tensor(model.body_axis, **kw),
        "mass": torch.as_tensor(model.body_mass, **kw),
        "com": torch.as_tensor(model.body_com, **kw),
        "inertia": torch.as_tensor(model.body_inertia, **kw),
        "gravity": torch.as_tensor(model.gravity, **kw),
    }


def _body_params(model: SimModel, q: torch.Tensor, physics: Physics | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-environment mass [N, nb], COM [N, nb, 3] and inertia [N, nb, 3, 3], from ``physics`` or the model."""
    if physics is not None:
        return tuple(t.to(q) for t in (physics.body_mass, physics.body_com, physics.body_inertia))
    c = _constants(model, q)
    n = q.shape[0]
    return (c["mass"].expand(n, -1), c["com"].expand(n, -1, -1), c["inertia"].expand(n, -1, -1, -1))


def _tree_pass(model: SimModel, q: torch.Tensor, qd: torch.Tensor | None, physics: Physics | None = None) -> _Tree:
    """Forward kinematics, twists and RNEA body forces (with zero joint accelerations) for all bodies."""
    c = _constants(model, q)
    mass_all, com_all, inertia_all = _body_params(model, q, physics)
    n = q.shape[0]
    eye = torch.eye(3, dtype=q.dtype, device=q.device)
    rot, pos, S, vel, acc, IO_l, h_l, f_l = [], [], [], [], [], [], [], []
    R0 = quat_to_matrix_wxyz(q[:, 3:7])
    p0 = torch.zeros_like(q[:, 0:3])  # the root is the origin o of the spatial coordinates
    zero3 = torch.zeros(n, 3, dtype=q.dtype, device=q.device)
    for k in range(3):
        e = torch.zeros(n, 3, dtype=q.dtype, device=q.device)
        e[:, k] = 1.0
        S.append(torch.cat([zero3, e], -1))
    for k in range(3):
        a_w = R0[:, :, k]
        S.append(torch.cat([a_w, _cross(p0, a_w)], -1))
    for b in range(model.nb):
        if b == 0:
            R, p = R0, p0
        else:
            par = int(model.body_parent[b])
            Rj = c["body_rot"][b] @ _axis_angle_matrix(c["axis"][b], q[:, 6 + b])
            R = rot[par] @ Rj
            p = pos[par] + (rot[par] @ c["body_pos"][b])
            a_w = (R @ c["axis"][b])
            S.append(torch.cat([a_w, _cross(p, a_w)], -1))
        rot.append(R)
        pos.append(p)
        m = mass_all[:, b]
        cw = p + (R @ com_all[:, b, :, None])[:, :, 0]
        IO = R @ inertia_all[:, b] @ R.transpose(1, 2) + m[:, None, None] * (
            (cw * cw).sum(-1)[:, None, None] * eye - cw[:, :, None] * cw[:, None, :])
        h = m[:, None] * cw
        IO_l.append(IO)
        h_l.append(h)
        if qd is None:
            continue
        if b == 0:
            v_lin = qd[:, 0:3]
            omega = (R0 @ qd[:, 3:6, None])[:, :, 0]
            v = torch.cat([omega, v_lin + _cross(p0, omega)], -1)
            a = torch.cat([zero3, -c["gravity"].expand(n, 3) + _cross(v_lin, omega)], -1)
        else:
            par = int(model.body_parent[b])
            vj = S[5 + b] * qd[:, 5 + b, None]
            v = vel[par] + vj
            a = acc[par] + _crossm(v, vj)
        vel.append(v)
        acc.append(a)
        f_l.append(_inertia_apply(IO, h, m, a) + _crossf(v, _inertia_apply(IO, h, m, v)))
    return _Tree(rot, pos, S, vel, IO_l, h_l, f_l)


def forward_kinematics(model: SimModel, q: torch.Tensor) -> Kinematics:
    """World rotation [N, nb, 3, 3] and origin position [N, nb, 3] of every body for qpos ``q`` [N, nq]."""
    t = _tree_pass(model, q, None)
    return Kinematics(torch.stack(t.rot, 1), torch.stack(t.pos, 1) + q[:, None, 0:3])


def _subtree_sums(model: SimModel, items: list[torch.Tensor]) -> list[torch.Tensor]:
    return [sum(items[j] for j in range(b, int(model.body_subtree_end[b]))) for b in range(model.nb)]


def _mass_and_bias(model: SimModel, q: torch.Tensor, qd: torch.Tensor | None, physics: Physics | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, _Tree]:
    t = _tree_pass(model, q, qd, physics)
    n, nv = q.shape[0], model.nv
    ICO = _subtree_sums(model, t.IO)
    ICh = _subtree_sums(model, t.h)
    mass = _body_params(model, q, physics)[0]
    ICm = [mass[:, b: int(model.body_subtree_end[b])].sum(1) for b in range(model.nb)]
    rows = [[None] * nv for _ in range(nv)]
    zero = torch.zeros(n, dtype=q.dtype, device=q.device)
    for a in range(nv):
        b = int(model.dof_body[a])
        F = _inertia_apply(ICO[b], ICh[b], ICm[b], t.S[a])
        rows[a][a] = (t.S[a] * F).sum(-1)
        for k in range(int(model.dof_ancestor_count[a])):
            anc = int(model.dof_ancestors[a, k])
            val = (t.S[anc] * F).sum(-1)
            rows[a][anc] = val
            rows[anc][a] = val
    H = torch.stack([torch.stack([x if x is not None else zero for x in r], -1) for r in rows], 1)
    bias = zero.new_zeros(n, nv)
    if qd is not None:
        Fs = _subtree_sums(model, t.f)
        bias = torch.stack([(t.S[a] * Fs[int(model.dof_body[a])]).sum(-1) for a in range(nv)], -1)
    return H, bias, t


def mass_matrix(model: SimModel, q: torch.Tensor) -> torch.Tensor:
    """Joint-space mass matrix [N, nv, nv] with armature on the diagonal (MuJoCo's ``mj_fullM``)."""
    H, _, _ = _mass_and_bias(model, q, None)
    return H + torch.diag(torch.as_tensor(model.dof_armature, dtype=q.dtype, device=q.device))


def bias_forces(model: SimModel, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """Coriolis, centrifugal and gravity forces [N, nv] (MuJoCo's ``qfrc_bias``)."""
    _, bias, _ = _mass_and_bias(model, q, qd)
    return bias


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1.0 + torch.tanh(0.5 * x))


_U32 = 0xFFFFFFFF


def _pcg(state: torch.Tensor) -> torch.Tensor:
    """Warp's rand_pcg on uint32 values held in int64."""
    b = (state * 747796405 + 2891336453) & _U32
    c = (((b >> ((b >> 28) + 4)) ^ b) * 277803737) & _U32
    return (c >> 22) ^ c


def _rand_init(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    return _pcg((seed & _U32) + _pcg(offset & _U32)) & _U32


def dropout_draw(pc: torch.Tensor, z_root: torch.Tensor, c: int, substep: int) -> torch.Tensor:
    """[N] U[0, 1) draws of sphere c's contact dropout (``kernels.dropout_draw``'s hash; pc [N, 3] the sphere's
    centre relative to the root [m], z_root [N]). The cells are found from this oracle's positions, so a draw can
    differ from the float32 kernel's where a position lies within rounding of a cell boundary."""
    ix = torch.floor(pc[:, 0] * DROPOUT_CELL).long()
    iy = torch.floor(pc[:, 1] * DROPOUT_CELL).long()
    iz = torch.floor((pc[:, 2] + z_root) * DROPOUT_CELL).long()
    st = _pcg(_rand_init(ix, iy))  # randi advances the state and returns it
    st = _pcg(_rand_init(st, iz))
    st = _pcg(_rand_init(st, torch.full_like(st, c + 64 * substep)))
    return (st >> 8).double() / 16777216.0


def actuator_torque(u: torch.Tensor, qd: torch.Tensor, limit: torch.Tensor, speed: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The actuators' torque law and its slopes, each shaped like ``u`` [N, nu] (``limit`` [nu] N m, ``speed`` [nu]
    rad/s, the no-load speed v0; inf: no envelope).

    tau = L (sat(u / L + e) - e) with sat(y) = y / (1 + y^4)^(1/4) and e = (qd / v0)^7. At rest (e = 0) this is the
    smooth saturation of the PD torque: 1.5 % below u at half the limit, 16 % below at the limit, tending to L beyond,
    with a smooth slope, unlike a clamp's (see docs/simulator.md). The shift e takes the driving torque in the
    direction of motion away as qd nears v0, like a motor's back-EMF. Returns (tau, d tau / d u, the partial
    d tau / d qd through e, <= 0).
    """
    lim = torch.clamp(limit, max=1e30)
    v0 = torch.where(torch.isfinite(limit) & torch.isfinite(speed), speed, torch.full_like(speed, 1e30))
    w = qd / v0
    w6 = w.pow(6)
    shift = lim * w6 * w
    base = 1.0 + ((u + shift) / lim).pow(4)
    slope = base.pow(-1.25)
    return (u + shift) * base.pow(-0.25) - shift, slope, lim * (slope - 1.0) * 7.0 * w6 / v0


def _limit_absorption(violation: torch.Tensor, kappa: float, impedance: float) -> torch.Tensor:
    """g = a / (1 - a) with a = impedance * sigmoid(kappa * violation) (violation in rad, positive past the limit)."""
    a = impedance * _sigmoid(kappa * violation)
    return a / (1.0 - a)


def _foot_jacobians(model: SimModel, t: _Tree, n: int, like: torch.Tensor) -> list[torch.Tensor]:
    """Per contact body, the [N, 6, nv] Jacobian mapping qvel to its world-origin twist."""
    out = []
    for fb in model.foot_body:
        a0 = int(model.body_last_dof[fb])
        cols = [like.new_zeros(n, 6) for _ in range(model.nv)]
        cols[a0] = t.S[a0]
        for k in range(int(model.dof_ancestor_count[a0])):
            anc = int(model.dof_ancestors[a0, k])
            cols[anc] = t.S[anc]
        out.append(torch.stack(cols, -1))
    return out


def substep(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
            physics: Physics | None = None, index: int = 0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One physics substep of length ``model.params.dt``.

    Args:
        q: qpos [N, nq]; qd: qvel [N, nv]; targets: PD position targets [N, nu] (rad); physics: optional
        per-environment parameters (:class:`bcg.sim.Physics`); index: the substep's index in its control step (seeds
        the contact dropout's draws).
    Returns:
        (q_next [N, nq], qd_next [N, nv], normal impulse per sphere [N, nc] in N s, penetration [N, nc] in m).
    """
    p = model.params
    dt = p.dt
    n, nv, nc = q.shape[0], model.nv, model.nc
    kw = dict(dtype=q.dtype, device=q.device)
    H, bias, t = _mass_and_bias(model, q, qd, physics)
    if physics is None:
        arm = torch.as_tensor(model.dof_armature, **kw).expand(n, nv)
        damp = torch.as_tensor(model.dof_damping, **kw).expand(n, nv)
        kp, kd = torch.as_tensor(model.kp, **kw), torch.as_tensor(model.kd, **kw)
        mu = torch.full((n,), float(p.mu), **kw)
    else:
        arm, damp = physics.dof_armature.to(q), physics.dof_damping.to(q)
        kp, kd, mu = physics.kp.to(q), physics.kd.to(q), physics.mu.to(q)
    diag = arm + dt * damp
    tau = -bias - damp * qd
    if model.nu:
        dofs = torch.as_tensor(model.actuator_dof, device=q.device)
        lim = (torch.as_tensor(model.torque_limit, **kw) if physics is None
               else physics.torque_limit.to(q).where(physics.torque_limit < 1e29, torch.inf))
        speed = torch.as_tensor(model.actuator_speed, **kw)
        qj = q[:, dofs + 1]
        vj = qd[:, dofs]
        look = 1.0 if p.pd_lookahead else 0.0  # ContactParams.pd_lookahead: the end-of-step position's h kp damping
        u, slope, slope_v = actuator_torque(kp * (targets - qj - look * dt * vj) - kd * vj, vj, lim, speed)
        tau = tau.index_add(1, dofs, u)
        diag = diag.index_add(1, dofs, slope * (dt * kd + look * dt * dt * kp) - dt * slope_v)
    H_diag = torch.diagonal(H, dim1=1, dim2=2) + diag
    limited = torch.as_tensor(model.dof_limited, device=q.device)
    if bool(limited.any()):
        dofs = limited.nonzero().flatten()
        rng = torch.as_tensor(model.dof_range[limited.cpu().numpy()], **kw)
        qj, vj, h_jj = q[:, dofs + 1], qd[:, dofs], H_diag[:, dofs]
        r_hi, r_lo = qj - rng[:, 1], rng[:, 0] - qj
        g_hi = _limit_absorption(r_hi + dt * vj, p.limit_kappa, p.limit_impedance)
        g_lo = _limit_absorption(r_lo - dt * vj, p.limit_kappa, p.limit_impedance)
        v_hi = -p.limit_beta * torch.clamp(r_hi, min=0.0, max=PUSH_OUT_ANGLE) / dt
        v_lo = p.limit_beta * torch.clamp(r_lo, min=0.0, max=PUSH_OUT_ANGLE) / dt
        c = h_jj / dt
        tau = tau.index_add(1, dofs, -g_hi * c * (vj - v_hi) - g_lo * c * (vj - v_lo))
        diag = diag.index_add(1, dofs, (g_hi + g_lo) * h_jj)
    H = H + torch.diag_embed(diag)
    L = torch.linalg.cholesky(H)
    x = torch.cholesky_solve(tau[:, :, None], L)[:, :, 0]
    vs = qd + dt * x

    # contact rows
    Jb = _foot_jacobians(model, t, n, q)
    spos = torch.as_tensor(model.sphere_pos, **kw)
    srad = torch.as_tensor(model.sphere_radius, **kw)
    ez = torch.tensor([0.0, 0.0, 1.0], **kw)
    rows_J, rows_w, s_act, pen = [], [], [], []
    if physics is None:
        g_free, g_start, g_depth = p.normal_bias_gains()
        p_drop = torch.full((n,), float(p.dropout), **kw)
    else:
        g_free, g_start, g_depth = physics.contact_bias.to(q).unbind(-1)
        p_drop = physics.contact_dropout.to(q)
    dropping = bool((p_drop > 0).any())
    dirs = [ez, torch.tensor([1.0, 0.0, 0.0], **kw), torch.tensor([0.0, 1.0, 0.0], **kw)]
    for c in range(nc):
        b = int(model.sphere_body[c])
        pc = t.pos[b] + (t.rot[b] @ spos[c])
        d = srad[c] - (pc[:, 2] + q[:, 2])
        pen.append(d)
        s_c = _sigmoid(p.kappa * d)
        if dropping:
            drop = (d < p.dropout_depth) & (dropout_draw(pc.detach(), q[:, 2].detach(), c, index) < p_drop)
            s_c = torch.where(drop, torch.zeros_like(s_c), s_c)
        s_act.append(s_c)
        point = pc - srad[c] * ez
        J_f = Jb[int(model.sphere_foot[c])]
        for k, nvec in enumerate(dirs):
            G = torch.cat([_cross(point, nvec.expand(n, 3)), nvec.expand(n, 3)], -1)
            Jr = (G[:, :, None] * J_f).sum(1)
            rows_J.append(Jr)
            w = (Jr * vs).sum(-1)
            if k == 0:  # the normal row's bias: Baumgarte or soft (ContactParams.normal_bias_gains)
                w = g_free * w - g_depth * torch.clamp(d, min=0.0, max=PUSH_OUT_DEPTH) / dt
                if physics is not None or g_start != 0.0:
                    w = w + g_start * (Jr * qd).sum(-1)
            rows_w.append(w)
    if nc:
        J = torch.stack(rows_J, 1)  # [N, nr, nv]
        wv = torch.stack(rows_w, 1)
        HinvJt = torch.cholesky_solve(J.transpose(1, 2), L)  # [N, nv, nr]
        A = J @ HinvJt
        # normal rows: the regulariser of the foot's mean normal entry, a_foot (1 - s) / s (kernels.normal_weight)
        a_nn = torch.diagonal(A, dim1=1, dim2=2)[:, 0::3]  # [N, nc]
        foot = torch.as_tensor(model.sphere_foot, device=q.device)
        a_foot = torch.stack([a_nn[:, foot == f].mean(1) for f in range(model.nf)], 1)[:, foot]  # [N, nc]
        s_t = torch.stack(s_act, 1)
        s_norm = a_nn * s_t / (a_nn * s_t + a_foot * (1.0 - s_t))
        lam = [wv.new_zeros(n) for _ in range(3 * nc)]
        for _ in range(p.iterations):
            for c in range(nc):
                i = 3 * c
                s = s_act[c]
                r = wv[:, i] + (A[:, i, :] * torch.stack(lam, 1)).sum(-1)
                lam[i] = torch.clamp(s_norm[:, c] * (lam[i] - r / A[:, i, i]), min=0.0)
                lam_now = torch.stack(lam, 1)
                r1 = wv[:, i + 1] + (A[:, i + 1, :] * lam_now).sum(-1)
                r2 = wv[:, i + 2] + (A[:, i + 2, :] * lam_now).sum(-1)
                a11, a12, a22 = A[:, i + 1, i + 1], A[:, i + 1, i + 2], A[:, i + 2, i + 2]
                det = a11 * a22 - a12 * a12
                t1 = s * (lam[i + 1] - (a22 * r1 - a12 * r2) / det)
                t2 = s * (lam[i + 2] - (a11 * r2 - a12 * r1) / det)
                limit = mu * lam[i]
                nrm2 = t1 * t1 + t2 * t2
                outside = nrm2 > limit * limit
                scale = torch.where(outside, limit / torch.sqrt(torch.where(outside, nrm2, torch.ones_like(nrm2))),
                                    torch.ones_like(nrm2))
                lam[i + 1] = t1 * scale
                lam[i + 2] = t2 * scale
        lam_t = torch.stack(lam, 1)
        qd_next = vs + (HinvJt @ lam_t[:, :, None])[:, :, 0]
        impulse = lam_t[:, 0::3]
        penetration = torch.stack(pen, 1)
    else:
        qd_next = vs
        impulse = q.new_zeros(n, 0)
        penetration = q.new_zeros(n, 0)
    qd_next = limit_guard(model, q, qd_next, L)
    q_next = integrate(q, qd_next, dt)
    return q_next, qd_next, impulse, penetration


def limit_side(model: SimModel, q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The limit of every limited joint nearer to where the velocity v [N, nv] would take it by the end of the
    substep, and the joint's violation of it now.

    Returns (sign [N, nl]: +1 for the upper limit, -1 for the lower; violation r [N, nl] in rad, positive past the
    limit), the joints in the order of ``model.dof_limited.nonzero()``. The side changes only where the predicted
    position crosses mid-range, where the guard stops neither side.
    """
    limited = model.dof_limited.astype(bool)
    rng = torch.as_tensor(model.dof_range[limited], dtype=q.dtype, device=q.device)
    dofs = torch.as_tensor(limited.nonzero()[0], device=q.device)
    qj = q[:, dofs + 1]
    upper = qj + model.params.dt * v[:, dofs] >= 0.5 * (rng[:, 0] + rng[:, 1])
    sign = torch.where(upper, 1.0, -1.0).to(q.dtype)
    return sign, torch.where(upper, qj - rng[:, 1], rng[:, 0] - qj)


def limit_guard(model: SimModel, q: torch.Tensor, v: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """The joint-limit guard after the contact solve (step 6): returns the velocity [N, nv] with every limited
    joint stopped at the position it may reach by the end of the substep, the contact impulses held.

    A joint at violation r of the limit nearer to where v takes it (sign s) may move towards it at most at the
    allowance u = w softplus(-r / w) / h, w = limit_guard_width: about -r / h well inside the range (up to the limit
    by the end of the substep), decaying to 0 past it (no deeper; backing out is the damper's job), i.e.
    max(-r, 0) / h with the corner at the limit, where joints pressed into their limits come to rest, rounded over
    w. Its excess speed e = s v_j - u is a one-sided row of the inverse mass matrix restricted to the limited joints,
    D = H^-1, solved by ``limit_guard_iterations`` projected Gauss-Seidel sweeps from zero. Each row's update is
    weighted by g = smoothstep((e + M) / (M / 2)), M = limit_guard_window, inside the update like the contact
    activation: 1 for rows near binding (e > -M / 2), which may bind when the impulses on their neighbours fling
    them; 0 for rows far from binding, which take no part (their H^-1 entries are not needed). The guard is
    continuous in the state. ``L``: lower Cholesky factor of the step's system matrix H [N, nv, nv].
    """
    p = model.params
    if p.limit_guard_window <= 0 or not model.dof_limited.any():
        return v
    sign, r = limit_side(model, q, v.detach())
    dofs = torch.as_tensor(model.dof_limited.astype(bool).nonzero()[0], device=q.device)
    width = p.limit_guard_width
    excess = sign * v[:, dofs] - width * torch.nn.functional.softplus(-r / width) / p.dt
    y = torch.clamp((excess + p.limit_guard_window) / (0.5 * p.limit_guard_window), 0.0, 1.0)
    gate = y * y * (3.0 - 2.0 * y)
    if not bool((gate > 0).any()):
        return v
    n, nv, nl = v.shape[0], v.shape[1], len(dofs)
    E = torch.zeros(nv, nl, dtype=v.dtype, device=v.device)
    E[dofs, torch.arange(nl, device=v.device)] = 1.0
    Hinv_cols = torch.cholesky_solve(E.expand(n, nv, nl), L)  # H^-1 e_a [N, nv, nl]
    D = Hinv_cols[:, dofs, :] * sign[:, :, None] * sign[:, None, :]
    lam = [v.new_zeros(n) for _ in range(nl)]
    for _ in range(p.limit_guard_iterations):
        for j in range(nl):
            res = excess[:, j] - (D[:, j, :] * torch.stack(lam, 1)).sum(-1)
            lam[j] = torch.clamp(gate[:, j] * (lam[j] + res / D[:, j, j]), min=0.0)
    return v - (Hinv_cols @ (sign * torch.stack(lam, 1))[:, :, None])[:, :, 0]

def integrate(q: torch.Tensor, qd: torch.Tensor, dt: float) -> torch.Tensor:
    """Semi-implicit Euler position update with the new velocity ``qd`` [N, nv]; returns qpos [N, nq]."""
    pos = q[:, 0:3] + dt * qd[:, 0:3]
    quat = q[:, 3:7]
    w = qd[:, 3:6]
    # body-frame angular velocity multiplies on the right: dq = q (x) (0, w)
    dq = quat_mul_wxyz(quat, torch.cat([torch.zeros_like(w[:, :1]), w], -1))
    quat = quat + 0.5 * dt * dq
    quat = quat / torch.linalg.norm(quat, dim=-1, keepdim=True)
    joints = q[:, 7:] + dt * qd[:, 6:]
    return torch.cat([pos, quat, joints], -1)


def step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
         physics: Physics | None = None) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
    """One control step: ``model.params.substeps`` substeps with the PD targets [N, nu] held.

    Returns (q [N, nq], qd [N, nv], :class:`ContactReport`).
    """
    impulses, pen = [], None
    for k in range(model.params.substeps):
        q, qd, imp, pen = substep(model, q, qd, targets, physics, k)
        impulses.append(imp)
    stacked = torch.stack(impulses, 0)
    report = ContactReport(stacked.sum(0), stacked.amax(0) / model.params.dt, pen)
    return q, qd, report
