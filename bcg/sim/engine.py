"""Warp-side driver: the model's device arrays, per-substep scratch, and the launch sequence of a control step.

Nothing here touches torch. :mod:`bcg.sim.step` wraps :func:`run_control_step` in a ``torch.autograd.Function``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import warp as wp

from bcg.sim import kernels as K
from bcg.sim.model import SimModel

__all__ = [
    "Launch",
    "ModelArrays",
    "StepArrays",
    "allocate_step",
    "model_arrays",
    "clear_pool",
    "release_step",
    "run_control_step",
    "run_dynamics_terms",
    "substep_launches",
]


@dataclass(frozen=True)
class ModelArrays:
    """Device copies of the :class:`SimModel` fields the kernels read (float32 / int32)."""

    body_parent: wp.array
    body_pos: wp.array
    body_quat: wp.array  # x, y, z, w (Warp order)
    body_axis: wp.array
    body_mass: wp.array  # [1, nb]: the physical parameters have a leading row axis (1 = shared, N = per env)
    body_com: wp.array
    body_inertia: wp.array
    body_subtree_end: wp.array
    body_last_dof: wp.array
    dof_body: wp.array
    dof_ancestors: wp.array
    dof_ancestor_count: wp.array
    dof_subtree_end: wp.array
    dof_armature: wp.array
    dof_damping: wp.array
    dof_actuator: wp.array
    dof_no_actuator: wp.array
    dof_no_limit: wp.array
    dof_zero: wp.array
    dof_limited: wp.array  # [nv] int 0/1
    dof_range: wp.array  # [nv] vec2 (lower, upper) [rad]
    kp: wp.array
    kd: wp.array
    mu: wp.array  # [1]
    torque_limit: wp.array
    actuator_speed: wp.array  # [nu] no-load speed [rad/s], 1e30 without an envelope
    sphere_body: wp.array
    sphere_pos: wp.array
    sphere_radius: wp.array
    sphere_foot: wp.array
    foot_body: wp.array
    gravity: wp.vec3


def _build_arrays(model: SimModel) -> ModelArrays:
    d = model.device

    def f32(x: np.ndarray, dtype: type = float) -> wp.array:
        return wp.array(np.ascontiguousarray(x, dtype=np.float32), dtype=dtype, device=d)

    def i32(x: np.ndarray) -> wp.array:
        return wp.array(np.ascontiguousarray(x, dtype=np.int32), dtype=int, device=d)

    quat_xyzw = model.body_quat_wxyz[:, [1, 2, 3, 0]]
    limit = np.where(np.isfinite(model.torque_limit), model.torque_limit, 1e30)
    # the envelope scales with the torque limit, so an unlimited actuator has none
    speed = np.where(np.isfinite(model.torque_limit) & np.isfinite(model.actuator_speed), model.actuator_speed, 1e30)
    return ModelArrays(
        body_parent=i32(model.body_parent),
        body_pos=f32(model.body_pos, wp.vec3),
        body_quat=f32(quat_xyzw, wp.quat),
        body_axis=f32(model.body_axis, wp.vec3),
        body_mass=f32(model.body_mass[None]),
        body_com=f32(model.body_com[None], wp.vec3),
        body_inertia=f32(model.body_inertia[None], wp.mat33),
        body_subtree_end=i32(model.body_subtree_end),
        body_last_dof=i32(model.body_last_dof),
        dof_body=i32(model.dof_body),
        dof_ancestors=i32(model.dof_ancestors),
        dof_ancestor_count=i32(model.dof_ancestor_count),
        dof_subtree_end=i32(model.dof_subtree_end),
        dof_armature=f32(model.dof_armature[None]),
        dof_damping=f32(model.dof_damping[None]),
        dof_actuator=i32(model.dof_actuator),
        dof_no_actuator=i32(np.full(model.nv, -1)),
        dof_no_limit=i32(np.zeros(model.nv)),
        dof_zero=f32(np.zeros((1, model.nv))),
        dof_limited=i32(model.dof_limited.astype(np.int32)),
        dof_range=f32(np.where(model.dof_limited[:, None], model.dof_range, 0.0), wp.vec2),
        kp=f32(model.kp[None]),
        kd=f32(model.kd[None]),
        mu=f32(np.array([model.params.mu])),
        torque_limit=f32(limit),
        actuator_speed=f32(speed),
        sphere_body=i32(model.sphere_body),
        sphere_pos=f32(model.sphere_pos.reshape(-1, 3), wp.vec3),
        sphere_radius=f32(model.sphere_radius),
        sphere_foot=i32(model.sphere_foot),
        foot_body=i32(model.foot_body),
        gravity=wp.vec3(*[float(g) for g in model.gravity]),
    )


@dataclass
class _Cache:
    arrays: ModelArrays | None = None
    workspaces: dict = field(default_factory=dict)
    grad_pool: dict = field(default_factory=dict)
    """Released gradient-step arrays by N: reusing them avoids page-faulting hundreds of MiB per rollout."""
    pool_bytes: int = 0


POOL_LIMIT_BYTES = 2 * 2**30
"""At most this many bytes of released gradient-step arrays are kept per model for reuse (the rest are freed)."""


def model_arrays(model: SimModel) -> ModelArrays:
    """The model's device arrays, built on first use and cached on the model."""
    cache = model.warp
    if cache is None:
        cache = _Cache()
        object.__setattr__(model, "warp", cache)
    if cache.arrays is None:
        cache.arrays = _build_arrays(model)
    return cache.arrays


