"""Learning on the CPU: the deterministic policy's tracking error against environment samples and wall-clock for
SHAC+BCG, SHAC (bptt) and PPO on one clip (default jump) with the cpu-small preset, several seeds each, in one run.

Every (method, seed) is one ``bcg train`` run (a subprocess, so that the runs do not share torch state) with the same
wall-clock budget; the script then reads the runs' ``metrics.csv`` and prints

* per method: iterations, samples and wall time reached; E_track and the fall rate of the first evaluation (after
  iteration 1) and of the last two; the per-step training reward of the first and last five iterations;
* the environment samples each method needs to reach the E_track PPO ends with (first evaluation at or below it,
  per seed);

and plots E_track against samples and against wall-clock (``docs/img/learning_cpu.png``).

E_track is the trainer's periodic evaluation (``eval_tracking_error_cm``, every 10 iterations): the policy's mean
action replayed in bcg's simulator on 8 fixed episodes (start phases spread over the clip, +-0.02 rad initial joint
noise, seed 0) of up to 3 s each, so runs compare at the same episodes; the training rollouts' own error mixes the
exploration noise and whatever phases the episodes are in. Samples count every simulated environment step (for
BCG, every branch); evaluation steps are not counted, and neither is evaluation time in the wall-clock.

    python benchmarks/learning_cpu.py                          # 3 methods x 2 seeds x 180 s each (about 20 min)
    python benchmarks/learning_cpu.py --budget-s 60 --seeds 0  # a quick look
    python benchmarks/learning_cpu.py --reuse runs/learning_cpu   # re-plot finished runs
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

METHODS: dict[str, list[str]] = {
    "SHAC+BCG": ["--agent", "shac", "--estimator", "bcg"],
    "SHAC (bptt)": ["--agent", "shac", "--estimator", "bptt"],
    "PPO": ["--agent", "ppo"],
}
"""Method label -> the ``bcg train`` arguments that select it."""

COLORS = {"SHAC+BCG": "C0", "SHAC (bptt)": "C1", "PPO": "C2"}

FAILURES: dict[str, str] = {}
"""Runs that exited with an error in this invocation (name -> last line of their stderr)."""


def _slug(label: str) -> str:
    return label.lower().replace("+", "-").replace(" ", "").replace("(", "-").replace(")", "")


def run_one(label: str, seed: int, out: Path, budget_s: float, motion: str, extra: list[str]) -> Path:
    """One ``bcg train`` run of ``label`` with ``seed`` for ``budget_s`` seconds of training; returns its directory."""
    name = f"{_slug(label)}-s{seed}"
    run_dir = out / name
    if (run_dir / "policy.pt").exists():
        print(f"[learning_cpu] {name}: finished run found, reused", flush=True)
        return run_dir
    cmd = [sys.executable, "-m", "bcg.cli", "train", *METHODS[label], "--motion", motion, "--preset", "cpu-small",
           "--seed", str(seed), "--iterations", "100000", "--max-time-s", str(budget_s), "--out", str(out),
           "--name", name, "--checkpoint-every", "0", "--no-progress", "--torch-threads", "1", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"[learning_cpu] {name}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # keep what it logged: the table says where it stopped
        tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        FAILURES[name] = tail
        print(f"[learning_cpu] {name}: FAILED ({proc.returncode}): {proc.stderr[-3000:]}", flush=True)
    else:
        print(f"[learning_cpu] {name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def read_metrics(run_dir: Path) -> dict[str, list[float]]:
    """Columns of a run's metrics.csv as float lists."""
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows] for k in rows[0]} if rows else {}


def evaluations(m: dict[str, list[float]]) -> dict[str, list[float]]:
    """The rows of a run that carry the periodic evaluation (``bcg train --eval-every``): samples, wall time,
    E_track [cm], fall rate and episode length [s] of the deterministic policy on the fixed episodes."""
    keep = [i for i, e in enumerate(m.get("eval_tracking_error_cm", [])) if not math.isnan(e)]
    cols = ("samples", "wall_time_s", "eval_tracking_error_cm", "eval_fall_rate", "eval_episode_s")
    return {c: [m[c][i] for i in keep] for c in cols}


def final_error(ev: dict[str, list[float]], k: int = 2) -> float:
    """Mean E_track of the last ``k`` evaluations [cm]."""
    e = ev["eval_tracking_error_cm"][-k:]
    return sum(e) / len(e) if e else math.nan


def samples_to_reach(ev: dict[str, list[float]], target: float) -> float:
    """Samples at the first evaluation whose E_track is <= target (NaN if never)."""
    for s, e in zip(ev["samples"], ev["eval_tracking_error_cm"], strict=True):
        if e <= target:
            return s
    return math.nan


