"""How :func:`bcg.sim.step` executes a batch: split across CPU threads, and whether its backward recomputes the
forward (checkpointing). The physics and its numbers are the same whatever the options: every environment is one
Warp thread whatever part of the batch it lands in, so a split batch gives the same bits, gradients too.

Options belong to a :class:`bcg.sim.runtime.Runtime`; the process's runtime (what the environments and estimators
step with) reads them once per :func:`bcg.sim.step` call, and they are settable three ways::

    import bcg.sim as sim
    sim.set_execution_options(threads=1)              # from now on
    with sim.execution_options_set(checkpoint=True):  # inside a block (the backward may run after it: the choice
        ...                                           # is recorded per step at its forward)

or the environment variables ``BCG_SIM_THREADS`` (an integer) and ``BCG_SIM_CHECKPOINT`` (``1``), read at import.

Why threads help: Warp's CPU back end runs one launch on one core, but it calls the compiled kernel through ctypes,
which releases the GIL, so launches on disjoint rows from two Python threads run on two cores at once (measured:
a Python counter thread keeps running during a 24 ms launch; ``docs/performance.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "ExecutionOptions",
    "available_cores",
    "options_from_environment",
    "split_rows",
    "thread_count",
]

MAX_THREADS = 16
"""Upper bound on the threads one step uses (the default takes every available core up to this)."""


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ExecutionOptions:
    """Execution strategy of :func:`bcg.sim.step` (not of its physics: results are bit-identical across options)."""

    threads: int | None = None
    """CPU threads a step splits its batch over (contiguous row blocks, one Warp launch sequence each). None: every
    available core (``available_cores()``, at most 16); 1: no split. Ignored on CUDA, where one launch covers the
    batch."""
    min_rows_per_thread: int = 16
    """A batch is split only into blocks of at least this many rows: below it the Python cost of a block's 28
    launches per control step outweighs the core it gains."""
    checkpoint: bool = False
    """Recompute each control step's forward inside its backward: a gradient step then keeps only its inputs
    (q, qd, targets, per-environment physics) instead of the values of every substep's scratch arrays (140 KiB
    per environment and control step; their gradients are pooled, not kept), at the price of running the forward
    twice. Gradients are bit-identical to the stored-forward ones (same kernels on the same inputs)."""

    def __post_init__(self) -> None:
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise ValueError(f"threads must be None or an integer >= 1, got {self.threads!r}")
        if not isinstance(self.min_rows_per_thread, int) or self.min_rows_per_thread < 1:
            raise ValueError(f"min_rows_per_thread must be an integer >= 1, got {self.min_rows_per_thread!r}")


def options_from_environment() -> ExecutionOptions:
    """The options the environment variables ``BCG_SIM_THREADS`` (an integer) and ``BCG_SIM_CHECKPOINT`` (``1``) ask
    for (the defaults where unset)."""
    threads = os.environ.get("BCG_SIM_THREADS")
    ckpt = os.environ.get("BCG_SIM_CHECKPOINT", "0")
    try:
        n = None if threads in (None, "") else int(threads)
    except ValueError:
        raise ValueError(f"BCG_SIM_THREADS must be an integer >= 1, got {threads!r}") from None
    return ExecutionOptions(threads=n, checkpoint=ckpt not in ("", "0", "false", "False"))


def thread_count(options: ExecutionOptions, n: int, device: str) -> int:
    """Threads a step of ``n`` rows on ``device`` runs on under ``options`` (>= 1)."""
    if not device.startswith("cpu") or n <= 0:
        return 1
    want = options.threads if options.threads is not None else min(available_cores(), MAX_THREADS)
    return max(1, min(want, n // options.min_rows_per_thread))


def split_rows(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous row blocks covering ``range(n)``, sizes differing by at most one (largest first)."""
    if parts < 1 or n < parts:
        raise ValueError(f"cannot split {n} rows into {parts} non-empty blocks")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out
