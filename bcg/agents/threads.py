"""How many torch threads the dense updates of an agent use (the critic fit), chosen once from the work's size.

The simulator already splits a step over both cores with its own threads (``bcg.sim.execution``), and between two
simulator calls torch runs only small operations, so ``bcg train`` keeps torch at one intra-op thread during the
rollout: a second OpenMP thread there only spins against the simulator's threads. The critic fit is different: it
is dense matrix products and nothing else, so a second thread pays off once the products are large enough to
amortise OpenMP's fork and join.

Whether a second thread pays depends on how OpenMP's threads wait between parallel regions. Measured on the 2-core
machine, the paper preset's whole critic fit (2048 samples, 16 passes x 4 minibatches, 3 critics of 256-256 on 849
inputs), alternating in one process:

| OpenMP waits | machine | 1 thread [s] | 2 threads [s] |
|---|---|---|---|
| spinning (``OMP_WAIT_POLICY=ACTIVE``) | idle | 2.2-2.6 | 1.66-2.05 |
| spinning (``GOMP_SPINCOUNT=100000``) | idle | 2.5-2.8 | 1.66-1.94 |
| spinning (``GOMP_SPINCOUNT=100000``) | one other busy process | 2.66-2.71 | 10.6-13.2 |
| passive (``OMP_WAIT_POLICY=PASSIVE``, bcg's default) | idle | 2.4-3.3 | 3.1-4.2 |

So two threads help only where OpenMP spins and nothing else runs on the cores, and cost 4-5x the moment anything
does (the spinning thread takes the time slice of the one it waits for). ``import bcg`` makes OpenMP wait passively
(:mod:`bcg._openmp`), and with passive waits the rule below keeps one thread. On a machine of your own, start with
``OMP_WAIT_POLICY=ACTIVE`` and the large fits take every core.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["MIN_PARALLEL_WORK", "available_cores", "dense_update_threads", "openmp_spins", "torch_threads",
           "update_threads"]

MIN_PARALLEL_WORK = 1 << 17
"""Rows x first-layer outputs (all critics) of one minibatch from which the critic fit uses every core."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def openmp_spins() -> bool:
    """Whether this process's OpenMP threads spin while they wait (``OMP_WAIT_POLICY=ACTIVE``)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "ACTIVE"


def dense_update_threads(rows: int, first_layer_outputs: int, cores: int | None = None,
                         spinning: bool | None = None) -> int:
    """Torch threads for a fit whose minibatches have ``rows`` samples through a first layer with
    ``first_layer_outputs`` outputs (summed over an ensemble): every available core when OpenMP spins
    (``spinning``, default :func:`openmp_spins`) and ``rows * first_layer_outputs >= MIN_PARALLEL_WORK``, else 1."""
    cores = available_cores() if cores is None else int(cores)
    spinning = openmp_spins() if spinning is None else spinning
    large = int(rows) * int(first_layer_outputs) >= MIN_PARALLEL_WORK
    return max(1, cores) if spinning and large else 1


def update_threads(requested: int | None, rows: int, first_layer_outputs: int) -> int:
    """An agent's ``update_threads`` argument checked (None or an integer >= 1) and resolved: ``requested``, or
    :func:`dense_update_threads` of its fit's minibatch size when None."""
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
        raise ValueError(f"update_threads must be None or an integer >= 1, got {requested!r}")
    return requested if requested is not None else dense_update_threads(rows, first_layer_outputs)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads (None: leave as is), then restore the previous number."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
