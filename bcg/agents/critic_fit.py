"""SHAC's critic fit (a guarded Adam step, the regression of a window's targets), a worker process to run it in, and
:class:`CriticFitRunner`, which decides where each fit runs and when it is joined.

A fit on a second thread (``SHAC(overlap_critic_fit=True)``, ``bcg train``'s default) shares the interpreter's lock
with the rollout beside it: every torch operation of one lets the other in, and the one waiting gets the lock back
only at the other's next release (or after the switch interval). :class:`ProcessCriticFit` runs the same arithmetic
in a worker process, with an interpreter of its own. The critics' parameters and Adam's moments live in shared
memory, so the worker updates the very tensors the agent saves, copies into its target critics and checkpoints; the
window's observations and targets go through two shared buffers; a pipe carries the learning rate there and the
fit's four numbers back. The worker runs :func:`fit_critics` with the agent's thread count on the same tensors, so
its numbers equal the thread's bit for bit.
"""

from __future__ import annotations

import math
import traceback
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import torch

from bcg.agents.threads import available_cores, torch_threads

__all__ = ["CriticFitRunner", "ProcessCriticFit", "fit_critics", "guarded_step", "regress_values"]

def guarded_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], clip: float, skip_norm: float
                 ) -> tuple[float, bool]:
    """Clip the gradients of ``params`` to norm ``clip`` and step ``opt``, unless their norm before clipping is
    non-finite or above ``skip_norm``: then nothing is applied. Returns (norm before clipping, applied)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    if not math.isfinite(norm) or norm > skip_norm:
        opt.zero_grad(set_to_none=True)
        return norm, False
    if norm + 1e-6 >= clip * (1.0 - 1e-4):
        torch.nn.utils.clip_grads_with_norm_(params, clip, torch.tensor(norm))
    opt.step()
    return norm, True


def regress_values(critics: Any, opt: torch.optim.Optimizer, obs: torch.Tensor, targets: torch.Tensor, passes: int,
                   minibatches: int, step: Any) -> list[float]:
    """Fit ``critics`` (a :class:`~bcg.agents.networks.CriticEnsemble`) to ``targets`` [B] on ``obs`` [B, D]:
    ``passes`` over ``minibatches`` contiguous minibatches, each critic's mean squared error summed over the critics;
    after each backward ``step()`` clips and steps ``opt``. Returns each pass's mean MSE per critic (the first pass
    meets every minibatch before training on it)."""
    size = math.ceil(obs.shape[0] / minibatches)
    losses = []
    for _ in range(passes):
        total = 0.0
        for b in range(minibatches):
            sl = slice(b * size, (b + 1) * size)
            opt.zero_grad(set_to_none=True)
            loss = (critics(obs[sl]) - targets[sl][None]).square().mean(1).sum()
            loss.backward()
            step()
            total += float(loss.detach()) / critics.num_critics
        losses.append(total / minibatches)
    opt.zero_grad(set_to_none=True)
    return losses


def fit_critics(critics: Any, opt: torch.optim.Optimizer, obs: torch.Tensor, targets: torch.Tensor, passes: int,
                minibatches: int, clip: float, skip_norm: float) -> tuple[float, float, float, int]:
    """Regress ``targets`` [R] on ``obs`` [R, D]: ``passes`` over ``minibatches`` contiguous minibatches. Returns (mean
    MSE of the last pass, largest gradient norm, mean MSE of the first pass, steps skipped by the guard)."""
    params = list(critics.parameters())
    max_norm, skipped = 0.0, 0

    def step() -> None:
        nonlocal max_norm, skipped
        norm, applied = guarded_step(opt, params, clip, skip_norm)
        max_norm = max(max_norm, norm) if math.isfinite(norm) else norm
        skipped += not applied

    losses = regress_values(critics, opt, obs, targets, passes, minibatches, step)
    return losses[-1], max_norm, losses[0], skipped


def _init_adam_state(opt: torch.optim.Optimizer) -> None:
    """Create Adam's per-parameter state as its first step would (zero moments, a zero step count), so that it can be
    moved into shared memory before the first fit."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state[p]
            if not state:
                fused_or_capturable = bool(group.get("fused")) or bool(group.get("capturable"))
                state["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if fused_or_capturable
                                 else torch.tensor(0.0, dtype=torch.float32))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _worker(conn: Any, critics: Any, opt: torch.optim.Optimizer, spec: dict[str, Any], obs_buf: torch.Tensor,
            target_buf: torch.Tensor) -> None:
    # critics and opt arrive with their parameters and state in the parent's shared memory (one pickle: the
    # optimiser's parameters are the module's)
    torch.set_num_threads(int(spec["threads"]))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        rows, lr = msg
        try:
            for g in opt.param_groups:
                g["lr"] = lr
            out = fit_critics(critics, opt, obs_buf[:rows], target_buf[:rows], spec["passes"], spec["minibatches"],
                              spec["clip"], spec["skip_norm"])
            conn.send(("ok", out))
        except Exception:  # the agent raises it where it joins the fit
            conn.send(("error", traceback.format_exc()))