class StepArrays:
    """All arrays one control step writes: S + 1 states and S substeps of write-once scratch.

    ``q[0]``, ``qd[0]`` and ``targets`` are the inputs (filled by the caller); ``q[S]``, ``qd[S]`` the outputs;
    ``impulse`` and ``depth`` [N, S, nc] the per-substep normal impulses [N s] and penetrations [m].
    """

    def __init__(self, model: SimModel, n: int, requires_grad: bool, per_env_physics: bool = False):
        p = model.params
        nb, nv, nc, nf, nu = model.nb, model.nv, model.nc, model.nf, model.nu
        nr, nf6, it = 3 * nc, 6 * nf, p.iterations
        dev = model.device

        def zeros(shape: tuple, dtype: type = float) -> wp.array:
            return wp.zeros(shape, dtype=dtype, device=dev, requires_grad=requires_grad)

        def empty(shape: tuple, dtype: type = float) -> wp.array:
            return wp.empty(shape, dtype=dtype, device=dev, requires_grad=requires_grad)

        self.n = n
        self.requires_grad = requires_grad
        self.recorded: list | None = None
        """Recorded launches of a reused (no-gradient) workspace, replayed by :func:`run_control_step`."""
        self.physics: dict[str, wp.array] | None = None
        """Per-environment physical parameters ([N, ...], no gradients), filled by the caller before each step;
        None: the model's shared parameters."""
        if per_env_physics:
            self.physics = dict(
                body_mass=wp.empty((n, nb), dtype=float, device=dev),
                body_com=wp.empty((n, nb), dtype=wp.vec3, device=dev),
                body_inertia=wp.empty((n, nb), dtype=wp.mat33, device=dev),
                dof_armature=wp.empty((n, nv), dtype=float, device=dev),
                dof_damping=wp.empty((n, nv), dtype=float, device=dev),
                kp=wp.empty((n, nu), dtype=float, device=dev),
                kd=wp.empty((n, nu), dtype=float, device=dev),
                mu=wp.empty(n, dtype=float, device=dev),
            )
        self.q = [empty((n, model.nq)) for _ in range(p.substeps + 1)]
        self.qd = [empty((n, nv)) for _ in range(p.substeps + 1)]
        self.targets = empty((n, nu))
        self.impulse = empty((n, p.substeps, nc))
        self.depth = empty((n, p.substeps, nc))
        self.sub = []
        for _ in range(p.substeps):
            self.sub.append(dict(
                X_w=empty((n, nb), wp.transform), S=empty((n, nv), wp.spatial_vector),
                v_b=empty((n, nb), wp.spatial_vector), a_b=empty((n, nb), wp.spatial_vector),
                IO_w=empty((n, nb), wp.mat33), h_w=empty((n, nb), wp.vec3), f_b=empty((n, nb), wp.spatial_vector),
                IC_O=empty((n, nb), wp.mat33), IC_h=empty((n, nb), wp.vec3), IC_m=empty((n, nb)),
                F_sub=empty((n, nb), wp.spatial_vector),
                H=zeros((n, nv, nv)), tau=empty((n, nv)),
                L=zeros((n, nv, nv)), L_tmp=zeros((n, nv, nv)), y=empty((n, nv)), y_tmp=empty((n, nv)),
                x=empty((n, nv)), x_tmp=empty((n, nv)), v_free=empty((n, nv)),
                J_foot=zeros((n, nf6, nv)), foot_twist=empty((n, max(nf, 1)), wp.spatial_vector),
                Y=zeros((n, nf6, nv)), Y_tmp=empty((n, nf6, nv)), Lam=empty((n, nf6, nf6)),
                G=empty((n, nr), wp.spatial_vector), P=empty((n, nr, nf6)), A=empty((n, nr, nr)),
                w=empty((n, nr)), s_act=empty((n, nc)), depth=empty((n, nc)),
                A_foot=empty((n, max(nf, 1)), wp.vec2), s_norm=empty((n, nc)),
                lam=zeros((n, it + 1, nr)), residual=empty((n, it, nr)),
                foot_impulse=empty((n, nf), wp.spatial_vector), z=empty((n, nv)), dv_tmp=empty((n, nv)),
                dv=empty((n, nv)),
            ))

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays and their gradients."""
        extra = sum(a.capacity for a in self.physics.values()) if self.physics else 0
        return extra + sum(a.capacity * (2 if a.requires_grad else 1) for a in self.all_arrays())

    def all_arrays(self) -> list[wp.array]:
        """Every array of the step (states, inputs, per-substep scratch)."""
        out = self.q + self.qd + [self.targets, self.impulse, self.depth]
        for s in self.sub:
            out += list(s.values())
        return out

    @property
    def per_env_physics(self) -> bool:
        return self.physics is not None

    def reset_for_reuse(self) -> None:
        """Re-zero the partially written scratch (and, with gradients, every gradient) so that the arrays can serve
        another step."""
        for s in self.sub:
            for name in ("H", "J_foot", "Y", "lam"):
                s[name].zero_()
        if self.requires_grad:
            for a in self.all_arrays():
                a.grad.zero_()


def allocate_step(model: SimModel, n: int, requires_grad: bool, per_env_physics: bool = False) -> StepArrays:
    """Arrays for one step: with gradients, a set of its own (from the pool of released sets when possible);
    without, one cached set that every call reuses."""
    model_arrays(model)
    key = (n, per_env_physics)
    if requires_grad:
        pool = model.warp.grad_pool.get(key)
        if pool:
            arrs = pool.pop()
            model.warp.pool_bytes -= arrs.nbytes
            arrs.reset_for_reuse()
            return arrs
        return StepArrays(model, n, True, per_env_physics)
    ws = model.warp.workspaces.get(key)
    if ws is None:
        ws = StepArrays(model, n, False, per_env_physics)
        model.warp.workspaces[key] = ws
    else:
        ws.reset_for_reuse()
    return ws


class Launch(NamedTuple):
    """One kernel launch: the kernel and its argument lists (inputs, then outputs)."""

    kernel: Any
    inputs: list
    outputs: list


def substep_launches(model: SimModel, arrs: StepArrays, k: int, terms_only: bool = False) -> list[Launch]:
    """The seven launches of substep ``k``: reads q[k], qd[k], targets; writes q[k + 1], qd[k + 1].

    ``terms_only``: just the first three, set up so that H is the mass matrix with armature and tau = -bias
    (no damping, no actuation, dt = 0).
    """
    m = model_arrays(model)
    p = model.params
    s = arrs.sub[k]
    q, qd = arrs.q[k], arrs.qd[k]
    ph = arrs.physics or dict(body_mass=m.body_mass, body_com=m.body_com, body_inertia=m.body_inertia,
                              dof_armature=m.dof_armature, dof_damping=m.dof_damping, kp=m.kp, kd=m.kd, mu=m.mu)
    launches = [
        Launch(K.fk_rnea,
               [q, qd, m.body_parent, m.body_pos, m.body_quat, m.body_axis, ph["body_mass"], ph["body_com"],
                ph["body_inertia"], m.gravity],
               [s["X_w"], s["S"], s["v_b"], s["a_b"], s["IO_w"], s["h_w"], s["f_b"]]),
        Launch(K.composite, [ph["body_mass"], m.body_subtree_end, s["IO_w"], s["h_w"], s["f_b"]],
               [s["IC_O"], s["IC_h"], s["IC_m"], s["F_sub"]]),
        Launch(K.mass_tau,
               [q, qd, arrs.targets, m.dof_body, m.dof_ancestors, m.dof_ancestor_count, ph["dof_armature"],
                m.dof_zero if terms_only else ph["dof_damping"], m.dof_no_actuator if terms_only else m.dof_actuator,
                m.dof_no_limit if terms_only else m.dof_limited, m.dof_range, ph["kp"], ph["kd"], m.torque_limit,
                m.actuator_speed, p.limit_kappa, p.limit_impedance, p.limit_beta, 0.0 if terms_only else p.dt,
                s["S"], s["IC_O"], s["IC_h"], s["IC_m"], s["F_sub"]],
               [s["H"], s["tau"]]),
        Launch(K.factor_free, [qd, s["H"], s["tau"], m.dof_ancestors, m.dof_ancestor_count, m.dof_subtree_end, p.dt],
               [s["L"], s["L_tmp"], s["y"], s["y_tmp"], s["x"], s["x_tmp"], s["v_free"]]),
        Launch(K.contact_setup,
               [q, s["X_w"], s["S"], m.sphere_body, m.sphere_pos, m.sphere_radius, m.sphere_foot, m.foot_body,
                m.body_last_dof, m.dof_ancestors, m.dof_ancestor_count, s["L"], s["v_free"], p.kappa, p.beta, p.dt],
               [s["J_foot"], s["foot_twist"], s["Y"], s["Y_tmp"], s["Lam"], s["G"], s["P"], s["A"], s["w"],
                s["s_act"], s["depth"], s["A_foot"], s["s_norm"]]),
        Launch(K.pgs, [s["A"], s["w"], s["s_act"], s["s_norm"], s["depth"], ph["mu"], p.iterations, k],
               [s["lam"], s["residual"], arrs.impulse, arrs.depth]),
        Launch(K.apply_integrate,
               [q, s["v_free"], s["Y"], s["G"], s["L"], s["lam"], m.sphere_foot, m.dof_ancestors,
                m.dof_ancestor_count, p.iterations, p.dt],
               [s["foot_impulse"], s["z"], s["dv_tmp"], s["dv"], arrs.q[k + 1], arrs.qd[k + 1]]),
    ]
    return launches[:3] if terms_only else launches


def release_step(model: SimModel, arrs: StepArrays) -> None:
    """Give a gradient step's arrays back once its tape has been replayed and nothing refers to them any more."""
    cache = model.warp
    size = arrs.nbytes
    if cache.pool_bytes + size <= POOL_LIMIT_BYTES:
        cache.grad_pool.setdefault((arrs.n, arrs.per_env_physics), []).append(arrs)
        cache.pool_bytes += size


