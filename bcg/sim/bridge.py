"""torch-facing functions of the simulator: a differentiable control step and the dynamics terms.

Each :func:`step` call with gradients runs on its own write-once arrays (a value set from a pool, so a rollout
reuses them), and a ``torch.autograd.Function`` replays the adjoints of its launches in its backward pass: the
launches ``wp.Tape`` would record, packed once per array set (the first set of a shape is packed by Warp, the others
relocated from it, :mod:`bcg.sim.replay`). A pending step keeps its values only: its gradients are needed only
while its own backward runs, so they live in a small pool of gradient sets (one per thread block), zeroed before
each use. Without gradients (``torch.no_grad()`` or inputs that do not require grad) the scratch arrays are
reused. :mod:`bcg.sim.execution` chooses how a step runs: its batch split over CPU threads (default: every core),
and checkpointing (the forward recomputed inside the backward, so a step keeps only its inputs). Results are
bit-identical whatever the options.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import warp as wp

from bcg.sim.engine import (
    FieldSpec,
    GradArrays,
    StepArrays,
    acquire_grads,
    allocate_step,
    model_arrays,
    release_grads,
    release_step,
    run_dynamics_terms,
    substep_launches,
)
from bcg.sim.execution import ExecutionOptions, split_rows, thread_count
from bcg.sim.model import MAX_ROOT_POSITION, MAX_SPEED, SimModel
from bcg.sim.physics import Physics, check_physics
from bcg.sim.replay import Relocatable, pack, prepack
from bcg.sim.runtime import ModelWorkspace, Runtime, default_runtime
from bcg.sim.types import ContactReport

__all__ = ["MAX_ROOT_POSITION", "step", "mass_matrix", "bias_forces", "ContactReport"]


def _torch_device(model: SimModel) -> torch.device:
    return torch.device("cuda:0" if model.device == "cuda" else model.device)


# qpos / qvel layout of the floating root (MuJoCo's): position, quaternion w, x, y, z; then the hinges
_ROOT_POS = slice(0, 3)
_ROOT_QUAT = slice(3, 7)


def _check(model: SimModel, name: str, x: torch.Tensor, width: int, n: int | None) -> int:
    """Type, dtype, shape and device of one [N, width] input; returns N. Values are checked by :func:`_check_values`
    (one host synchronisation for all inputs)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (the Warp kernels are single precision), got {x.dtype}; "
                        "use bcg.sim.reference for float64")
    if x.dim() != 2 or x.shape[1] != width or (n is not None and x.shape[0] != n):
        want = f"[{n if n is not None else 'N'}, {width}]"
        raise ValueError(f"{name} must have shape {want}, got {list(x.shape)}")
    if x.device != _torch_device(model):
        raise ValueError(f"{name} is on {x.device} but the model is on {model.device}")
    return x.shape[0]


def _envs(mask: torch.Tensor) -> list[int]:
    """The first (at most 8) environment indices where the [N] bool ``mask`` is set."""
    return mask.nonzero().flatten()[:8].tolist()


def _values_ok(bounds_cache: dict, q: torch.Tensor, qd: torch.Tensor | None, targets: torch.Tensor | None,
               max_speed: bool) -> bool:
    """The common case of :func:`_check_values` in a few torch operations (they are most of the calling thread's
    serial time in a 2-thread step): the column-wise largest |value| of [q | qd | targets] against one bound per
    column (the root position's, the speed's, else the largest float32, which inf and NaN both fail; kept in
    ``bounds_cache``), and the smallest root quaternion norm."""
    parts = [q] + [x for x in (qd, targets) if x is not None]
    key = (tuple(x.shape[1] for x in parts), qd is not None, max_speed, q.device)
    bounds = bounds_cache.get(key)
    if bounds is None:
        big = torch.finfo(torch.float32).max
        b = [torch.full((q.shape[1],), big)]
        b[0][_ROOT_POS] = MAX_ROOT_POSITION
        if qd is not None:
            b.append(torch.full((qd.shape[1],), MAX_SPEED if max_speed else big))
        if targets is not None:
            b.append(torch.full((targets.shape[1],), big))
        bounds = bounds_cache[key] = torch.cat(b).to(q.device)
    largest = torch.cat(parts, 1).abs().amax(0)
    quat = torch.linalg.vector_norm(q[:, _ROOT_QUAT], dim=1).amin()
    return bool((largest <= bounds).all() & (quat >= 1e-6))