def _shutdown(conn: Any, proc: Any) -> None:
    try:
        conn.send(None)
    except (OSError, ValueError):
        pass
    proc.join(timeout=5)
    if proc.is_alive():  # a worker slow to exit (a loaded machine): kill it, and reap it so that it is gone on return
        proc.kill()
        proc.join(timeout=5)


class _Pending:
    """The fit begun last: :meth:`result` waits for the worker's four numbers (raising what it raised)."""

    def __init__(self, owner: ProcessCriticFit) -> None:
        self._owner = owner
        self._value: Any = None

    def result(self) -> tuple[float, float, float, int]:
        if self._value is None:
            try:
                status, payload = self._owner._conn.recv()
            except (EOFError, OSError):
                raise self._owner._ended() from None
            if status != "ok":
                raise RuntimeError(f"the critic fit process failed:\n{payload}")
            self._value = tuple(payload)
        return self._value


class ProcessCriticFit:
    """A worker process that fits ``critics`` with ``opt`` (a fused or plain Adam) on windows of up to ``rows``
    samples of ``obs_dim`` observations. Moves the critics' parameters and Adam's state into shared memory (in place:
    the agent keeps its tensors). ``submit`` hands a window over and returns a handle whose ``result()`` joins it.

    A state loaded into the optimiser later (``load_state_dict``) replaces its state tensors: close this worker and
    make a new one then."""

    def __init__(self, critics: Any, opt: torch.optim.Optimizer, *, rows: int, passes: int, minibatches: int,
                 clip: float, skip_norm: float, threads: int = 1):
        import torch.multiprocessing as mp

        critics.share_memory()
        _init_adam_state(opt)
        for state in opt.state.values():
            for t in state.values():
                if isinstance(t, torch.Tensor):
                    t.share_memory_()
        spec = {"threads": int(threads), "passes": int(passes), "minibatches": int(minibatches), "clip": float(clip),
                "skip_norm": float(skip_norm)}
        self._obs = torch.zeros(int(rows), critics.obs_dim).share_memory_()
        self._targets = torch.zeros(int(rows)).share_memory_()
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child, critics, opt, spec, self._obs, self._targets),
                                 daemon=True, name="bcg-critic-fit")
        self._proc.start()
        child.close()
        self._finalizer = weakref.finalize(self, _shutdown, self._conn, self._proc)

    def submit(self, obs: torch.Tensor, targets: torch.Tensor, lr: float) -> _Pending:
        """Begin the fit on ``obs`` [R, D] and ``targets`` [R] at learning rate ``lr``."""
        rows = int(obs.shape[0])
        self._obs[:rows].copy_(obs)
        self._targets[:rows].copy_(targets)
        try:
            self._conn.send((rows, float(lr)))
        except OSError:  # a broken pipe: the worker is gone
            raise self._ended() from None
        return _Pending(self)

    def _ended(self) -> RuntimeError:
        return RuntimeError(f"the critic fit process ended unexpectedly (exit code {self._proc.exitcode})")

    def close(self) -> None:
        """Stop the worker (waits for it)."""
        self._finalizer()


