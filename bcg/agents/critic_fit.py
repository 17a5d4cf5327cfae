"""SHAC's critic fit (a guarded Adam step, the regression of a window's targets) and a worker process to run it in.

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
import weakref
from typing import Any

import torch

__all__ = ["ProcessCriticFit", "fit_critics", "guarded_step", "regress_values"]

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
    if proc.is_alive():
        proc.kill()


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
