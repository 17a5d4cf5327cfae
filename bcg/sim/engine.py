"""Warp-side driver: the model's device arrays, per-substep scratch, and the launch sequence of a control step.

Nothing here touches torch. :mod:`bcg.sim.bridge` runs these launches (recorded and replayed) inside a
``torch.autograd.Function``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import warp as wp

from bcg.sim import kernels as K
from bcg.sim.model import SimModel
from bcg.sim.runtime import ModelWorkspace, default_runtime

__all__ = [
    "FieldSpec",
    "GradArrays",
    "Launch",
    "ModelArrays",
    "SetLayout",
    "StepArrays",
    "acquire_grads",
    "allocate_step",
    "model_arrays",
    "release_grads",
    "release_step",
    "run_dynamics_terms",
    "step_layout",
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
    limit_dof: wp.array  # [nl + 1] the limited dofs in order (the last entry a spare, so it is never empty)
    num_limited: int
    kp: wp.array
    kd: wp.array
    mu: wp.array  # [1]
    contact_bias: wp.array  # [1, 3] the model's (g_free, g_start, g_depth)
    contact_dropout: wp.array  # [1] the model's ContactParams.dropout
    torque_limit: wp.array
    actuator_speed: wp.array  # [nu] no-load speed [rad/s], 1e30 without an envelope
    sphere_body: wp.array
    sphere_pos: wp.array
    sphere_radius: wp.array
    sphere_foot: wp.array
    foot_body: wp.array
    foot_shared: wp.array  # [nf, nf] int: dofs the two contact bodies' chains share (the root's 6 between feet)
    gravity: wp.vec3


def _foot_shared(model: SimModel) -> np.ndarray:
    """[nf, nf] int: the number of dofs on both contact bodies' chains (their common ancestors, the root first)."""
    chains = []
    for b in model.foot_body:
        a = int(model.body_last_dof[b])
        chains.append({a, *(int(x) for x in model.dof_ancestors[a, : model.dof_ancestor_count[a]])})
    return np.array([[len(c1 & c2) for c2 in chains] for c1 in chains], np.int64).reshape(model.nf, model.nf)


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
        limit_dof=i32(np.append(np.nonzero(model.dof_limited)[0], 0)),  # one spare entry: never empty
        num_limited=int(model.dof_limited.sum()),
        kp=f32(model.kp[None]),
        kd=f32(model.kd[None]),
        mu=f32(np.array([model.params.mu])),
        contact_bias=f32(np.array([model.params.normal_bias_gains()])),
        contact_dropout=f32(np.array([model.params.dropout])),
        torque_limit=f32(limit[None]),
        actuator_speed=f32(speed),
        sphere_body=i32(model.sphere_body),
        sphere_pos=f32(model.sphere_pos.reshape(-1, 3), wp.vec3),
        sphere_radius=f32(model.sphere_radius),
        sphere_foot=i32(model.sphere_foot),
        foot_body=i32(model.foot_body),
        foot_shared=i32(_foot_shared(model)),
        gravity=wp.vec3(*[float(g) for g in model.gravity]),
    )


POOL_LIMIT_BYTES = 2 * 2**30
"""At most this many bytes of released gradient-step arrays are kept per model for reuse (the rest are freed)."""

_ALIGN = 64
"""Byte alignment of every array inside a set's buffer (a cache line)."""

RESET_FIELDS = ("J_foot", "Y", "lam", "z_l", "guard_on")
"""Scratch the kernels write only partly or accumulate into (J_foot, Y: the foot chains; lam: sweeps 1..K; z_l,
guard_on: the joint-limit guard's sums and flag): zeroed before every use of a set, so the entries never written
stay 0 as the kernels expect."""
CREATE_ZEROED = ("H", "L", "L_tmp")
"""Also zeroed when a set is created: the slots of the depth-indexed rows past each row's diagonal are never written
or read by the kernels, and zeroing them once keeps them finite for everything else that reads whole arrays (the
finite-difference tests perturb every entry in proportion to the array's largest)."""


def _workspace(model: SimModel, ws: ModelWorkspace | None) -> ModelWorkspace:
    return ws if ws is not None else default_runtime().workspace(model)