def clear_pool(model: SimModel) -> None:
    """Free the released gradient-step arrays kept for reuse."""
    if model.warp is not None:
        model.warp.grad_pool.clear()
        model.warp.pool_bytes = 0


def run_control_step(model: SimModel, arrs: StepArrays) -> None:
    """Launch the S substeps of one control step on ``arrs`` (inputs already in q[0], qd[0], targets).

    Reused (no-gradient) arrays record their launches once and replay them afterwards, which skips Warp's
    per-launch argument packing (it dominates the cost of a step at small N).
    """
    if arrs.recorded is not None:
        for cmd in arrs.recorded:
            cmd.launch()
        return
    record = not arrs.requires_grad
    cmds = []
    for k in range(model.params.substeps):
        for launch in substep_launches(model, arrs, k):
            cmd = wp.launch(launch.kernel, dim=arrs.n, inputs=launch.inputs, outputs=launch.outputs,
                            device=model.device, record_cmd=record)
            cmds.append(cmd)
    if record:
        for cmd in cmds:
            cmd.launch()
        arrs.recorded = cmds


def run_dynamics_terms(model: SimModel, arrs: StepArrays) -> tuple[wp.array, wp.array]:
    """Mass matrix (armature included) and bias forces at (q[0], qd[0]) of ``arrs``: returns (H, -bias)."""
    for launch in substep_launches(model, arrs, 0, terms_only=True):
        wp.launch(launch.kernel, dim=arrs.n, inputs=launch.inputs, outputs=launch.outputs, device=model.device)
    return arrs.sub[0]["H"], arrs.sub[0]["tau"]
