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
