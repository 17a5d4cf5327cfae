"""Simulator model: the arrays of a floating-base hinge tree, built from a compiled ``mujoco.MjModel``.

The model is generic: any MJCF whose root body carries one free joint and whose every other body carries exactly
one hinge joint is accepted (bodies in MuJoCo's depth-first order, so the subtree of body ``i`` is the contiguous
range ``[i, subtree_end[i])``). Contacts are the collision spheres of the MJCF against the ground plane z = 0.

Index conventions (``nb`` moving bodies, body 0 = the floating root):

* ``qpos`` (``nq = 7 + nb - 1``): root position [m], root quaternion **w, x, y, z**, one hinge angle per body.
* ``qvel`` (``nv = 6 + nb - 1``): root linear velocity in the world frame [m/s], root angular velocity in the
  **root body** frame [rad/s], one hinge rate per body. This is MuJoCo's layout, so the engine's mass matrix and
  bias forces are MuJoCo's ``mj_fullM`` and ``qfrc_bias`` entry for entry.
* Hinge of body ``i >= 1``: ``qpos[6 + i]``, dof ``5 + i``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ContactParams", "MAX_ROOT_POSITION", "MAX_SPEED", "ROOT_NQ", "ROOT_NV", "SimModel", "load_model",
    "UnsupportedModelError",
]

ROOT_NQ = 7
"""qpos entries of the floating root: position (3) and quaternion w, x, y, z (4); hinge angles follow."""
ROOT_NV = 6
"""qvel entries of the floating root: linear velocity, world frame (3), angular velocity, body frame (3)."""

MAX_SPEED = 200.0
"""Largest |qvel| entry (m/s or rad/s) :func:`bcg.sim.step` accepts; faster states are outside the range where the
explicit Coriolis terms of a 5 ms substep stay stable, and the step refuses them with a clear error."""

MAX_ROOT_POSITION = 1e4
"""Largest |root position| component [m] :func:`bcg.sim.step` and its siblings accept. float32 spaces numbers 1 mm
apart at 1e4 m, which is the distance a body moving at 0.2 m/s covers in one 5 ms substep: beyond it the position
update of a slow motion rounds away. (The MuJoCo layout keeps the root position in the world frame, so nothing the
kernels do internally can
recover that resolution.)"""


DROPOUT_CELL = 1.0e5
"""Cells per metre of the positions that seed a sphere's contact-dropout draw (10 um: a moving foot changes cell every
substep, a resting one keeps its draw); ``ContactParams.dropout``."""


class UnsupportedModelError(ValueError):
    """The MJCF uses a feature the engine does not implement (joint type, tree shape, ...)."""


@dataclass(frozen=True)
class ContactParams:
    """Contact and integration parameters of the engine (docs/method.md §2.2)."""

    kappa: float = 300.0
    """Stiffness of the contact activation s(d) = sigmoid(kappa * d), d = penetration [m]; unit 1/m."""
    beta: float = 0.5
    """Baumgarte factor of the contacts: a penetrating sphere is asked to separate at beta * d / h. With the
    activation's regulariser this sets the resting stiffness of the feet; 0.5 rests 0.55 mm deep (MuJoCo 0.38 mm)
    and keeps the standing lean within MuJoCo's (0.2 was 2.5x softer and leaned 7 mm back in the first second)."""
    mu: float = 0.8
    """Coulomb friction coefficient of the foot spheres against the ground."""
    soft_timeconst: float = 0.0
    """Time constant [s] of the soft normal contact (MuJoCo's solref[0], 0.02 there); 0: none. With it, a penetrating
    sphere's approach is braked over several substeps as MuJoCo's soft constraint does (at rate 2 / soft_timeconst,
    resisting a share soft_impedance of the free motion) instead of being stopped within one; the depth is still
    pushed out at beta d / h (docs/simulator.md, *Soft normal contact*). Must be >= 2 dt when set (MuJoCo's rule)."""
    soft_impedance: float = 0.95
    """Share of the free normal motion a soft contact resists (MuJoCo's solimp d; 0.95 its default d_max)."""
    dropout: float = 0.0
    """Probability in [0, 1] that a foot sphere less than ``dropout_depth`` deep at the start of a substep has no
    contact in that substep (0: never). MuJoCo at its 5 ms step finds contacts at the start of each step, and in a
    push-off its toes, rocking on a soft ground, are sometimes not in contact in the step where the ankles snap: they
    sink 17 mm within it. Our contact holds them; a dropout leaves spheres without a contact at random substeps
    instead (docs/simulator.md, *Contact dropout*). The draw is a hash of the sphere's position, the sphere and the
    substep: deterministic in the state, independent between spheres and substeps."""
    dropout_depth: float = 0.002
    """Depth [m] below which a sphere can drop out (resting spheres are 0.55 mm deep; a sphere clear of the ground,
    d < 0, always can)."""
    pd_lookahead: bool = True
    """Whether the PD actuators read the joint position predicted at the end of the substep, kp (q* - q - h qd+) -
    kd qd+ (a damping of kd + h kp: 20 % more than kd on the legs), or, False, the position at its start as MuJoCo's
    position actuators do, kp (q* - q) - kd qd+ (docs/simulator.md, *Actuators*). Either way the damping is
    implicit in qd+."""
    iterations: int = 10
    """Projected Gauss-Seidel sweeps of the contact solve (fixed, no early exit)."""
    substeps: int = 4
    """Physics substeps per control step."""
    dt: float = 0.005
    """Physics substep h [s]; the control period is substeps * dt."""
    limit_kappa: float = 50.0
    """Stiffness of the joint-limit activation s(r) = sigmoid(limit_kappa * r), r = the violation predicted at the end
    of the substep [rad] (positive past the limit); unit 1/rad."""
    limit_beta: float = 0.2
    """Baumgarte factor of the joint limits: a joint past its limit by r is backed out at limit_beta * r / h."""
    limit_impedance: float = 0.99
    """Largest fraction of a limited joint's free velocity that the limit absorbs per substep (MuJoCo's solimp
    d_max); must lie in (0, 1)."""
    limit_guard_window: float = 12.0
    """Window [rad/s] of the joint-limit guard, the hard stop after the contact solve (reference.limit_guard): a
    limited joint takes part when its excess speed e over what would carry it to its limit by the end of the
    substep (or deeper past it) is above -window, fully above -window / 2 (a C1 smoothstep between), so that joints
    close to binding are stopped too when the impulses on their neighbours fling them; 0 turns the guard off."""
    limit_guard_width: float = 0.002
    """Width [rad] over which the guard's allowance (the speed at which a joint may still approach its limit,
    max(-r, 0) / h for violation r) is rounded at the limit: w softplus(-r / w) / h; joints pressed into a limit
    rest within it, so its corner must not be sharp."""
    limit_guard_iterations: int = 4
    """Gauss-Seidel sweeps of the guard over the joints it stops (coupled through the inverse mass matrix)."""

    def __post_init__(self) -> None:
        def is_int(x: Any) -> bool:
            return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

        def finite(x: Any) -> bool:
            return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)

        checks = {
            "kappa": finite(self.kappa) and self.kappa > 0,
            "beta": finite(self.beta) and 0 <= self.beta <= 1,
            "mu": finite(self.mu) and self.mu >= 0,
            "soft_timeconst": finite(self.soft_timeconst) and (self.soft_timeconst == 0
                                                                or self.soft_timeconst >= 2 * self.dt),
            "soft_impedance": finite(self.soft_impedance) and 0 < self.soft_impedance < 1,
            "dropout": finite(self.dropout) and 0 <= self.dropout <= 1,
            "dropout_depth": finite(self.dropout_depth) and self.dropout_depth >= 0,
            "pd_lookahead": isinstance(self.pd_lookahead, (bool, np.bool_)),
            "iterations": is_int(self.iterations) and self.iterations >= 1,
            "substeps": is_int(self.substeps) and self.substeps >= 1,
            "dt": finite(self.dt) and self.dt > 0,
            "limit_kappa": finite(self.limit_kappa) and self.limit_kappa > 0,
            "limit_beta": finite(self.limit_beta) and 0 <= self.limit_beta <= 1,
            "limit_impedance": finite(self.limit_impedance) and 0 < self.limit_impedance < 1,
            "limit_guard_window": finite(self.limit_guard_window) and self.limit_guard_window >= 0,
            "limit_guard_iterations": is_int(self.limit_guard_iterations) and self.limit_guard_iterations >= 1,
            "limit_guard_width": finite(self.limit_guard_width) and self.limit_guard_width > 0,
        }
        expected = {
            "kappa": "a finite value > 0 [1/m]",
            "beta": "a value in [0, 1]",
            "mu": "a finite value >= 0",
            "soft_timeconst": "0 (Baumgarte contact) or a finite value >= 2 dt [s]",
            "soft_impedance": "a value in (0, 1)",
            "dropout": "a probability in [0, 1]",
            "dropout_depth": "a finite value >= 0 [m]",
            "pd_lookahead": "True or False",
            "iterations": "an integer >= 1",
            "substeps": "an integer >= 1",
            "dt": "a finite value > 0 [s]",
            "limit_kappa": "a finite value > 0 [1/rad]",
            "limit_beta": "a value in [0, 1]",
            "limit_impedance": "a value in (0, 1)",
            "limit_guard_window": "a finite value >= 0 [rad/s] (0: no guard)",
            "limit_guard_iterations": "an integer >= 1",
            "limit_guard_width": "a finite value > 0 [rad]",
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"ContactParams.{name} must be {expected[name]}, got {getattr(self, name)!r}")

    def normal_bias_gains(self) -> tuple[float, float, float]:
        """(g_free, g_start, g_depth) of a normal contact row's velocity bias
        w = g_free J v_free + g_start J v_0 - g_depth clamp(d) / h, the row asking J v_next = J v_free - w (v_free:
        the substep's velocity without contact, v_0: its start velocity, d: penetration, h: substep):
        (1, 0, beta) without soft contact (J v_next = beta d / h); with impedance i and time constant T,
        (i, 2 h / T - i, beta), so that J v_next = (1 - i) J v_free + i (1 - 2 h / (i T)) J v_0 + beta d / h: the
        velocity part of MuJoCo's reference acceleration a_ref = -(2 / (i T)) J v_0, and the Baumgarte push-out."""
        if self.soft_timeconst == 0:
            return 1.0, 0.0, float(self.beta)
        i, t, h = float(self.soft_impedance), float(self.soft_timeconst), float(self.dt)
        return i, 2.0 * h / t - i, float(self.beta)

    @property
    def control_dt(self) -> float:
        """Control period [s] = substeps * dt."""
        return self.substeps * self.dt


