"""OpenMP's waiting policy for torch's threads, set before torch loads its OpenMP runtime.

The critic fit and PPO's update use every core where their products are large (``bcg.agents.threads``). With
OpenMP's default policy a thread that waits at a barrier spins; when another process shares the cores, the spinning
thread takes the time slice of the one it waits for. Measured on the 2-core machine with a second training run and
two test jobs running (load average 6): one critic step (512 rows, 3 critics of 256-256 on 849 inputs) took 730-800
ms with two spinning threads, 93-98 ms with two passive threads and 100-102 ms with one thread. A passive thread
sleeps while it waits, so two threads never cost much more than one; but waking it costs more than a second thread
gains on this machine, so with passive waits the dense updates keep one thread (:mod:`bcg.agents.threads`).
"""

from __future__ import annotations

import os
import sys

__all__ = ["prefer_passive_openmp_wait"]


def prefer_passive_openmp_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a policy or torch is already imported (OpenMP reads the
    variable once, when torch loads it). Returns whether the variable is now PASSIVE for this process's OpenMP."""
    if "torch" in sys.modules:
        return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE"