def _check_values(rt: Runtime, q: torch.Tensor, qd: torch.Tensor | None, targets: torch.Tensor | None,
                  max_speed: bool) -> None:
    """Raise a ValueError naming the input, the bound and the environments when a value is outside the range the
    kernels handle: NaN / inf anywhere, a root quaternion of (near) zero norm, a root position component beyond
    :data:`MAX_ROOT_POSITION`, and (``max_speed``) a qd entry beyond :data:`bcg.sim.MAX_SPEED`.

    All inputs are [N, width] with N >= 1. The common case (everything valid) costs a single host synchronisation;
    the specific message is only worked out once something is wrong.
    """
    q = q.detach()
    qd = None if qd is None else qd.detach()
    targets = None if targets is None else targets.detach()
    if _values_ok(rt.value_bounds, q, qd, targets, max_speed):
        return
    pos = q[:, _ROOT_POS].abs().amax(1)
    quat_ok = q[:, _ROOT_QUAT].norm(dim=1) >= 1e-6
    for name, x in (("q", q), ("qd", qd), ("targets", targets)):
        if x is not None and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or inf (environments {_envs(~torch.isfinite(x).all(1))})")
    if not bool(quat_ok.all()):
        raise ValueError(f"q has a root quaternion of (near) zero norm (environments {_envs(~quat_ok)})")
    if not bool((pos <= MAX_ROOT_POSITION).all()):
        raise ValueError(f"q has a root position beyond bcg.sim.MAX_ROOT_POSITION = {MAX_ROOT_POSITION:g} m "
                         f"(largest |x|, |y|, |z| = {float(pos.max()):.6g} m, environments "
                         f"{_envs(pos > MAX_ROOT_POSITION)}): float32 has no resolution left for the motion there; "
                         "shift the state towards the origin")
    assert qd is not None and max_speed
    speed = qd.abs().amax(1)
    raise ValueError(f"qd has entries beyond bcg.sim.MAX_SPEED = {MAX_SPEED:g} (m/s or rad/s) (largest |qd| = "
                     f"{float(speed.max()):.6g}, environments {_envs(speed > MAX_SPEED)}): at such speeds the "
                     "explicitly integrated Coriolis and centrifugal forces of a substep diverge")


@contextlib.contextmanager
def _warp_stream(model: SimModel) -> Iterator[None]:
    """Run Warp launches on torch's current CUDA stream so that the two never race."""
    if model.device.startswith("cuda"):
        with wp.ScopedStream(wp.stream_from_torch(_torch_device(model))):
            yield
    else:
        yield


_VEC_FIELDS = {"body_com": wp.vec3, "body_inertia": wp.mat33}


def _load_inputs(arrs: StepArrays, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                 physics: Physics | None = None) -> None:
    for dst, src in ((arrs.q[0], q), (arrs.qd[0], qd), (arrs.targets, targets)):
        wp.copy(dst, wp.from_torch(src.detach().contiguous()))
    if physics is not None:
        for name, dst in arrs.physics.items():
            src = getattr(physics, name).detach().contiguous()
            wp.copy(dst, wp.from_torch(src, dtype=_VEC_FIELDS.get(name, wp.float32)))


def _block_arrays(model: SimModel, ws: ModelWorkspace, index: int, n: int, grad: bool, per_env_physics: bool
                  ) -> tuple[StepArrays, bool]:
    """Arrays of row block ``index`` (``n`` rows) of a step, and whether they are reused (so need
    ``reset_for_reuse()``, which the caller runs in the block's thread). With gradients: a value set of its own
    (its gradients come from a shared :class:`GradArrays` in the backward), from the engine's pool of released
    sets when it has one (what ``allocate_step`` does, minus the reset). Without: a reused workspace per block (two
    equal blocks running at once need two)."""
    model_arrays(model, ws)
    if grad:
        arrs = ws.take_released(n, per_env_physics)
        if arrs is not None:
            return arrs, True
        # zeroed by the block's thread (StepArrays.zero_pending, in _forward): the new pages fault in on every core
        return StepArrays(model, n, requires_grad=True, per_env_physics=per_env_physics, grads="pooled",
                          zero_now=False, ws=ws), False
    key = (index, n, per_env_physics)
    arrs = ws.block_workspaces.get(key)
    if arrs is None:
        arrs = ws.block_workspaces[key] = StepArrays(model, n, requires_grad=False, per_env_physics=per_env_physics,
                                                     ws=ws)
        return arrs, False
    return arrs, True