@dataclass(frozen=True, eq=False)
class SimModel:
    """Host-side (numpy, float64) description of the tree, simulated on ``device``. Its Warp copies live in the
    workspace a :class:`bcg.sim.runtime.Runtime` keeps for it (models compare and hash by identity for that).

    Shapes: ``nb`` bodies, ``nv`` dofs, ``nu`` actuators, ``nc`` contact spheres, ``nf`` contact bodies ("feet").
    """

    device: str
    params: ContactParams
    body_names: tuple[str, ...]
    joint_names: tuple[str, ...]
    """Hinge names in qpos order (``nb - 1``)."""
    body_parent: np.ndarray  # [nb] int, -1 for the root
    body_pos: np.ndarray  # [nb, 3] joint frame origin in the parent frame at q = 0 [m]
    body_quat_wxyz: np.ndarray  # [nb, 4] joint frame orientation in the parent frame
    body_axis: np.ndarray  # [nb, 3] hinge axis in the body frame (root row unused)
    body_mass: np.ndarray  # [nb] [kg]
    body_com: np.ndarray  # [nb, 3] centre of mass in the body frame [m]
    body_inertia: np.ndarray  # [nb, 3, 3] rotational inertia about the COM, body frame [kg m^2]
    body_subtree_end: np.ndarray  # [nb] int
    body_last_dof: np.ndarray  # [nb] int: the dof that moves the body last (5 for the root)
    dof_body: np.ndarray  # [nv] int
    dof_ancestors: np.ndarray  # [nv, max_depth] int, padded with -1: dofs above dof a, nearest first
    dof_ancestor_count: np.ndarray  # [nv] int
    dof_subtree_end: np.ndarray  # [nv] int: the dofs below dof a (a excluded) are the range (a, dof_subtree_end[a])
    dof_armature: np.ndarray  # [nv] [kg m^2] or [kg]
    dof_damping: np.ndarray  # [nv] viscous joint damping [N m s/rad]
    dof_actuator: np.ndarray  # [nv] int: actuator driving the dof, or -1
    actuator_dof: np.ndarray  # [nu] int
    kp: np.ndarray  # [nu] position gain [N m/rad]
    kd: np.ndarray  # [nu] velocity gain [N m s/rad]
    torque_limit: np.ndarray  # [nu] [N m], inf if unlimited
    actuator_speed: np.ndarray  # [nu] no-load speed v0 of the torque-speed envelope [rad/s], inf if none
    dof_limited: np.ndarray  # [nv] bool: the hinge has a position range (MuJoCo jnt_limited)
    dof_range: np.ndarray  # [nv, 2] lower and upper position limit [rad] (-inf, inf where unlimited)
    sphere_body: np.ndarray  # [nc] int
    sphere_pos: np.ndarray  # [nc, 3] centre in the body frame [m]
    sphere_radius: np.ndarray  # [nc] [m]
    sphere_foot: np.ndarray  # [nc] int: index of the sphere's body among the contact bodies
    foot_body: np.ndarray  # [nf] int
    gravity: np.ndarray  # [3] [m/s^2]
    total_mass: float
    mjcf_path: str | None = None

    @property
    def nb(self) -> int:
        return len(self.body_parent)

    @property
    def nq(self) -> int:
        return ROOT_NQ + self.nb - 1

    @property
    def nv(self) -> int:
        return ROOT_NV + self.nb - 1

    @property
    def nu(self) -> int:
        return len(self.actuator_dof)

    @property
    def nc(self) -> int:
        return len(self.sphere_body)

    @property
    def nf(self) -> int:
        return len(self.foot_body)

    def tree_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row a, column b, depth of b) [nnz] int of the mass matrix's tree pattern: (a, a) and (a, b) for every
        ancestor b of a (376 pairs for the G1, against nv^2 = 1225). The kernels keep H and its factor L
        depth-indexed, [N, nv, D] with (a, b) at [:, a, depth(b)], depth = ``dof_ancestor_count``."""
        rows, cols = [], []
        for a in range(self.nv):
            rows += [a] * (int(self.dof_ancestor_count[a]) + 1)
            cols += [a] + [int(b) for b in self.dof_ancestors[a, : self.dof_ancestor_count[a]]]
        rows_np, cols_np = np.array(rows, np.int64), np.array(cols, np.int64)
        return rows_np, cols_np, self.dof_ancestor_count[cols_np].astype(np.int64)

    def with_params(self, **changes: Any) -> SimModel:
        """A copy with some :class:`ContactParams` fields replaced (shares the tree arrays)."""
        params = dataclasses.replace(self.params, **changes)
        return dataclasses.replace(self, params=params)

    def without_joint_limits(self) -> SimModel:
        """A copy whose hinges ignore their position limits (for comparisons with MuJoCo's ``mjDSBL_LIMIT``)."""
        return dataclasses.replace(self, dof_limited=np.zeros_like(self.dof_limited))

    def with_gains(self, kp: np.ndarray | None = None, kd: np.ndarray | None = None,
                   torque_limit: np.ndarray | None = None, actuator_speed: np.ndarray | None = None) -> SimModel:
        """A copy with other PD gains, torque limits [N m] or no-load speeds [rad/s] (inf: no torque-speed
        envelope), each of shape [nu]."""
        new = {}
        for name, value in (("kp", kp), ("kd", kd), ("torque_limit", torque_limit), ("actuator_speed", actuator_speed)):
            if value is not None:
                arr = np.asarray(value, dtype=np.float64).reshape(-1)
                if arr.shape != (self.nu,) or np.any(arr < 0) or np.any(np.isnan(arr)):
                    raise ValueError(f"{name} must be {self.nu} non-negative values, got shape {arr.shape}")
                if name == "actuator_speed" and np.any(arr == 0):
                    raise ValueError("actuator_speed must be > 0 (inf switches the torque-speed envelope off)")
                new[name] = arr
        return dataclasses.replace(self, **new)


_JOINT_TYPE_NAMES = {0: "free", 1: "ball", 2: "slide", 3: "hinge"}


def _quat_to_mat(q_wxyz: np.ndarray) -> np.ndarray:
    w, x, y, z = q_wxyz / np.linalg.norm(q_wxyz)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def _check_tree(m: Any) -> None:
    import mujoco

    nb = m.nbody - 1
    if nb < 1:
        raise UnsupportedModelError("the model has no moving body")
    problems = []
    for b in range(1, m.nbody):
        name = m.body(b).name or f"body {b}"
        jnts = [m.body_jntadr[b] + k for k in range(m.body_jntnum[b])]
        types = [_JOINT_TYPE_NAMES.get(int(m.jnt_type[j]), str(m.jnt_type[j])) for j in jnts]
        if b == 1:
            if types != ["free"]:
                problems.append(f"root body '{name}' must have exactly one free joint, has {types or 'none'}")
        else:
            if m.body_parentid[b] == 0:
                problems.append(f"body '{name}' is a second root (child of the world); only one floating root is "
                                "supported")
            if types != ["hinge"]:
                problems.append(f"body '{name}' must have exactly one hinge joint, has {types or 'none (welded)'}")
            elif np.any(m.jnt_pos[jnts[0]] != 0):
                problems.append(f"joint '{m.joint(jnts[0]).name}' has a non-zero pos; joints must sit at the body "
                                "origin")
    if problems:
        raise UnsupportedModelError("the engine supports a free-floating root plus one hinge per body:\n  "
                                    + "\n  ".join(problems))
    for a in range(m.nu):
        if m.actuator_trntype[a] != mujoco.mjtTrn.mjTRN_JOINT:
            raise UnsupportedModelError(f"actuator '{m.actuator(a).name}' does not act on a joint")
        gain, bias = m.actuator_gainprm[a], m.actuator_biasprm[a]
        if m.actuator_gaintype[a] != 0 or m.actuator_biastype[a] != 1 or not np.isclose(bias[1], -gain[0]):
            raise UnsupportedModelError(f"actuator '{m.actuator(a).name}' is not a position (PD) actuator")
        if m.actuator_dyntype[a] != 0:
            raise UnsupportedModelError(f"actuator '{m.actuator(a).name}' has activation dynamics")


def _contact_spheres(m: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import mujoco

    body, pos, radius = [], [], []
    for g in range(m.ngeom):
        if m.geom_bodyid[g] == 0 or (m.geom_contype[g] == 0 and m.geom_conaffinity[g] == 0):
            continue
        if m.geom_type[g] != mujoco.mjtGeom.mjGEOM_SPHERE:
            kind = mujoco.mjtGeom(m.geom_type[g]).name
            raise UnsupportedModelError(f"collision geom '{m.geom(g).name or g}' is a {kind}; only spheres collide "
                                        "in this engine (set contype=conaffinity=0 on visual geoms)")
        body.append(int(m.geom_bodyid[g]) - 1)
        pos.append(m.geom_pos[g].copy())
        radius.append(float(m.geom_size[g, 0]))
    order = np.argsort(np.asarray(body, dtype=np.int64), kind="stable")
    return (np.asarray(body, np.int64)[order], np.asarray(pos, np.float64).reshape(-1, 3)[order],
            np.asarray(radius, np.float64)[order])


def model_from_mujoco(m: Any, device: str = "cpu", params: ContactParams | None = None,
                      mjcf_path: str | None = None) -> SimModel:
    """Build a :class:`SimModel` from a compiled ``mujoco.MjModel`` (see the module docstring for what is accepted)."""
    _check_tree(m)
    nb = m.nbody - 1
    nv = 6 + nb - 1
    parent = np.array([m.body_parentid[b + 1] - 1 for b in range(nb)], np.int64)
    axis = np.zeros((nb, 3))
    for b in range(1, nb):
        axis[b] = m.jnt_axis[m.body_jntadr[b + 1]]
    inertia = np.zeros((nb, 3, 3))
    for b in range(nb):
        R = _quat_to_mat(m.body_iquat[b + 1])
        inertia[b] = R @ np.diag(m.body_inertia[b + 1]) @ R.T
    subtree_end = np.arange(nb) + 1
    for b in reversed(range(1, nb)):
        subtree_end[parent[b]] = max(subtree_end[parent[b]], subtree_end[b])
    last_dof = np.array([5] + [5 + b for b in range(1, nb)], np.int64)
    dof_body = np.array([0] * 6 + list(range(1, nb)), np.int64)
    dof_parent = np.empty(nv, np.int64)
    for a in range(nv):
        dof_parent[a] = a - 1 if a < 6 else last_dof[parent[dof_body[a]]]
    chains = []
    for a in range(nv):
        chain, b = [], dof_parent[a]
        while b >= 0:
            chain.append(int(b))
            b = dof_parent[b]
        chains.append(chain)
    depth = max(1, max(len(c) for c in chains))
    ancestors = np.full((nv, depth), -1, np.int64)
    for a, chain in enumerate(chains):
        ancestors[a, : len(chain)] = chain
    count = np.array([len(c) for c in chains], np.int64)
    dof_subtree_end = np.array([nv] * 6 + [5 + subtree_end[b] for b in range(1, nb)], np.int64)

    dof_actuator = np.full(nv, -1, np.int64)
    actuator_dof = np.array([m.jnt_dofadr[m.actuator_trnid[a, 0]] for a in range(m.nu)], np.int64)
    if np.any(actuator_dof < 6):
        raise UnsupportedModelError("an actuator drives the free joint; only hinge actuators are supported")
    if len(set(actuator_dof.tolist())) != len(actuator_dof):
        raise UnsupportedModelError("two actuators drive the same joint")
    dof_actuator[actuator_dof] = np.arange(m.nu)
    kp = np.array([m.actuator_gainprm[a, 0] for a in range(m.nu)], np.float64)
    kd = np.array([-m.actuator_biasprm[a, 2] for a in range(m.nu)], np.float64)
    limit = np.full(m.nu, np.inf)
    for a in range(m.nu):
        jnt = m.actuator_trnid[a, 0]
        if m.actuator_forcelimited[a]:
            limit[a] = min(limit[a], abs(m.actuator_forcerange[a, 1]), abs(m.actuator_forcerange[a, 0]))
        if m.jnt_actfrclimited[jnt]:
            limit[a] = min(limit[a], abs(m.jnt_actfrcrange[jnt, 1]), abs(m.jnt_actfrcrange[jnt, 0]))

    speed = _actuator_no_load_speed(m)

    dof_limited = np.zeros(nv, bool)
    dof_range = np.tile(np.array([-np.inf, np.inf]), (nv, 1))
    for b in range(1, nb):
        jnt = m.body_jntadr[b + 1]
        if m.jnt_limited[jnt]:
            dof_limited[ROOT_NV + b - 1] = True
            dof_range[ROOT_NV + b - 1] = m.jnt_range[jnt]

    s_body, s_pos, s_rad = _contact_spheres(m)
    foot_body = np.unique(s_body)
    s_foot = np.searchsorted(foot_body, s_body)
    names = tuple(m.body(b + 1).name for b in range(nb))
    jnames = tuple(m.joint(m.body_jntadr[b + 1]).name for b in range(1, nb))
    return SimModel(
        device=device,
        params=params or ContactParams(),
        body_names=names,
        joint_names=jnames,
        body_parent=parent,
        body_pos=m.body_pos[1:].astype(np.float64).copy(),
        body_quat_wxyz=m.body_quat[1:].astype(np.float64).copy(),
        body_axis=axis,
        body_mass=m.body_mass[1:].astype(np.float64).copy(),
        body_com=m.body_ipos[1:].astype(np.float64).copy(),
        body_inertia=inertia,
        body_subtree_end=subtree_end.astype(np.int64),
        body_last_dof=last_dof,
        dof_body=dof_body,
        dof_ancestors=ancestors,
        dof_ancestor_count=count,
        dof_subtree_end=dof_subtree_end,
        dof_armature=m.dof_armature.astype(np.float64).copy(),
        dof_damping=m.dof_damping.astype(np.float64).copy(),
        dof_actuator=dof_actuator,
        actuator_dof=actuator_dof,
        kp=kp,
        kd=kd,
        torque_limit=limit,
        actuator_speed=speed,
        dof_limited=dof_limited,
        dof_range=dof_range,
        sphere_body=s_body,
        sphere_pos=s_pos,
        sphere_radius=s_rad,
        sphere_foot=s_foot.astype(np.int64),
        foot_body=foot_body.astype(np.int64),
        gravity=m.opt.gravity.astype(np.float64).copy(),
        total_mass=float(m.body_mass[1:].sum()),
        mjcf_path=mjcf_path,
    )


NO_LOAD_SPEED_NUMERIC = "bcg_actuator_no_load_speed"
"""Name of the MJCF custom numeric (``<custom><numeric name=... data="v0 per actuator"/></custom>``) that gives
each actuator's no-load speed [rad/s] for the torque-speed envelope; MuJoCo itself ignores it."""


def _actuator_no_load_speed(m: Any) -> np.ndarray:
    """[nu] no-load speeds [rad/s] from the custom numeric :data:`NO_LOAD_SPEED_NUMERIC`, inf without it."""
    import mujoco

    idx = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_NUMERIC, NO_LOAD_SPEED_NUMERIC)
    if idx < 0:
        return np.full(m.nu, np.inf)
    adr, size = int(m.numeric_adr[idx]), int(m.numeric_size[idx])
    speed = np.asarray(m.numeric_data[adr:adr + size], dtype=np.float64).copy()
    if speed.shape != (m.nu,) or not np.all(speed > 0):
        raise UnsupportedModelError(
            f"custom numeric {NO_LOAD_SPEED_NUMERIC!r} must hold one positive speed [rad/s] per actuator "
            f"({m.nu}), got {size} values")
    return speed


def load_model(mjcf_path: str | Path | None = None, device: str = "cpu", **params: Any) -> SimModel:
    """Compile an MJCF with MuJoCo and build the engine's model from it.

    Args:
        mjcf_path: path of the MJCF; default: the packaged G1 (``bcg.robots.g1.MJCF_PATH``).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"``.
        **params: fields of :class:`ContactParams` (``kappa``, ``beta``, ``mu``, ``iterations``, ``substeps``,
            ``dt``); unknown names raise.
    """
    import mujoco

    from bcg.sim.device import check_device

    device = check_device(device)
    if mjcf_path is None:
        from bcg.robots.g1 import MJCF_PATH

        mjcf_path = MJCF_PATH
    path = Path(mjcf_path)
    if not path.is_file():
        raise FileNotFoundError(f"MJCF file not found: {path}")
    known = {f.name for f in dataclasses.fields(ContactParams)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise TypeError(f"unknown simulator parameter(s) {unknown}; known: {sorted(known)}")
    m = mujoco.MjModel.from_xml_path(str(path))
    return model_from_mujoco(m, device=device, params=ContactParams(**params), mjcf_path=str(path))
