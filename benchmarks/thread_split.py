"""How well the thread split of ``bcg.sim.step`` divides the work, measured in CPU time (robust to a busy machine).

Wall-clock ratios of 2 threads over 1 need two free cores. CPU time does not: for rollouts with 1 and with 2 threads
this script records the CPU time each block thread spends on its blocks (``time.thread_time`` around the block
functions of :mod:`bcg.sim.bridge`: copies in and out, memsets, launches) and the CPU time of the whole process.
With two free cores the 2-thread wall time would be about ``serial + max(block)``, where ``serial`` is the process
CPU time not spent in the blocks (the calling thread's checks, allocation of the outputs, packing, pool bookkeeping
and torch autograd work), so the estimated speedup is ``cpu(1 thread) / (serial(2 threads) + max block(2
threads))``. The blocks' CPU time together against the one block of 1 thread shows whether splitting makes the
kernels themselves slower (smaller launches, shared caches).

    python benchmarks/thread_split.py [--n 64] [--steps 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict

import torch


def measure(model, n: int, steps: int, grad: bool, threads: int) -> tuple[float, float, dict[str, float]]:
    """(process CPU seconds, wall seconds, CPU seconds per block thread) of one rollout."""
    import bcg.sim.bridge as bridge
    from bcg.evaluation.sim_throughput import rollout_time

    per_thread: dict[str, float] = defaultdict(float)
    lock = threading.Lock()
    originals = {name: getattr(bridge, name) for name in ("_forward_block", "_backward_block")}

    def timed(fn):
        def run(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    per_thread[threading.current_thread().name] += time.thread_time() - t0
        return run

    try:
        for name, fn in originals.items():
            setattr(bridge, name, timed(fn))
        c0, w0 = time.process_time(), time.perf_counter()
        rollout_time(model, n, steps, grad, threads=threads)
        return time.process_time() - c0, time.perf_counter() - w0, dict(per_thread)
    finally:
        for name, fn in originals.items():
            setattr(bridge, name, fn)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="the run with the least process CPU time is kept")
    args = p.parse_args()
    torch.set_num_threads(1)
    from bcg.sim import load_model

    model = load_model()
    for grad in (False, True):
        for threads in (1, 2):
            measure(model, args.n, args.steps, grad, threads)  # warm the pool and the packed launches
        best = {t: min((measure(model, args.n, args.steps, grad, t) for _ in range(args.repeats)),
                       key=lambda r: r[0]) for t in (1, 2)}
        cpu1 = best[1][0]
        cpu2, wall2, blocks = best[2]
        serial = cpu2 - sum(blocks.values())
        estimate = cpu1 / (serial + max(blocks.values()))
        one_block = sum(best[1][2].values())
        print(f"{'forward + backward' if grad else 'forward'} N = {args.n}: CPU 1 thread {cpu1:.3f} s (block "
              f"{one_block:.3f} s); 2 threads: "
              f"blocks {', '.join(f'{v:.3f}' for v in blocks.values())} s, serial {serial:.3f} s, wall {wall2:.3f} s "
              f"-> estimated 2 / 1 speedup on two free cores {estimate:.2f}", flush=True)


if __name__ == "__main__":
    main()