def _recorded(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, adjoint: bool) -> list:
    """The step's launches recorded (not run) on the views of ``arrs``: forward in order, or (``adjoint``) their
    adjoints in reverse order with the arguments ``wp.Tape`` would pass (each array's ``.grad``)."""
    get_adjoint = wp.Tape().get_adjoint  # Warp's own rule for the adjoint argument of each kernel argument
    cmds = []
    for k in range(model.params.substeps):
        for launch in substep_launches(model, arrs, k, ws=ws):
            kw = dict(dim=arrs.n, inputs=launch.inputs, outputs=launch.outputs, device=model.device, record_cmd=True)
            if adjoint:
                kw.update(adj_inputs=[get_adjoint(a) for a in launch.inputs],
                          adj_outputs=[get_adjoint(a) for a in launch.outputs], adjoint=True)
            cmds.append(wp.launch(launch.kernel, **kw))
    return cmds[::-1] if adjoint else cmds


def _packed(ws: ModelWorkspace, key: tuple, cmds: list, ranges: list[tuple[int, int]]) -> list[Callable[[], None]]:
    """Callables of the recorded ``cmds``, and (when every one packs and relocates) the template ``key`` that the
    next sets of this shape are relocated from instead of recorded."""
    packed = [pack(c) for c in cmds]
    if all(p is not None for p in packed):
        try:
            ws.templates[key] = ([start for start, _ in ranges], Relocatable(packed, ranges))
        except ValueError:  # an argument type the relocation does not know: record every set
            pass
    return [c.launch if p is None else p.call for p, c in zip(packed, cmds, strict=True)]


def _record(model: SimModel, ws: ModelWorkspace, arrs: StepArrays) -> list[Callable[[], None]]:
    """The forward launches of a step's arrays, packed once per array set (pooled and cached sets are reused, so
    this is paid once per set, not per step): the same kernels and arguments ``wp.Tape`` records, without its
    per-launch argument packing. The first set of a shape is recorded and packed; the others are relocated from
    it (:class:`bcg.sim.replay.Relocatable`: a copy of its structs with the pointers moved to their buffer)."""
    cached = getattr(arrs, "bcg_forward", None)
    if cached is not None:
        return cached
    key = ("forward", arrs.n, arrs.per_env_physics)
    template = ws.templates.get(key) if arrs.own_grads is None else None
    if template is not None:
        (base,), reloc = template
        out = reloc.calls([arrs.ptr - base])
    else:
        cmds = _recorded(model, ws, arrs, adjoint=False)
        if arrs.own_grads is None:
            out = _packed(ws, key, cmds, [(arrs.ptr, arrs.layout.nbytes)])
        else:
            out = [prepack(c) for c in cmds]
    arrs.bcg_forward = out
    return out


def _adjoint(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, grads: GradArrays) -> list[Callable[[], None]]:
    """The adjoint launches of a step's value set ``arrs`` with the gradient set ``grads`` (reverse order), packed
    once per (value set, gradient set) pair: the first pair of a shape is recorded with ``grads`` attached as the
    arrays' ``.grad`` (exactly the tape's arguments), the others relocated from it."""
    cache = arrs.__dict__.setdefault("bcg_adjoint", {})
    hit = cache.get(grads.serial)
    if hit is not None:
        return hit
    key = ("adjoint", arrs.n, arrs.per_env_physics)
    template = ws.templates.get(key)
    if template is not None:
        (vbase, gbase), reloc = template
        out = reloc.calls([arrs.ptr - vbase, grads.ptr - gbase])
    else:
        arrs.attach_grads(grads)
        try:
            cmds = _recorded(model, ws, arrs, adjoint=True)
        finally:
            arrs.attach_grads(None)  # the recorded arguments keep the pointers; the views need no gradients
        out = _packed(ws, key, cmds, [(arrs.ptr, arrs.layout.nbytes), (grads.ptr, grads.nbytes)])
    if len(cache) >= 4:  # a set meets only a few gradient sets (one per block and concurrent backward)
        cache.clear()
    cache[grads.serial] = out
    return out


