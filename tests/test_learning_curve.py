"""`bcg curve`: every checkpoint of a run scored in MuJoCo and our simulator, cached, tabulated and plotted."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

TINY = ["--shac.num-envs", "2", "--shac.horizon", "4", "--shac.critic-minibatches", "2", "--shac.actor-hidden", "16",
        "--shac.critic-hidden", "16", "--shac.critic-iterations", "2", "--estimator", "bptt", "--no-progress",
        "--eval-every", "0", "--motion", "jump"]
QUICK = ["--phases", "1", "--seeds", "0", "--seconds", "0.1", "--no-progress"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from bcg.agents.train import parse_train_args, train

    out = tmp_path_factory.mktemp("curve")
    train(parse_train_args([*TINY, "--iterations", "3", "--checkpoint-every", "1", "--out", str(out), "--name", "r"]))
    return out / "r"


def test_each_checkpoint_is_scored_with_its_training_progress(run_dir, capsys):
    from bcg.cli import main
    from bcg.evaluation.learning_curve import read_curve
    from bcg.evaluation.mujoco_transfer import TransferOptions

    assert main(["curve", str(run_dir), *QUICK]) == 0
    out = capsys.readouterr().out
    folder = next((run_dir / "eval").glob("curve-jump-*"))
    points = read_curve(folder / "curve.csv")
    assert [p.iteration for p in points] == [1, 2, 3]
    metrics = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert [p.samples for p in points] == [int(float(row[1])) for row in metrics]  # 2 envs x 4 steps per iteration
    assert [p.samples for p in points] == [8, 16, 24]
    for p in points:
        assert p.mujoco_episodes == p.bcg_episodes == 1
        assert 0 < p.mujoco_mean_episode_s <= 0.1 + 1e-9 and np.isfinite(p.mujoco_e_track_cm)
    assert (folder / "curve.png").stat().st_size > 10_000
    assert "wrote" in out and "curve.csv" in out
    # the cached report of a checkpoint is what `bcg evaluate` gives for the policy it exports
    cached = json.loads((folder / "iter_000003.json").read_text())
    options = dataclasses.asdict(TransferOptions(phases=1, seeds=(0,), seconds=0.1))
    assert cached["options"] == json.loads(json.dumps(options))


def test_a_second_call_reuses_the_scored_checkpoints(run_dir, monkeypatch):
    from bcg.evaluation import learning_curve as lc
    from bcg.evaluation.mujoco_transfer import TransferOptions

    options = TransferOptions(phases=1, seeds=(0,), seconds=0.1)
    lc.learning_curve(run_dir, options, every=2, progress=False)  # 1 and the last, 3 (cached by the test above or now)
    calls = []
    real = lc.checkpoint_report
    monkeypatch.setattr(lc, "checkpoint_report", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    folder = lc.curve_dir(run_dir, "jump", options)
    (folder / "iter_000002.json").unlink(missing_ok=True)
    points, _ = lc.learning_curve(run_dir, options, every=1, progress=False)
    assert [p.iteration for p in points] == [1, 2, 3]
    assert [c.name for c in calls] == ["iter_000002.pt"]  # only the checkpoint without a cached report is replayed


def test_the_last_checkpoint_is_always_scored(run_dir):
    from bcg.evaluation import learning_curve as lc
    from bcg.evaluation.mujoco_transfer import TransferOptions

    points, _ = lc.learning_curve(run_dir, TransferOptions(phases=1, seeds=(0,), seconds=0.1), every=5,
                                  progress=False)
    assert [p.iteration for p in points] == [1, 3]


def test_curve_errors_are_messages(tmp_path, capsys):
    from bcg.cli import main

    assert main(["curve", str(tmp_path / "nothing")]) == 2
    assert "has no checkpoints/ folder" in capsys.readouterr().err
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    assert main(["curve", str(tmp_path / "empty")]) == 2
    assert "holds no checkpoint yet" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["curve", str(tmp_path / "empty"), "--every", "0"])
    assert "every must be an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["curve", str(tmp_path / "empty"), "--every", "2", "--log-points", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bcg curve: error: --every 2 and --log-points 10 both choose the checkpoints; give one"]
    # the replay protocol's own checks (an option group shared with bcg evaluate) are one line too
    with pytest.raises(SystemExit):
        main(["curve", str(tmp_path / "empty"), "--seeds", "-1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bcg curve: error: seeds must be one or more integers >= 0, got (-1,)"]


def test_log_spaced_checkpoints_have_a_constant_relative_resolution():
    """--log-points: the first and last checkpoints, the rest nearest to iterations spaced evenly in their logarithm,
    so that consecutive scored iterations differ by about the same factor; --every keeps its stride."""
    from bcg.evaluation import learning_curve as lc

    ckpts = [(it, Path(f"iter_{it:06d}.pt")) for it in range(50, 20_001, 50)]  # 400 checkpoints
    chosen = [it for it, _ in lc.choose_checkpoints(ckpts, log_points=30)]
    assert chosen[0] == 50 and chosen[-1] == 20_000 and chosen == sorted(set(chosen))
    assert len(chosen) == 26  # the first targets fall on the same early checkpoints (50, 100, ...)
    ratios = [b / a for a, b in zip(chosen, chosen[1:], strict=False)]
    assert max(r for a, r in zip(chosen, ratios, strict=False) if a >= 1000) < 1.30  # (20000/50)^(1/29) = 1.23
    assert max(ratios) <= 2.0 and min(ratios) > 1.0
    assert [it for it, _ in lc.choose_checkpoints(ckpts, every=100)] == [50, 5050, 10050, 15050, 20000]
    assert [it for it, _ in lc.choose_checkpoints(ckpts[:1], log_points=5)] == [50]