class CriticFitRunner:
    """Where a critic fit (:func:`fit_critics` of ``critics`` with their Adam ``opt``) runs, and when it is joined:
    at once, here (the serial order), or beside the caller, on a second thread or in a worker process
    (:class:`ProcessCriticFit`, ``worker="process"``), from :meth:`start` until :meth:`join`.

    ``passes``, ``minibatches``, ``clip``, ``skip_norm``: :func:`fit_critics`' arguments; ``threads``: torch threads
    of the fit; ``overlap``: whether a fit may run beside the caller (it does where :meth:`overlapping`). Where no
    worker process may start (a daemonic worker of a process pool, say) the runner warns once and uses the thread."""

    def __init__(self, critics: Any, opt: torch.optim.Optimizer, *, passes: int, minibatches: int, clip: float,
                 skip_norm: float, threads: int, overlap: bool, worker: Literal["thread", "process"] = "thread"):
        if worker not in ("thread", "process"):
            raise ValueError(f"critic_fit_worker must be 'thread' or 'process', got {worker!r}")
        self.critics, self.opt = critics, opt
        self.passes, self.minibatches, self.clip, self.skip_norm = passes, minibatches, clip, skip_norm
        self.threads = int(threads)
        self.overlap = bool(overlap)
        self.worker = worker
        """Where an overlapping fit runs: ``"thread"`` or ``"process"`` (``"thread"`` after a refused process)."""
        self.process: ProcessCriticFit | None = None  # made on first use
        self.thread: ThreadPoolExecutor | None = None  # made on first use
        self._pending: Any = None  # the fit begun last and not joined yet (a Future or a ProcessCriticFit handle)

    def overlapping(self) -> bool:
        """Whether the next fit runs beside the caller: ``overlap``, the fit and the caller use one torch thread each
        (the count is process-wide: two different counts cannot overlap without changing each other's arithmetic),
        and the process may run on two cores or more (one core would only interleave them)."""
        return self.overlap and self.threads == 1 == torch.get_num_threads() and available_cores() >= 2

    def fit(self, obs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float, float, int]:
        """The fit itself, here: :func:`fit_critics` on ``obs`` [R, D] and ``targets`` [R]."""
        return fit_critics(self.critics, self.opt, obs, targets, self.passes, self.minibatches, self.clip,
                           self.skip_norm)

    def start(self, obs: torch.Tensor, targets: torch.Tensor, lr: float) -> bool:
        """Begin a fit on ``obs`` [R, D] and ``targets`` [R] (detached) at learning rate ``lr``, beside the caller
        where :meth:`overlapping`, else now; :meth:`join` completes it. Returns whether it runs beside the caller."""
        for g in self.opt.param_groups:
            g["lr"] = lr
        if not self.overlapping():
            with torch_threads(self.threads):
                self._pending = Future()
                self._pending.set_result(self.fit(obs, targets))
            return False
        if self.worker == "process" and self.process is None:
            self.process = self._start_process(int(obs.shape[0]))
        if self.process is not None:
            self._pending = self.process.submit(obs, targets, lr)
            return True
        if self.thread is None:
            self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcg-critic-fit")
        self._pending = self.thread.submit(self._fit_on_one_thread, obs, targets)
        return True

    def join(self) -> tuple[float, float, float, int] | None:
        """Wait for the fit begun last (raising what it raised): (mean critic MSE of the last pass, largest gradient
        norm, mean critic MSE of the first pass, steps skipped); None when none is pending."""
        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        return pending.result()

    def close(self) -> None:
        """Stop the worker process and the thread, if any (a fit still pending is dropped: :meth:`join` it first);
        the next overlapping fit starts them again, on the optimiser's state at that time."""
        self._pending = None
        if self.process is not None:
            self.process.close()
            self.process = None
        if self.thread is not None:
            self.thread.shutdown(wait=True)
            self.thread = None

    def _fit_on_one_thread(self, obs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float, float, int]:
        # OpenMP's thread count is a per-thread setting: a new thread starts with every core, which would sum in
        # another order than the serial fit
        torch.set_num_threads(1)
        return self.fit(obs, targets)

    def _start_process(self, rows: int) -> ProcessCriticFit | None:
        try:
            return ProcessCriticFit(self.critics, self.opt, rows=rows, passes=self.passes,
                                    minibatches=self.minibatches, clip=self.clip, skip_norm=self.skip_norm,
                                    threads=self.threads)
        except (AssertionError, OSError, RuntimeError) as exc:
            warnings.warn(f"the critic fit cannot run in a worker process here ({exc}); it runs on a second thread",
                          RuntimeWarning, stacklevel=5)
            self.worker = "thread"
            return None