def _field(flat: torch.Tensor, spec: FieldSpec) -> torch.Tensor:
    """The torch view of one array of a set from the torch view of its whole float32 buffer."""
    start = spec.offset // 4
    return flat[start:start + spec.nbytes // 4].view(*spec.shape, *spec.inner_shape)


def _cached_views(arrs: StepArrays | GradArrays, build: Callable[[Any, torch.Tensor, int], dict]) -> dict:
    """``build(layout, flat, S)`` once per array set (kept on the set): ``flat`` is one float32 torch view of the set's
    buffer, ``S`` the index of its last substep state."""
    cached = getattr(arrs, "bcg_views", None)
    if cached is None:
        lay = arrs.layout
        last = sum(1 for f in lay.fields if f.group == "q") - 1
        cached = arrs.bcg_views = build(lay, wp.to_torch(arrs.buffer, requires_grad=False), last)
    return cached


def _views(arrs: StepArrays) -> dict:
    """torch views of the arrays a step reads and writes, made once per array set (slices of one torch view of the
    set's buffer): a ``copy_`` into a view is one torch operation, where ``wp.from_torch`` + ``wp.copy`` (or
    ``wp.to_torch``) build Warp or torch array objects on every step (about 20 us each, in the calling thread,
    serial to the blocks)."""

    def build(lay: Any, flat: torch.Tensor, S: int) -> dict:
        return dict(q0=_field(flat, lay.find("q", 0)), qd0=_field(flat, lay.find("qd", 0)),
                    targets=_field(flat, lay.find("targets")), qS=_field(flat, lay.find("q", S)),
                    qdS=_field(flat, lay.find("qd", S)), impulse=_field(flat, lay.find("impulse")),
                    depth=_field(flat, lay.find("depth")),
                    physics={f.name: _field(flat, f) for f in lay.fields if f.group == "physics"})

    return _cached_views(arrs, build)


def _grad_views(grads: GradArrays) -> dict:
    """torch views of the gradients a backward copies in (of q[S], qd[S], impulse) and out (of q[0], qd[0],
    targets), made once per gradient set."""

    def build(lay: Any, flat: torch.Tensor, S: int) -> dict:
        return dict(g_in=[_field(flat, lay.find(*k)) for k in (("q", S), ("qd", S), ("impulse",))],
                    g_out=[_field(flat, lay.find(*k)) for k in (("q", 0), ("qd", 0), ("targets",))])

    return _cached_views(grads, build)


def _load(arrs: StepArrays, rows: slice, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
          physics: Physics | None) -> None:
    """Copy rows ``rows`` of the step's inputs into a block's arrays (through the cached views; run in the block's
    thread, so the slicing and copies of two blocks overlap)."""
    v = _views(arrs)
    with torch.no_grad():
        v["q0"].copy_(q[rows])
        v["qd0"].copy_(qd[rows])
        v["targets"].copy_(targets[rows])
        if physics is not None:
            for name, dst in v["physics"].items():
                dst.copy_(getattr(physics, name)[rows])


def _forward(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, reset: bool = False) -> None:
    """Run the recorded forward of ``arrs`` (inputs loaded), re-zeroing reused arrays first (``reset``)."""
    if reset:
        arrs.reset_for_reuse()
    arrs.zero_pending()
    for launch in _record(model, ws, arrs):
        launch()


def _backward(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, grads: GradArrays,
              grads_in: list[torch.Tensor]) -> None:
    """Adjoint of the recorded forward of ``arrs`` on the gradient set ``grads`` (zeroed here) for incoming
    gradients ``grads_in`` of (q[S], qd[S], impulse); leaves the gradients of (q[0], qd[0], targets) in ``grads``.
    """
    grads.zero()  # the adjoints accumulate: every gradient starts at 0, then the incoming ones are set
    with torch.no_grad():
        for dst, g in zip(_grad_views(grads)["g_in"], grads_in, strict=True):
            dst.copy_(g)
    for launch in _adjoint(model, ws, arrs, grads):
        launch()


def _input_grads(grads: GradArrays, rows: slice, out: list[torch.Tensor]) -> None:
    """Copy the gradients of (q[0], qd[0], targets) of one block into rows ``rows`` of ``out`` (in the block's
    thread)."""
    with torch.no_grad():
        for dst, g in zip(out, _grad_views(grads)["g_out"], strict=True):
            dst[rows].copy_(g)


def _forward_block(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, reset: bool, rows: slice, inputs: tuple,
                   outs: list[torch.Tensor]) -> None:
    """One row block of a step's forward, in its thread: load rows ``rows`` of ``inputs`` (q, qd, targets,
    physics), run the launches, copy the outputs (q[S], qd[S], impulse, depth) into rows ``rows`` of ``outs``."""
    _load(arrs, rows, *inputs)
    _forward(model, ws, arrs, reset)
    v = _views(arrs)
    with torch.no_grad():
        for out, f in zip(outs, ("qS", "qdS", "impulse", "depth"), strict=True):
            out[rows].copy_(v[f])


def _backward_block(model: SimModel, ws: ModelWorkspace, arrs: StepArrays, grads: GradArrays, rows: slice,
                    grads_in: tuple, out: list[torch.Tensor], inputs: tuple | None, reset: bool) -> None:
    """One row block of a step's backward, in its thread: (checkpointed: ``inputs`` given) re-run the forward,
    then the adjoint for rows ``rows`` of ``grads_in`` (of q[S], qd[S], impulse); the input gradients go to rows
    ``rows`` of ``out``."""
    if inputs is not None:
        _load(arrs, rows, *inputs)
        _forward(model, ws, arrs, reset)
    _backward(model, ws, arrs, grads, [g[rows] for g in grads_in])
    _input_grads(grads, rows, out)


class _WarpControlStep(torch.autograd.Function):
    """One control step over row blocks (threads) of the batch; see :mod:`bcg.sim.execution` for the options."""

    @staticmethod
    def forward(ctx, model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                physics: Physics | None, rt: Runtime, options: ExecutionOptions):
        t0 = time.perf_counter() if rt.timer is not None else 0.0
        grad = any(ctx.needs_input_grad[1:4])
        keep = grad and not options.checkpoint  # stored forward: the arrays live until the backward
        blocks = split_rows(q.shape[0], thread_count(options, q.shape[0], model.device))
        ws = rt.workspace(model)
        taken = [_block_arrays(model, ws, i, b.stop - b.start, keep, physics is not None)
                 for i, b in enumerate(blocks)]
        arrs = [a for a, _ in taken]
        n, S = q.shape[0], model.params.substeps
        outs = [q.new_empty(n, model.nq), q.new_empty(n, model.nv), q.new_empty(n, S, model.nc),
                q.new_empty(n, S, model.nc)]
        for a in arrs:  # packed and viewed in this thread: Warp's lazy module load is not thread-safe (segfault
            _record(model, ws, a)  # seen); the block threads run torch copies, memsets and pre-packed kernel calls
            _views(a)

        with _warp_stream(model):
            rt.parallel([lambda i=i: _forward_block(model, ws, taken[i][0], taken[i][1], blocks[i],
                                                    (q, qd, targets, physics), outs) for i in range(len(blocks))])
        if grad:
            ctx.model, ctx.rt, ctx.ws, ctx.blocks, ctx.done = model, rt, ws, blocks, False
            if keep:
                ctx.arrs = arrs
                ctx.kept = sum(a.nbytes for a in arrs)
            else:  # checkpoint: only the inputs stay (detached copies: the caller may change its tensors)
                ctx.inputs = (q.detach().clone(), qd.detach().clone(), targets.detach().clone(),
                              None if physics is None else Physics(*(t.detach().clone() for t in physics)))
                ctx.arrs = None
                ctx.kept = sum(t.numel() * t.element_size() for t in ctx.inputs[:3])
                ctx.kept += 0 if physics is None else sum(t.numel() * t.element_size() for t in physics)
            rt.keep(ctx.kept)
            # a graph dropped without a backward frees what it kept too: count that as given back
            ctx.release = weakref.finalize(ctx, rt.keep, -ctx.kept)
        ctx.mark_non_differentiable(outs[3])
        if rt.timer is not None:
            rt.timer("forward", time.perf_counter() - t0)
        return tuple(outs)

    @staticmethod
    def backward(ctx, g_q: torch.Tensor, g_qd: torch.Tensor, g_imp: torch.Tensor, _g_depth: torch.Tensor):  # type: ignore[override]
        if getattr(ctx, "done", True):
            raise RuntimeError("bcg.sim.step: backward called twice through the same step (retain_graph is not "
                               "supported by the Warp tape)")
        ctx.done = True
        ctx.release()
        model, rt, ws, blocks = ctx.model, ctx.rt, ctx.ws, ctx.blocks
        t0 = time.perf_counter() if rt.timer is not None else 0.0
        arrs = ctx.arrs
        ctx.arrs = None

        redo = arrs is None  # checkpoint: re-run each block's forward with gradients, then its adjoint
        if redo:  # arrays allocated, loaded and packed in this thread (the pool and Warp's module load are not
            physics = ctx.inputs[3]  # thread-safe); only copies, memsets and launches run in the block threads
            taken = [_block_arrays(model, ws, i, b.stop - b.start, True, physics is not None)
                     for i, b in enumerate(blocks)]
            arrs = [a for a, _ in taken]
            for a in arrs:
                _record(model, ws, a)
        # gradient sets taken, packed and viewed here: the block threads run memsets, tensor copies and kernel
        # calls only
        grads = [acquire_grads(model, a.layout, ws) for a in arrs]
        for a, g in zip(arrs, grads, strict=True):
            _views(a)
            _grad_views(g)
            _adjoint(model, ws, a, g)

        n = g_q.shape[0]
        out = [g_q.new_empty(n, model.nq), g_q.new_empty(n, model.nv), g_q.new_empty(n, model.nu)]

        inputs = ctx.inputs if redo else None
        with _warp_stream(model):
            rt.parallel([lambda i=i: _backward_block(model, ws, arrs[i], grads[i], blocks[i], (g_q, g_qd, g_imp),
                                                     out, inputs, taken[i][1] if redo else False)
                         for i in range(len(blocks))])
        for a, g in zip(arrs, grads, strict=True):  # back to the pools, in this thread
            release_grads(model, g, ws)
            release_step(model, a, ws)
        ctx.inputs = None
        if rt.timer is not None:
            rt.timer("backward", time.perf_counter() - t0)
        return (None, *out, None, None, None)


def step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor, physics: Physics | None = None,
         runtime: Runtime | None = None) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
    """One differentiable control step: ``model.params.substeps`` physics substeps with the PD targets held.

    Args:
        model: from :func:`bcg.sim.load_model`.
        q: qpos [N, nq] float32 (MuJoCo layout, root quaternion w, x, y, z).
        qd: qvel [N, nv] float32 (root linear velocity in the world frame, angular velocity in the body frame).
        targets: PD position targets [N, nu] float32 [rad], in actuator order.
        physics: optional per-environment masses, COMs, inertias, armature, damping, gains and friction
            (:class:`bcg.sim.Physics`, e.g. from domain randomisation); default: the model's shared values.
            No gradients flow to them.
        runtime: whose execution options, thread pool and array pools the step uses (default: the process's,
            :func:`bcg.sim.runtime.default_runtime`).
    Returns:
        ``(q_next [N, nq], qd_next [N, nv], ContactReport)``. Gradients flow to ``q``, ``qd`` and ``targets``
        from ``q_next``, ``qd_next`` and the contact impulses (``impulse``, ``peak_force``); ``penetration``
        carries none. ``N = 0`` gives empty tensors of these shapes (attached to the inputs' graph when they
        require grad) without launching anything.
    Raises:
        TypeError / ValueError at the call for a wrong type, dtype, shape or device, NaN or inf in any input, a root
        quaternion of (near) zero norm, a root position component beyond :data:`MAX_ROOT_POSITION` [m], or a ``qd``
        entry beyond :data:`bcg.sim.MAX_SPEED` (m/s or rad/s). A state inside these bounds can still diverge
        within the step (NaN in the outputs, which callers such as the vector env detect and reset): the bounds
        refuse the states the step cannot handle, they do not certify the others.
    """
    n = _check(model, "q", q, model.nq, None)
    _check(model, "qd", qd, model.nv, n)
    _check(model, "targets", targets, model.nu, n)
    if physics is not None:
        check_physics(model, physics, n, _torch_device(model))
    if n == 0:
        return _empty_step(model, q, qd, targets)
    rt = runtime if runtime is not None else default_runtime()
    _check_values(rt, q, qd, targets, max_speed=True)
    q_next, qd_next, impulses, depth = _WarpControlStep.apply(model, q, qd, targets, physics, rt, rt.options)
    report = ContactReport(
        impulse=impulses.sum(1),
        peak_force=impulses.amax(1) / model.params.dt,
        penetration=depth[:, -1],
    )
    return q_next, qd_next, report