def model_arrays(model: SimModel, ws: ModelWorkspace | None = None) -> ModelArrays:
    """The model's device arrays, built on first use and kept in its workspace ``ws`` (default: the process
    runtime's)."""
    ws = _workspace(model, ws)
    if ws.arrays is None:
        ws.arrays = _build_arrays(model)
    return ws.arrays


class FieldSpec(NamedTuple):
    """Where one array of a :class:`StepArrays` lives in the set's buffer."""

    group: str
    """``"q"``, ``"qd"`` (index: the state), ``"targets"``, ``"impulse"``, ``"depth"``, ``"sub"`` (index: the
    substep, ``name`` the scratch array) or ``"physics"`` (``name`` the parameter)."""
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: Any
    offset: int
    """Bytes from the start of the buffer (a multiple of 64)."""
    nbytes: int

    @property
    def inner_shape(self) -> tuple[int, ...]:
        """Shape of one element (``()`` for float, ``(6,)`` for a spatial vector, ``(3, 3)`` for a mat33)."""
        return tuple(getattr(self.dtype, "_shape_", ()))


@dataclass(frozen=True)
class SetLayout:
    """The arrays of one control step laid out in one buffer: [reset | created zeroed | the rest | physics].

    Every array but the per-environment physics is differentiable; a :class:`GradArrays` holds their gradients in
    a buffer of ``grad_nbytes`` with the same offsets.
    """

    n: int
    per_env_physics: bool
    fields: tuple[FieldSpec, ...]
    nbytes: int
    """Bytes of the values (all arrays)."""
    grad_nbytes: int
    """Bytes of the differentiable arrays (everything before the physics)."""
    reset_nbytes: int
    """``[0, reset_nbytes)``: the :data:`RESET_FIELDS` of every substep."""
    zero_nbytes: int
    """``[0, zero_nbytes)``: zeroed at creation (:data:`RESET_FIELDS` and :data:`CREATE_ZEROED`)."""

    @property
    def grad_fields(self) -> tuple[FieldSpec, ...]:
        """The differentiable arrays (all but the physics, which come last)."""
        return tuple(f for f in self.fields if f.group != "physics")

    def find(self, group: str, index: int = 0, name: str = "") -> FieldSpec:
        """The spec of one array (``find("q", S)``, ``find("sub", k, "H")``, ``find("physics", 0, "mu")``)."""
        for f in self.fields:
            if f.group == group and f.index == index and f.name == name:
                return f
        raise KeyError(f"no array {group}[{index}] {name!r} in the step layout")


