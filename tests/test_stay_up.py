"""A policy that stays up: ten minutes of `bcg train` on the packaged run clip, scored by `bcg evaluate` in MuJoCo.

Slow (about 25 minutes on 2 cores): two 600 s trainings and their evaluations. Before the start-state and termination
layers, every policy fell in all 8 MuJoCo episodes, after about a second; the control (actor learning rate 0, the
same budget) still does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 600
MIN_MEAN_EPISODE_S = 6.0
"""Mean MuJoCo episode the trained policy must reach (the run clip's episodes last at most 9.4 s; measured with two
seeds of 1200 s: 6.1 s after 400 iterations, 9.4 s from 600 on). Measured by this test (2026-12-04, 2 cores with one
other training beside it): trained 634 iterations, MuJoCo 0 of 8 falls, 9.38 s, E_track 37.1 cm (ours: 2 of 8,
9.07 s); the control 692 iterations, 8 of 8 falls after 0.79 s. The margin is for machines that fit fewer
iterations into the 600 s."""


def _train_and_evaluate(out: Path, name: str, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "bcg.cli", "train", "--motion", "run", "--estimator", "bcg", "--max-time-s",
           str(BUDGET_S), "--out", str(out), "--name", name, "--no-progress", "--eval-every", "0", *extra]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3 * BUDGET_S)
    assert p.returncode == 0, p.stderr[-2000:]
    e = subprocess.run([sys.executable, "-m", "bcg.cli", "evaluate", str(out / name), "--no-progress"], cwd=REPO,
                       capture_output=True, text=True, timeout=1200)
    assert e.returncode == 0, e.stderr[-2000:]
    return json.loads((out / name / "eval" / "run" / "metrics.json").read_text())["mujoco"]


@pytest.mark.slow
def test_ten_minutes_of_training_stay_up_in_mujoco_and_a_frozen_policy_does_not(tmp_path):
    trained = _train_and_evaluate(tmp_path, "trained")
    frozen = _train_and_evaluate(tmp_path, "frozen", "--shac.actor-lr", "0", "--shac.lr-schedule", "constant")
    assert trained["mean_episode_seconds"] >= MIN_MEAN_EPISODE_S, trained
    assert trained["falls"] <= 2, trained
    assert frozen["mean_episode_seconds"] < 2.0 and frozen["falls"] == frozen["episodes"], frozen