def _empty_step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
    """The result of a step over N = 0 environments, with no launch (Warp launches of dimension 0 return no
    command to replay). The outputs stay attached to the inputs' graph, so a loss built on them backpropagates
    (to empty gradients) exactly as it would for N >= 1."""
    q_next = q.clone()
    qd_next = qd.clone()
    # [0, nc] views of the inputs: differentiable when any input is
    zero = (q[:, :1] + qd[:, :1] + targets[:, :1]).mul(0.0).expand(-1, model.nc)
    report = ContactReport(impulse=zero.clone(), peak_force=zero.clone(), penetration=zero.detach().clone())
    return q_next, qd_next, report


def _dynamics_terms(model: SimModel, rt: Runtime, q: torch.Tensor, qd: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    n = q.shape[0]
    ws = rt.workspace(model)
    arrs = allocate_step(model, n, requires_grad=False, ws=ws)
    targets = torch.zeros(n, model.nu, dtype=torch.float32, device=q.device)
    with _warp_stream(model):
        _load_inputs(arrs, q, qd, targets)
        H, neg_bias = run_dynamics_terms(model, arrs, ws)
        return unpack_tree(model, wp.to_torch(H)), -wp.to_torch(neg_bias).clone()


def unpack_tree(model: SimModel, rows_by_depth: torch.Tensor, symmetric: bool = True) -> torch.Tensor:
    """The dense [N, nv, nv] matrix of a depth-indexed [N, nv, D] one (:meth:`SimModel.tree_pairs`): symmetric
    (H), or lower-triangular in the tree order (its factor L, H = L^T L)."""
    rows, cols, depth = (torch.as_tensor(x, device=rows_by_depth.device) for x in model.tree_pairs())
    values = rows_by_depth[:, rows, depth]
    dense = rows_by_depth.new_zeros(rows_by_depth.shape[0], model.nv, model.nv)
    dense[:, rows, cols] = values
    if symmetric:
        dense[:, cols, rows] = values
    return dense


def mass_matrix(model: SimModel, q: torch.Tensor, runtime: Runtime | None = None) -> torch.Tensor:
    """Joint-space mass matrix [N, nv, nv] with armature (MuJoCo's ``mj_fullM``), from the Warp kernels.

    Args:
        q: qpos [N, nq] float32; the same checks as :func:`step` (finite, root quaternion of non-zero norm, root
            position within :data:`MAX_ROOT_POSITION`). ``N = 0`` gives an empty [0, nv, nv] tensor.
    Not differentiable (use :func:`bcg.sim.reference.mass_matrix` for a differentiable float64 version).
    """
    n = _check(model, "q", q, model.nq, None)
    if n == 0:
        return q.new_zeros(0, model.nv, model.nv)
    rt = runtime if runtime is not None else default_runtime()
    _check_values(rt, q, None, None, max_speed=False)
    return _dynamics_terms(model, rt, q, torch.zeros(n, model.nv, dtype=q.dtype, device=q.device))[0]


def bias_forces(model: SimModel, q: torch.Tensor, qd: torch.Tensor, runtime: Runtime | None = None
                ) -> torch.Tensor:
    """Coriolis, centrifugal and gravity forces [N, nv] (MuJoCo's ``qfrc_bias``), from the Warp kernels.

    Args:
        q: qpos [N, nq] float32, checked as in :func:`step`.
        qd: qvel [N, nv] float32, finite. ``N = 0`` gives an empty [0, nv] tensor.
    :data:`bcg.sim.MAX_SPEED` is not enforced here: it bounds the time integration of :func:`step`, whereas this
    is a single evaluation of c(q, qd), accurate in float32 at any representable speed.
    """
    n = _check(model, "q", q, model.nq, None)
    _check(model, "qd", qd, model.nv, n)
    if n == 0:
        return q.new_zeros(0, model.nv)
    rt = runtime if runtime is not None else default_runtime()
    _check_values(rt, q, qd, None, max_speed=False)
    return _dynamics_terms(model, rt, q, qd)[1]
