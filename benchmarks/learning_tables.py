"""The learning-loop tables of docs/learning_throughput.md and docs/shac.md, regenerated from the kept runs.

``benchmarks/results/learning_loop/`` holds the ``metrics.csv`` and ``config.json`` of every training run those
tables quote (the checkpoints are left out for size), the whole-clip evaluations (``eval_jump.json``) and the
``bcg bench --learning --json`` outputs. This script prints:

* the earlier loop against this one (same preset and seed): critic loss per block of iterations;
* the cpu-small variants at the same wall time: the last three evaluations' mean;
* the reset-gradient fix, two seeds: evaluation means per block of iterations;
* the whole-clip evaluations;
* the benchmark tables (``bcg.evaluation.learning_throughput.table``).

    python benchmarks/learning_tables.py [--dir benchmarks/results/learning_loop]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from bcg.evaluation.learning_throughput import table


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _num(row: dict[str, str], key: str) -> float:
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return math.nan


def _block_mean(rows: list[dict[str, str]], key: str, lo: int, hi: int) -> float:
    vals = [_num(r, key) for r in rows if lo <= int(r["iteration"]) < hi and not math.isnan(_num(r, key))]
    return sum(vals) / len(vals) if vals else math.nan


def _end(rows: list[dict[str, str]], key: str) -> float:
    evals = [r for r in rows if not math.isnan(_num(r, "eval_tracking_error_cm"))][-3:]
    return sum(_num(r, key) for r in evals) / len(evals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "learning_loop")
    d = ap.parse_args().dir

    before, after = _rows(d / "before-cpusmall-s0"), _rows(d / "after-cpusmall-s0")
    print("## Earlier loop against this one (cpu-small, jump, seed 0): critic loss, before / after")
    for lo, hi in ((10, 50), (50, 100), (100, 200), (200, 300)):
        print(f"iterations {lo}-{hi}: {_block_mean(before, 'critic_loss', lo, hi):.4f} / "
              f"{_block_mean(after, 'critic_loss', lo, hi):.4f}")
    # the window's statistics are now averaged over all N E rows at once: equal up to float rounding
    rel = max(abs(_num(a, "reward") - _num(b, "reward")) / abs(_num(a, "reward"))
              for a, b in zip(before[:200], after[:200], strict=True))
    evals = all(a["eval_tracking_error_cm"] == b["eval_tracking_error_cm"]
                for a, b in zip(before[:200], after[:200], strict=True))
    print(f"the 200 warm-up iterations: rewards equal to {rel:.1e} (relative), evaluations identical: {evals}")

    print("\n## cpu-small variants, 720 s each (mean of the last three evaluations)")
    print("| run | iterations | samples | E_track [cm] | fall rate | mean episode [s] |\n|---|---|---|---|---|---|")
    for name in ("preset-A-16x16-c16x4", "preset-Y-16x16-c4x2", "preset-X-64x32-c4x4"):
        r = _rows(d / name)
        print(f"| {name} | {r[-1]['iteration']} | {r[-1]['samples']} | {_end(r, 'eval_tracking_error_cm'):.1f} | "
              f"{_end(r, 'eval_fall_rate'):.2f} | {_end(r, 'eval_episode_s'):.2f} |")

    print("\n## The reset-gradient fix (evaluation means per block; before -> after)")
    print("| seed | iterations | fall rate | mean episode [s] | E_track [cm] |\n|---|---|---|---|---|")
    for seed, (a, b) in enumerate((("preset-A-16x16-c16x4", "fix-A-16x16-c16x4"), ("s1-A", "s1-fixA"))):
        ra, rb = _rows(d / a), _rows(d / b)
        for lo, hi in ((100, 200), (300, 400), (400, 451)):
            cells = [f"{_block_mean(ra, k, lo, hi):.2f} -> {_block_mean(rb, k, lo, hi):.2f}"
                     for k in ("eval_fall_rate", "eval_episode_s", "eval_tracking_error_cm")]
            print(f"| {seed} | {lo}-{min(hi, 450)} | " + " | ".join(cells) + " |")

    print("\n## cpu-small critics 128-128 -> 64-128 (evaluation means per block; 450 iterations)")
    print("| seed | iterations | fall rate | mean episode [s] | E_track [cm] | training wall time [s] |")
    print("|---|---|---|---|---|---|")
    for seed in (0, 1):
        ra, rb = _rows(d / f"c128-s{seed}"), _rows(d / f"c64-s{seed}")
        for lo, hi in ((200, 300), (300, 400), (400, 451)):
            cells = [f"{_block_mean(ra, k, lo, hi):.2f} -> {_block_mean(rb, k, lo, hi):.2f}"
                     for k in ("eval_fall_rate", "eval_episode_s", "eval_tracking_error_cm")]
            wall = f"{_num(ra[-1], 'wall_time_s'):.0f} -> {_num(rb[-1], 'wall_time_s'):.0f}" if hi > 450 else ""
            print(f"| {seed} | {lo}-{min(hi, 450)} | " + " | ".join(cells) + f" | {wall} |")

    print("\n## Whole clip (bcg evaluate RUN)")
    print("| run | simulator | falls | mean episode [s] | E_track [cm] |\n|---|---|---|---|---|")
    for name in ("preset-A-16x16-c16x4", "fix-A-16x16-c16x4"):
        ev = json.loads((d / name / "eval_jump.json").read_text())
        for sim in ("bcg", "mujoco"):
            m = ev[sim]
            print(f"| {name} | {sim} | {m['falls']} of {m['episodes']} | {m['mean_episode_seconds']:.1f} | "
                  f"{m['e_track_cm']:.1f} |")

    for bench in sorted(d.glob("bench*.json")):
        print(f"\n## {bench.name}\n")
        print(table(json.loads(bench.read_text())))


if __name__ == "__main__":
    main()
