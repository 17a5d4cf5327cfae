"""The critic fit beside the actor update: SHAC iterations with ``--overlap-critic-fit`` against the serial order.

Two agents built from ``bcg train``'s defaults (the same seed, one with the fit on a second thread while the actor's
backward pass through the simulator, the ADD update and the next window's steps run) train side by side, in turns
of a few consecutive iterations each, so both see the same machine load; a turn ends by joining the fit still
running (its time counts to the turn), so the overlapped fit never runs on during the other agent's turn. Printed
per method: the median seconds of an iteration of each, their ratio (overlapped / serial; below 1 is faster), and
whether every metric of every iteration was the same number in both (it must be: the overlap changes the order in
time, not the arithmetic; the overlapped agent reports a window's critic fit with the next iteration, so its critic
columns are compared one iteration later).

    python benchmarks/critic_overlap.py                          # jump, bptt and bcg, 6 timed turns of 4 iterations
    python benchmarks/critic_overlap.py --methods bcg --iterations 10 --motion run
    python benchmarks/critic_overlap.py --preset paper --methods bptt --iterations 2 --block 3
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


def measure(method: str, motion: str, iterations: int, warmup: int, seed: int,
            preset: str | None = None, block: int = 4) -> dict[str, float | bool]:
    """Median seconds per iteration of the serial and the overlapped agent, over alternating blocks of ``block``
    iterations (``warmup`` blocks first, then ``iterations`` timed ones), and whether they agreed."""
    from bcg.agents.train import build_agent, parse_train_args

    cfg = parse_train_args(["--motion", motion, "--estimator", method, "--seed", str(seed), "--no-progress",
                            *(["--preset", preset] if preset else [])])
    serial = build_agent(dataclasses.replace(cfg, overlap_critic_fit=False))
    overlapped = build_agent(dataclasses.replace(cfg, overlap_critic_fit=True))
    times: dict[str, list[float]] = {"serial": [], "overlapped": []}
    rows: dict[str, list[dict[str, float]]] = {"serial": [], "overlapped": []}
    # blocks of consecutive iterations per agent, each ended by joining the fit still running (counted to the
    # block): an overlapped fit must not run on during the other agent's turn
    for b in range(warmup + iterations):
        for name, agent in (("serial", serial), ("overlapped", overlapped)):
            t0 = time.perf_counter()
            for _ in range(block):
                rows[name].append(agent.train_iteration())
            agent.sync()
            if b >= warmup:
                times[name].append((time.perf_counter() - t0) / block)
    same = True
    for i, (m_s, m_o) in enumerate(zip(rows["serial"], rows["overlapped"], strict=True)):
        rest = [k for k in m_s if k not in CRITIC_COLUMNS]
        same &= m_s.keys() == m_o.keys() and _same(m_s, m_o, rest)
        if i:  # the overlapped agent reports a window's fit with the next iteration
            same &= _same(rows["serial"][i - 1], m_o, list(CRITIC_COLUMNS[:3]))
    s, o = statistics.median(times["serial"]), statistics.median(times["overlapped"])
    return {"serial_s": s, "overlapped_s": o, "ratio": o / s, "identical": same,
            "trigger_rate": float(rows["serial"][-1].get("trigger_rate", 0.0))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["bptt", "bcg"])
    ap.add_argument("--motion", default="jump")
    ap.add_argument("--iterations", type=int, default=6, help="timed turns per agent")
    ap.add_argument("--warmup", type=int, default=1, help="untimed turns first")
    ap.add_argument("--block", type=int, default=4, help="consecutive iterations per turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default=None, help="a bcg train preset (default: bcg train's own)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # bcg train's default (--torch-threads 1)
    print("| method | serial [s / iteration] | overlapped [s / iteration] | overlapped / serial | same numbers |")
    print("|---|---|---|---|---|")
    for method in args.methods:
        r = measure(method, args.motion, args.iterations, args.warmup, args.seed, args.preset, args.block)
        print(f"| {method} | {r['serial_s']:.3f} | {r['overlapped_s']:.3f} | {r['ratio']:.2f} | "
              f"{'yes' if r['identical'] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
