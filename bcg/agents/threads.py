"""How many torch threads the dense updates of an agent use (the critic fit), chosen once from the work's size.

The simulator already splits a step over both cores with its own threads (``bcg.sim.execution``), and between two
simulator calls torch runs only small operations, so ``bcg train`` keeps torch at one intra-op thread during the
rollout: a second OpenMP thread there only spins against the simulator's threads. The critic fit is different: it
is dense matrix products and nothing else, so a second thread pays off once the products are large enough to
amortise OpenMP's fork and join.

Measured on the 2-core machine (one critic step: forward, backward, clip, fused Adam; 3 critics on 849 inputs,
float32, quiet machine): 64 rows x 128 wide 3.4 ms with one thread, 2.6-5.0 ms with two; 512 x 256 47.7 ms against
31.6 ms. With another process busy on the machine two threads can be 10x slower (OpenMP's barrier waits for a
descheduled thread), so the rule below stays on one thread unless the products are large.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["MIN_PARALLEL_WORK", "available_cores", "dense_update_threads", "torch_threads"]

MIN_PARALLEL_WORK = 1 << 17
"""Rows x first-layer outputs (all critics) of one minibatch from which the critic fit uses every core."""


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def dense_update_threads(rows: int, first_layer_outputs: int, cores: int | None = None) -> int:
    """Torch threads for a fit whose minibatches have ``rows`` samples through a first layer with
    ``first_layer_outputs`` outputs (summed over an ensemble): every available core when ``rows *
    first_layer_outputs >= MIN_PARALLEL_WORK``, else 1."""
    cores = available_cores() if cores is None else int(cores)
    return max(1, cores) if int(rows) * int(first_layer_outputs) >= MIN_PARALLEL_WORK else 1


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