def plot(results: dict[str, list[dict[str, list[float]]]], path: Path, target: float, motion: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for label, runs in results.items():
        for j, m in enumerate(runs):
            ev = evaluations(m)
            kw = dict(color=COLORS.get(label), lw=1.2, marker="o", ms=2.5, alpha=0.9 if j == 0 else 0.55,
                      label=label if j == 0 else None)
            axes[0].plot(ev["samples"], ev["eval_tracking_error_cm"], **kw)
            axes[1].plot(ev["wall_time_s"], ev["eval_tracking_error_cm"], **kw)
    for ax in axes:
        if math.isfinite(target):
            ax.axhline(target, color="0.5", lw=0.8, ls="--")
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("environment samples (every simulated step, branches included)")
    axes[1].set_xlabel("training wall-clock [s] (2-core CPU, 1 torch thread, shared)")
    axes[0].set_ylabel("E_track of the deterministic policy [cm]")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{motion} clip, cpu-small: evaluation tracking error (8 fixed episodes of up to 3 s in bcg's "
                 "simulator; dashed: PPO's final)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="seeds of every method")
    ap.add_argument("--budget-s", type=float, default=180.0, help="training wall-clock per run [s]")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), help="methods to run")
    ap.add_argument("--motion", default="jump", help="clip (default jump)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "learning_cpu", help="folder of the runs")
    ap.add_argument("--reuse", type=Path, default=None, help="only read and plot the runs in this folder")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "learning_cpu.png", help="output PNG")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more bcg train arguments for every run")
    args = ap.parse_args(argv)

    out = args.reuse or args.out
    results: dict[str, list[dict[str, list[float]]]] = {}
    for label in args.methods:
        runs = []
        for seed in args.seeds:
            run_dir = out / f"{_slug(label)}-s{seed}"
            if args.reuse is None:
                run_dir = run_one(label, seed, out, args.budget_s, args.motion, args.extra)
            m = read_metrics(run_dir) if (run_dir / "metrics.csv").exists() else {}
            if m:
                runs.append(m)
        results[label] = runs

    ppo = [evaluations(m) for m in results.get("PPO", [])]
    target = sum(final_error(ev) for ev in ppo) / len(ppo) if ppo else math.nan
    print()
    print(f"{args.motion}, cpu-small, {args.budget_s:g} s per run, seeds {args.seeds}; E_track of the deterministic "
          "policy on 8 fixed evaluation episodes (first evaluation, after iteration 1 -> mean of the last two)")
    print(f"{'method':12s} {'iters':>6s} {'samples':>9s} {'wall s':>7s} {'E_track cm':>15s} {'falls':>11s} "
          f"{'reward':>13s}  samples to reach PPO's final {target:.2f} cm (per seed)")
    for label, runs in results.items():
        if not runs:
            continue
        evs = [evaluations(m) for m in runs]

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs)

        it = mean([m["iteration"][-1] for m in runs])
        sm = mean([m["samples"][-1] for m in runs])
        wall = mean([m["wall_time_s"][-1] for m in runs])
        e0 = mean([ev["eval_tracking_error_cm"][0] for ev in evs])
        e1 = mean([final_error(ev) for ev in evs])
        f0 = mean([ev["eval_fall_rate"][0] for ev in evs])
        f1 = mean([mean(ev["eval_fall_rate"][-2:]) for ev in evs])
        r0 = mean([mean(m["reward"][:5]) for m in runs])
        r1 = mean([mean(m["reward"][-5:]) for m in runs])
        reach = [samples_to_reach(ev, target) for ev in evs]
        reach_s = ", ".join("never" if math.isnan(r) else f"{r:.3g}" for r in reach)
        print(f"{label:12s} {it:6.0f} {sm:9.3g} {wall:7.0f} {e0:6.1f} -> {e1:5.1f} {f0:4.2f}->{f1:4.2f} "
              f"{r0:6.3f}->{r1:5.3f}  {reach_s}")
    if ppo:
        ppo_start = sum(ev["eval_tracking_error_cm"][0] for ev in ppo) / len(ppo)
        if target >= ppo_start:
            print(f"  note: PPO ended at {target:.2f} cm, no better than it started ({ppo_start:.2f} cm), so the "
                  "samples-to-reach column says nothing about sample efficiency in this budget")
    for name, why in FAILURES.items():
        print(f"  {name} stopped early with an error: {why}")
    plot(results, args.plot, target, args.motion)
    print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
