"""The one-step gap between our simulator and MuJoCo (bcg.evaluation.sim_gap) and `bcg evaluate --gap`."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from bcg.evaluation.mujoco_transfer import ReferenceReplayPolicy, TransferOptions
from bcg.evaluation.sim_gap import GapReport, one_step_gap, record_transitions, restep_mujoco

OPTIONS = TransferOptions(phases=2, seeds=(0,), seconds=0.4)


@pytest.fixture(scope="module")
def mujoco_steps():
    return record_transitions(ReferenceReplayPolicy(), "jump", OPTIONS)


def test_the_gap_on_our_own_steps_is_zero():
    steps = record_transitions(ReferenceReplayPolicy(), "jump", OPTIONS, simulator="bcg")
    report = one_step_gap(steps, limit_ablation=False)
    assert len(steps) == 40  # 2 episodes x 20 control steps
    measured = [r for r in report.rows if r.steps]
    assert measured and max(r.joint_vel_rms for r in measured) < 1e-6  # measured: 0 (the same kernels)


def test_restepping_mujoco_reproduces_its_recorded_steps(mujoco_steps):
    again = restep_mujoco(mujoco_steps)
    # measured 3.7e-6 rad/s on velocities up to 8 rad/s: the recorded states are the env's float32 copies
    assert np.abs(again - mujoco_steps.qd1).max() < 2e-5


def test_the_reference_replay_gap_is_split_by_regime(mujoco_steps):
    report = one_step_gap(mujoco_steps, label="reference")
    rows = {r.regime: r for r in report.rows}
    assert rows["all"].steps == len(mujoco_steps) == 40
    assert rows["foot contact"].steps + rows["no foot contact"].steps == rows["all"].steps
    # measured 0.194 rad/s (every step in foot contact, nothing saturated, no joint at a limit)
    assert 0.15 < rows["all"].joint_vel_rms < 0.25
    assert rows["all"].joint_vel_rms_no_limits == pytest.approx(rows["all"].joint_vel_rms, rel=0.05)
    assert report.worst_joints[0][0].endswith("ankle_pitch_joint")
    back = json.loads(report.to_json())
    assert back["rows"][0]["regime"] == "all"
    md = report.to_markdown()
    assert "| actuator saturated |" in md and "| joint limit |" in md


def test_saturated_actuators_and_joint_limits_are_recognised(mujoco_steps):
    targets = mujoco_steps.targets.copy()
    targets[0, 3] += 5.0  # a knee asked 5 rad ahead: 1000 N m against a 139 N m limit
    q1 = mujoco_steps.q1.copy()
    q1[1, 7 + 3] = -10.0  # a knee far past its lower limit
    steps = dataclasses.replace(mujoco_steps, targets=targets, q1=q1)
    report = one_step_gap(steps, limit_ablation=False)
    rows = {r.regime: r for r in report.rows}
    assert rows["actuator saturated"].steps == 1
    assert rows["joint limit"].steps == 1
    assert isinstance(report, GapReport)


def test_evaluate_gap_writes_the_report_beside_the_metrics(tmp_path, capsys):
    from bcg.evaluation.evaluate_cli import Evaluate

    cmd = Evaluate("reference", motion="jump", protocol=TransferOptions(phases=1, seeds=(0,), seconds=0.2),
                   progress=False, gap=True, out_dir=tmp_path / "out")
    assert cmd.run() == 0
    d = json.loads((tmp_path / "out" / "gap.json").read_text())
    assert d["rows"][0]["regime"] == "all" and d["rows"][0]["steps"] == 10
    assert np.isfinite(d["rows"][0]["joint_vel_rms"]) and d["rows"][0]["joint_vel_rms"] > 0
    assert (tmp_path / "out" / "metrics.json").is_file()
    assert "One-step gap" in capsys.readouterr().out


def test_steps_carry_their_clip_time_and_outcome(mujoco_steps):
    # two episodes (phases at frames 0 and 375 of the jump's 751) of 20 steps each, every step on its own frame
    dt = 0.02
    assert mujoco_steps.clip_time is not None and mujoco_steps.episode_fell is not None
    starts = np.sort(mujoco_steps.clip_time)
    assert starts[0] == pytest.approx(0.0) and np.unique(np.round(mujoco_steps.clip_time / dt)).size == 40
    assert not mujoco_steps.episode_fell.any()  # 0.4 s of the reference replay stand
    early = mujoco_steps.within(0.0, 10 * dt - 1e-9)
    assert len(early) == 10 and early.clip_time.max() < 10 * dt
    report = one_step_gap(early, limit_ablation=False)
    rows = {r.regime: r for r in report.rows}
    assert rows["episode stands"].steps == 10 and rows["episode falls"].steps == 0
    with pytest.raises(ValueError, match="must end after it starts"):
        mujoco_steps.within(1.0, 1.0)
    with pytest.raises(ValueError, match="clip time"):
        dataclasses.replace(mujoco_steps, clip_time=None).within(0.0, 1.0)


def test_the_episode_outcome_splits_the_gap(mujoco_steps):
    fell = np.zeros(len(mujoco_steps), dtype=bool)
    fell[:7] = True
    report = one_step_gap(dataclasses.replace(mujoco_steps, episode_fell=fell), limit_ablation=False)
    rows = {r.regime: r for r in report.rows}
    assert (rows["episode falls"].steps, rows["episode stands"].steps) == (7, 33)
    assert report.saturated_joints and all(share == 0 for _, share in report.saturated_joints)
    assert "Actuators saturated most often (share of the steps): none" in report.to_markdown()


def test_evaluate_gap_window_keeps_one_stretch(tmp_path):
    from bcg.evaluation.evaluate_cli import Evaluate

    cmd = Evaluate("reference", motion="jump", protocol=TransferOptions(phases=2, seeds=(0,), seconds=0.2),
                   progress=False, gap=True, gap_window=(7.0, 8.0), out_dir=tmp_path / "out")
    assert cmd.run() == 0
    d = json.loads((tmp_path / "out" / "gap.json").read_text())
    # the second phase starts at frame 375 (7.5 s): its 10 steps lie in the stretch, the first phase's do not
    assert d["rows"][0]["steps"] == 10 and "7-8 s of the clip" in d["label"]
    with pytest.raises(ValueError, match="give --gap too"):
        Evaluate("reference", motion="jump", gap_window=(1.0, 2.0))
    with pytest.raises(ValueError, match="START < END"):
        Evaluate("reference", motion="jump", gap=True, gap_window=(2.0, 1.0))
