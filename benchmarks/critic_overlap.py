"""The critic fit beside the actor update: SHAC iterations with ``--overlap-critic-fit`` against the serial order.

Two agents built from ``bcg train``'s defaults (the same seed, one with the fit on a second thread while the actor's
backward pass through the simulator and the ADD update run) train side by side, one iteration each in turn, so both
see the same machine load. Printed per method: the median seconds of an iteration of each, their ratio (overlapped /
serial; below 1 is faster), and whether every metric of every iteration was the same number in both (it must be:
the overlap changes the order in time, not the arithmetic; the overlapped agent reports a window's critic fit with
the next iteration, so its critic columns are compared one iteration later).

    python benchmarks/critic_overlap.py                          # jump, bptt and bcg, 12 timed iterations each
    python benchmarks/critic_overlap.py --methods bcg --iterations 30 --motion run
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time

import torch

CRITIC_COLUMNS = ("critic_loss", "critic_loss_new", "critic_grad_norm", "skipped_critic_updates", "skipped_updates")


def _same(a: dict[str, float], b: dict[str, float], keys: list[str]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in ((float(a[k]), float(b[k])) for k in keys))


def measure(method: str, motion: str, iterations: int, warmup: int, seed: int) -> dict[str, float | bool]:
    """Median iteration seconds of the serial and the overlapped agent, alternating, and whether they agreed."""
    from bcg.agents.train import build_agent, parse_train_args

    cfg = parse_train_args(["--motion", motion, "--estimator", method, "--seed", str(seed), "--no-progress"])
    serial = build_agent(dataclasses.replace(cfg, overlap_critic_fit=False))
    overlapped = build_agent(dataclasses.replace(cfg, overlap_critic_fit=True))
    times: dict[str, list[float]] = {"serial": [], "overlapped": []}
    same, before = True, None
    for i in range(warmup + iterations):
        metrics = {}
        for name, agent in (("serial", serial), ("overlapped", overlapped)):
            t0 = time.perf_counter()
            metrics[name] = agent.train_iteration()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
        rest = [k for k in metrics["serial"] if k not in CRITIC_COLUMNS]
        same &= metrics["serial"].keys() == metrics["overlapped"].keys()
        same &= _same(metrics["serial"], metrics["overlapped"], rest)
        if before is not None:  # the window before's fit
            same &= _same(before, metrics["overlapped"], list(CRITIC_COLUMNS[:3]))
        before = metrics["serial"]
    s, o = statistics.median(times["serial"]), statistics.median(times["overlapped"])
    return {"serial_s": s, "overlapped_s": o, "ratio": o / s, "identical": same,
            "trigger_rate": float(metrics["serial"].get("trigger_rate", 0.0))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["bptt", "bcg"])
    ap.add_argument("--motion", default="jump")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # bcg train's default (--torch-threads 1)
    print("| method | serial [s / iteration] | overlapped [s / iteration] | overlapped / serial | same numbers |")
    print("|---|---|---|---|---|")
    for method in args.methods:
        r = measure(method, args.motion, args.iterations, args.warmup, args.seed)
        print(f"| {method} | {r['serial_s']:.3f} | {r['overlapped_s']:.3f} | {r['ratio']:.2f} | "
              f"{'yes' if r['identical'] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
