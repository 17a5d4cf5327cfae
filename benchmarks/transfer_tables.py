"""The whole-clip transfer table of docs/shac.md (*Policies in MuJoCo*), regenerated from the kept runs.

``benchmarks/results/stay_up/RUN/`` holds, for every training run the table quotes, its ``config.json``, its
``metrics.csv`` and ``eval_CLIP.json``: the ``metrics.json`` of ``bcg evaluate RUN`` (the default protocol, 8
episodes through the whole clip, in MuJoCo and in our simulator). The checkpoints and policies are left out for size.

    python benchmarks/transfer_tables.py [--dir benchmarks/results/stay_up]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any


def settings(cfg: dict[str, Any]) -> str:
    """The options that set a run apart from the cpu-small defaults, in `bcg train` flag names."""
    est = cfg.get("estimator")
    parts = (["--agent ppo"] if cfg.get("agent") == "ppo"
             else [f"--estimator {est['name'] if isinstance(est, dict) else est}"])
    flags = {"domain_randomization": "--domain-randomization", "adaptive_start": "--adaptive-start"}
    parts += [flag for key, flag in flags.items() if cfg.get(key)]
    for key in ("action_scale_torque", "termination_anchor_height", "termination_gravity_z",
                "termination_end_effector_height", "replay_threshold", "soft_contact_timeconst", "contact_beta"):
        if cfg.get(key) is not None:
            parts.append(f"--{key.replace('_', '-')} {cfg[key]}")
    return " ".join(parts)


def last_row(run: Path) -> dict[str, str]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))[-1]


def table(root: Path) -> str:
    lines = ["| run | clip | settings | iterations | samples | training [s] | MuJoCo: falls of 8, mean episode [s], "
             "E_track [cm] | ours: falls, mean episode, E_track |", "|---|---|---|---|---|---|---|---|"]
    for run in sorted(p for p in root.iterdir() if any(p.glob("eval_*.json"))):
        cfg = json.loads((run / "config.json").read_text())
        evals = sorted(run.glob("eval_*.json"))
        ev = json.loads(evals[0].read_text())
        clip = evals[0].stem.removeprefix("eval_")
        last = last_row(run)
        cols = []
        for sim in ("mujoco", "bcg"):
            m = ev[sim]
            cols.append(f"{m['falls']}, {m['mean_episode_seconds']:.1f}, {m['e_track_cm']:.1f}")
        lines.append(f"| {run.name} | {clip} | {settings(cfg)} | {last['iteration']} | {int(float(last['samples']))} | "
                     f"{float(last['wall_time_s']):.0f} | {cols[0]} | {cols[1]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "stay_up")
    print(table(ap.parse_args().dir))


if __name__ == "__main__":
    main()