def _scratch_shapes(model: SimModel, n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Shape and dtype of every per-substep scratch array (the kernels' write-once outputs), in launch order."""
    p = model.params
    nb, nv, nc, nf = model.nb, model.nv, model.nc, model.nf
    nr, nf6, it = 3 * nc, 6 * nf, p.iterations
    nl, itl = max(int(model.dof_limited.sum()), 1), p.limit_guard_iterations
    chain = int(model.dof_ancestor_count.max()) + 1  # also the row length of the depth-indexed H, L and L_tmp
    f, sv, v3, m33 = float, wp.spatial_vector, wp.vec3, wp.mat33
    return dict(
        X_w=((n, nb), wp.transform), S=((n, nv), sv), v_b=((n, nb), sv), a_b=((n, nb), sv), IO_w=((n, nb), m33),
        h_w=((n, nb), v3), f_b=((n, nb), sv), IC_O=((n, nb), m33), IC_h=((n, nb), v3), IC_m=((n, nb), f),
        F_sub=((n, nb), sv), H=((n, nv, chain), f), tau=((n, nv), f), L=((n, nv, chain), f),
        L_tmp=((n, nv, chain), f),
        y=((n, nv), f), y_tmp=((n, nv), f), x=((n, nv), f), x_tmp=((n, nv), f), v_free=((n, nv), f),
        J_foot=((n, nf6, nv), f), foot_twist=((n, max(nf, 1)), sv), foot_twist0=((n, max(nf, 1)), sv),
        Y=((n, nf6, nv), f), Y_tmp=((n, nf6, nv), f),
        Lam=((n, nf6, nf6), f), G=((n, nr), sv), P=((n, nr, nf6), f), A=((n, nr, nr), f), w=((n, nr), f),
        s_act=((n, nc), f), depth=((n, nc), f), A_foot=((n, max(nf, 1)), wp.vec2), s_norm=((n, nc), f),
        lam=((n, it + 1, nr), f), residual=((n, it, nr), f), foot_impulse=((n, nf), sv), z=((n, nv), f),
        dv_tmp=((n, nv), f), dv=((n, nv), f), v_contact=((n, nv), f),
        lim_sign=((n, nl), f), excess=((n, nl), f), gate=((n, nl), f), Yl=((n, nl, chain), f),
        Dl=((n, nl * (nl + 1) // 2), f), lam_l=((n, itl + 1, nl), f), residual_l=((n, itl, nl), f),
        z_l=((n, nv), f), dv_l=((n, nv), f), guard_on=((n,), f),
    )


def step_layout(model: SimModel, n: int, per_env_physics: bool = False, ws: ModelWorkspace | None = None
                ) -> SetLayout:
    """The buffer layout of a control step's arrays for ``n`` environments (kept in the model's workspace)."""
    ws = _workspace(model, ws)
    key = (n, per_env_physics)
    cached = ws.layouts.get(key)
    if cached is not None:
        return cached
    p = model.params
    S = p.substeps
    scratch = _scratch_shapes(model, n)
    order: list[tuple[str, int, str, tuple[int, ...], Any]] = []
    order += [("sub", k, name, *scratch[name]) for k in range(S) for name in RESET_FIELDS]
    n_reset = len(order)
    order += [("sub", k, name, *scratch[name]) for k in range(S) for name in CREATE_ZEROED]
    n_zero = len(order)
    order += [("q", k, "", (n, model.nq), float) for k in range(S + 1)]
    order += [("qd", k, "", (n, model.nv), float) for k in range(S + 1)]
    order += [("targets", 0, "", (n, model.nu), float), ("impulse", 0, "", (n, S, model.nc), float),
              ("depth", 0, "", (n, S, model.nc), float)]
    skip = set(RESET_FIELDS) | set(CREATE_ZEROED)
    order += [("sub", k, name, shape, dt) for k in range(S) for name, (shape, dt) in scratch.items()
              if name not in skip]
    n_grad = len(order)
    if per_env_physics:
        nb, nv, nu = model.nb, model.nv, model.nu
        order += [("physics", 0, name, shape, dt) for name, shape, dt in (
            ("body_mass", (n, nb), float), ("body_com", (n, nb), wp.vec3), ("body_inertia", (n, nb), wp.mat33),
            ("dof_armature", (n, nv), float), ("dof_damping", (n, nv), float), ("kp", (n, nu), float),
            ("kd", (n, nu), float), ("mu", (n,), float), ("contact_bias", (n, 3), float),
            ("torque_limit", (n, nu), float), ("contact_dropout", (n,), float))]
    fields, offset, marks = [], 0, {}
    for i, (group, index, name, shape, dtype) in enumerate(order):
        for mark, at in (("reset", n_reset), ("zero", n_zero), ("grad", n_grad)):
            if i == at:
                marks[mark] = offset
        nbytes = int(np.prod(shape)) * wp.types.type_size_in_bytes(dtype)
        fields.append(FieldSpec(group, index, name, tuple(shape), dtype, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    marks.setdefault("grad", offset)
    layout = SetLayout(n, per_env_physics, tuple(fields), offset, marks["grad"], marks["reset"], marks["zero"])
    ws.layouts[key] = layout
    return layout


def _buffer(device: str, nbytes: int) -> wp.array:
    """One uninitialised float32 buffer of ``nbytes`` (a multiple of 4)."""
    return wp.empty(nbytes // 4, dtype=float, device=device)


def _flat(buffer: wp.array, nbytes: int) -> wp.array:
    """A float32 view of the first ``nbytes`` of ``buffer`` (for one memset of that region)."""
    return wp.array(ptr=buffer.ptr, dtype=float, shape=(nbytes // 4,), device=buffer.device, capacity=nbytes)


def _views(buffer: wp.array, fields: tuple[FieldSpec, ...]) -> list[wp.array]:
    return [wp.array(ptr=buffer.ptr + f.offset, dtype=f.dtype, shape=f.shape, device=buffer.device,
                     capacity=f.nbytes) for f in fields]


_serial = itertools.count(1)


class GradArrays:
    """The gradients of one control step's differentiable arrays, in one buffer laid out as its :class:`SetLayout`.

    A step's gradients are only needed while its own backward runs (the incoming gradients are copied in, the
    input gradients copied out), so one of these serves every pending step of its shape in turn: zeroed
    (:meth:`zero`, one memset) before each use.
    """

    def __init__(self, layout: SetLayout, device: str):
        self.layout = layout
        self.buffer = _buffer(device, layout.grad_nbytes)
        self.serial = next(_serial)
        """Unique per object (unlike ``id``): keys launches packed for this gradient set."""
        self._all = _flat(self.buffer, layout.grad_nbytes)
        self._views: list[wp.array] | None = None

    @property
    def nbytes(self) -> int:
        return self.layout.grad_nbytes

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    def zero(self) -> None:
        """Zero every gradient (one memset)."""
        self._all.zero_()

    def views(self) -> list[wp.array]:
        """Warp arrays of the gradients, in the order of ``layout.fields`` (the differentiable ones), made once."""
        if self._views is None:
            self._views = _views(self.buffer, self.layout.grad_fields)
        return self._views


class StepArrays:
    """All arrays one control step writes: S + 1 states and S substeps of write-once scratch, in one buffer.

    ``q[0]``, ``qd[0]`` and ``targets`` are the inputs (filled by the caller); ``q[S]``, ``qd[S]`` the outputs;
    ``impulse`` and ``depth`` [N, S, nc] the per-substep normal impulses [N s] and penetrations [m].

    ``requires_grad`` and ``grads``:

    * ``requires_grad=False``: values only (a no-gradient workspace);
    * ``requires_grad=True, grads="own"``: every differentiable array carries its own ``.grad`` (a
      :class:`GradArrays` of the set's own), so that ``wp.Tape`` can record and replay its launches;
    * ``requires_grad=True, grads="pooled"``: values only; the adjoint launches run on a shared
      :class:`GradArrays` (:func:`acquire_grads`), which is what :mod:`bcg.sim.bridge` keeps for pending steps.

    The Warp arrays themselves (``q``, ``qd``, ``targets``, ``impulse``, ``depth``, ``sub``, ``physics``) are views
    into the buffer, made on first access: a set whose launches are relocated from another set's
    (:mod:`bcg.sim.replay`) never needs them.
    """

    def __init__(self, model: SimModel, n: int, requires_grad: bool, per_env_physics: bool = False,
                 grads: str = "own", zero_now: bool = True, ws: ModelWorkspace | None = None):
        if grads not in ("own", "pooled"):
            raise ValueError(f"grads must be 'own' or 'pooled', got {grads!r}")
        self.layout = step_layout(model, n, per_env_physics, ws)
        self.n = n
        self.requires_grad = requires_grad
        self.device = model.device
        self.buffer = _buffer(model.device, self.layout.nbytes)
        self._reset = _flat(self.buffer, self.layout.reset_nbytes)
        self._zero_pending = True
        if zero_now:
            self.zero_pending()
        self.own_grads: GradArrays | None = None
        if requires_grad and grads == "own":
            self.own_grads = GradArrays(self.layout, model.device)
            self.own_grads.zero()
        self._arrays: dict | None = None

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    @property
    def per_env_physics(self) -> bool:
        return self.layout.per_env_physics

    def _materialize(self) -> dict:
        if self._arrays is None:
            fields = self.layout.fields
            views = _views(self.buffer, fields)
            if self.own_grads is not None:
                for v, g in zip(views, self.own_grads.views()):
                    v.grad = g
            S = len([f for f in fields if f.group == "q"]) - 1
            out: dict = dict(q=[None] * (S + 1), qd=[None] * (S + 1), sub=[{} for _ in range(S)], physics={})
            for f, v in zip(fields, views, strict=True):
                if f.group in ("q", "qd"):
                    out[f.group][f.index] = v
                elif f.group == "sub":
                    out["sub"][f.index][f.name] = v
                elif f.group == "physics":
                    out["physics"][f.name] = v
                else:
                    out[f.group] = v
            out["all"] = views
            self._arrays = out
        return self._arrays

    @property
    def q(self) -> list[wp.array]:
        return self._materialize()["q"]

    @property
    def qd(self) -> list[wp.array]:
        return self._materialize()["qd"]

    @property
    def targets(self) -> wp.array:
        return self._materialize()["targets"]

    @property
    def impulse(self) -> wp.array:
        return self._materialize()["impulse"]

    @property
    def depth(self) -> wp.array:
        return self._materialize()["depth"]

    @property
    def sub(self) -> list[dict[str, wp.array]]:
        return self._materialize()["sub"]

    @property
    def physics(self) -> dict[str, wp.array] | None:
        """Per-environment physical parameters ([N, ...], no gradients), filled by the caller before each step;
        None: the model's shared parameters."""
        return self._materialize()["physics"] if self.per_env_physics else None

    @property
    def nbytes(self) -> int:
        """Bytes held by the set: its values, and its own gradients if it has them (not a pooled
        :class:`GradArrays`)."""
        return self.layout.nbytes + (self.own_grads.nbytes if self.own_grads is not None else 0)

    def all_arrays(self) -> list[wp.array]:
        """Every array of the step (states, inputs, per-substep scratch; the physics last)."""
        return list(self._materialize()["all"])

    def attach_grads(self, grads: GradArrays | None) -> None:
        """Make ``grads`` the ``.grad`` of every differentiable view (None: detach them), for recording adjoint
        launches whose arguments are exactly what ``wp.Tape`` would pass (Warp's array-store adjoint zeroes the
        gradient it consumed only when it is the array's own ``.grad``)."""
        views = self._materialize()["all"]
        gviews = grads.views() if grads is not None else [None] * len(views)
        for v, g in zip(views, gviews):
            v.grad = g

    def zero_pending(self) -> None:
        """Zero what a new set needs zeroed (:data:`RESET_FIELDS`, :data:`CREATE_ZEROED`), once. A set made with
        ``zero_now=False`` must have this called before its launches run: the step's block threads call it, so
        that the first touch of a new set's pages (a page fault each, 2-3 us) is spread over the cores instead of
        being taken by the calling thread while the blocks wait."""
        if self._zero_pending:
            _flat(self.buffer, self.layout.zero_nbytes).zero_()
            self._zero_pending = False

    def reset_for_reuse(self) -> None:
        """Re-zero the partially written scratch (one memset; with own gradients, every gradient too) so that the
        arrays can serve another step."""
        self._reset.zero_()
        if self.own_grads is not None:
            self.own_grads.zero()


def acquire_grads(model: SimModel, layout: SetLayout, ws: ModelWorkspace | None = None) -> GradArrays:
    """An idle gradient set of ``layout``'s shape (created when none is idle); zero it before use."""
    idle = _workspace(model, ws).grad_sets.get((layout.n, layout.per_env_physics))
    if idle:
        return idle.pop()
    return GradArrays(layout, model.device)


def release_grads(model: SimModel, grads: GradArrays, ws: ModelWorkspace | None = None) -> None:
    """Hand a gradient set back once the backward that used it has copied its input gradients out."""
    _workspace(model, ws).grad_sets.setdefault((grads.layout.n, grads.layout.per_env_physics), []).append(grads)


def allocate_step(model: SimModel, n: int, requires_grad: bool, per_env_physics: bool = False,
                  ws: ModelWorkspace | None = None) -> StepArrays:
    """Arrays for one step: with gradients, a set of its own (from the pool of released sets when possible; its
    gradients pooled, see :func:`acquire_grads`); without, one cached set that every call reuses."""
    ws = _workspace(model, ws)
    if requires_grad:
        arrs = ws.take_released(n, per_env_physics)
        if arrs is not None:
            arrs.reset_for_reuse()
            return arrs
        return StepArrays(model, n, True, per_env_physics, grads="pooled", ws=ws)
    key = (n, per_env_physics)
    arrs = ws.workspaces.get(key)
    if arrs is None:
        arrs = ws.workspaces[key] = StepArrays(model, n, False, per_env_physics, ws=ws)
    else:
        arrs.reset_for_reuse()
    return arrs


class Launch(NamedTuple):
    """One kernel launch: the kernel and its argument lists (inputs, then outputs)."""

    kernel: Any
    inputs: list
    outputs: list


def substep_launches(model: SimModel, arrs: StepArrays, k: int, terms_only: bool = False,
                     ws: ModelWorkspace | None = None) -> list[Launch]:
    """The eight launches of substep ``k``: reads q[k], qd[k], targets; writes q[k + 1], qd[k + 1].

    ``terms_only``: just the first three, set up so that H is the mass matrix with armature and tau = -bias
    (no damping, no actuation, dt = 0).
    """
    m = model_arrays(model, ws)
    p = model.params
    s = arrs.sub[k]
    q, qd = arrs.q[k], arrs.qd[k]
    ph = arrs.physics or dict(body_mass=m.body_mass, body_com=m.body_com, body_inertia=m.body_inertia,
                              dof_armature=m.dof_armature, dof_damping=m.dof_damping, kp=m.kp, kd=m.kd, mu=m.mu,
                              contact_bias=m.contact_bias, torque_limit=m.torque_limit,
                              contact_dropout=m.contact_dropout)
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
                m.dof_no_limit if terms_only else m.dof_limited, m.dof_range, ph["kp"], ph["kd"], ph["torque_limit"],
                m.actuator_speed, p.limit_kappa, p.limit_impedance, p.limit_beta, 0.0 if terms_only else p.dt,
                1.0 if p.pd_lookahead else 0.0, s["S"], s["IC_O"], s["IC_h"], s["IC_m"], s["F_sub"]],
               [s["H"], s["tau"]]),
        Launch(K.factor_free, [qd, s["H"], s["tau"], m.dof_ancestors, m.dof_ancestor_count, m.dof_subtree_end, p.dt],
               [s["L"], s["L_tmp"], s["y"], s["y_tmp"], s["x"], s["x_tmp"], s["v_free"]]),
        Launch(K.contact_setup,
               [q, s["X_w"], s["S"], m.sphere_body, m.sphere_pos, m.sphere_radius, m.sphere_foot, m.foot_body,
                m.body_last_dof, m.foot_shared, m.dof_ancestors, m.dof_ancestor_count, s["L"], s["v_free"], qd,
                p.kappa, ph["contact_bias"], ph["contact_dropout"], p.dropout_depth, k, p.dt],
               [s["J_foot"], s["foot_twist"], s["foot_twist0"], s["Y"], s["Y_tmp"], s["Lam"], s["G"], s["P"], s["A"],
                s["w"],
                s["s_act"], s["depth"], s["A_foot"], s["s_norm"]]),
        Launch(K.pgs, [s["A"], s["w"], s["s_act"], s["s_norm"], s["depth"], ph["mu"], p.iterations, k],
               [s["lam"], s["residual"], arrs.impulse, arrs.depth]),
        Launch(K.apply_contact,
               [s["v_free"], s["Y"], s["G"], s["L"], s["lam"], m.sphere_foot, m.dof_ancestors,
                m.dof_ancestor_count, p.iterations],
               [s["foot_impulse"], s["z"], s["dv_tmp"], s["dv"], s["v_contact"]]),
        Launch(K.limit_guard_integrate,
               [q, s["L"], s["v_contact"], m.limit_dof, m.num_limited, m.dof_range, m.dof_ancestors,
                m.dof_ancestor_count, p.limit_guard_window, p.limit_guard_width, p.limit_guard_iterations, p.dt],
               [s["lim_sign"], s["excess"], s["gate"], s["Yl"], s["Dl"], s["lam_l"], s["residual_l"], s["z_l"],
                s["dv_l"], s["guard_on"], arrs.q[k + 1], arrs.qd[k + 1]]),
    ]
    return launches[:3] if terms_only else launches


def release_step(model: SimModel, arrs: StepArrays, ws: ModelWorkspace | None = None) -> None:
    """Give a gradient step's arrays back once its backward has run and nothing refers to them any more."""
    _workspace(model, ws).release(arrs, POOL_LIMIT_BYTES)


def run_dynamics_terms(model: SimModel, arrs: StepArrays, ws: ModelWorkspace | None = None
                       ) -> tuple[wp.array, wp.array]:
    """Mass matrix (armature included, depth-indexed [N, nv, D]: :meth:`SimModel.tree_pairs`) and bias forces at
    (q[0], qd[0]) of ``arrs``: returns (H, -bias)."""
    for launch in substep_launches(model, arrs, 0, terms_only=True, ws=ws):
        wp.launch(launch.kernel, dim=arrs.n, inputs=launch.inputs, outputs=launch.outputs, device=model.device)
    return arrs.sub[0]["H"], arrs.sub[0]["tau"]
