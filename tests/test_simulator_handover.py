"""benchmarks/simulator_handover.py: an episode runs in one simulator up to the handover time and continues from the
state it reached in the other one."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import load_script

from bcg.evaluation.mujoco_transfer import ReferenceReplayPolicy
from bcg.evaluation.transfer_protocol import TransferOptions

handover = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "simulator_handover.py")

MODEL = SimpleNamespace(params=SimpleNamespace(substeps=4, dt=0.005))  # a 0.02 s control step


def test_the_transition_switches_once_after_the_handover_time():
    calls: list[str] = []
    built: list[object] = []

    def make_second(model):
        built.append(model)
        return lambda model, *a, **k: calls.append("second")

    fn = handover.HandoverTransition(lambda model, *a, **k: calls.append("first"), make_second, after_s=0.04)
    for _ in range(5):
        fn(MODEL, "q", "qd", targets="u")
    assert calls == ["first", "first", "second", "second", "second"]
    assert built == [MODEL]  # built once, on its first use
    never = handover.HandoverTransition(lambda model, *a, **k: calls.append("first"), make_second, math.inf)
    calls.clear()
    never(MODEL)
    assert calls == ["first"]
    with pytest.raises(ValueError, match=">= 0 s"):
        handover.HandoverTransition(lambda *a: None, make_second, -1.0)


@pytest.mark.parametrize("first", ["mujoco", "bcg"])
def test_the_handed_over_episode_continues_from_the_state_it_reached(first):
    options = TransferOptions(phases=2, seeds=(0,), seconds=0.2)
    runs = {h: handover.replay_with_handover(ReferenceReplayPolicy(), "jump", options, {}, first=first, after_s=h)
            for h in (math.inf, 0.1)}
    alone, handed = runs[math.inf].qpos, runs[0.1].qpos
    # the first five control steps are the first simulator's, bit for bit; then the other one takes the same state on
    np.testing.assert_array_equal(handed[:6], alone[:6])
    assert not np.array_equal(handed[6:], alone[6:])
    step = np.abs(np.diff(handed[:, :, 7:], axis=0)).max(axis=(1, 2))  # joint motion per control step [rad]
    assert step[5] < 3 * step[:5].max()  # no jump back to a start state at the handover


def test_recorded_actions_play_back_each_episode_for_as_long_as_it_lasted():
    obs = torch.zeros(2, 5)
    steps = iter(range(100))

    def policy(o):  # a different action at every call
        return torch.full((o.shape[0], 1), float(next(steps)))

    rec = handover.RecordedActions(policy)
    act = rec.bind(env=None)
    first = [act(obs) for _ in range(3)]
    assert [float(a[0, 0]) for a in rec.actions] == [0.0, 1.0, 2.0] and torch.equal(rec.actions[1], first[1])
    # episode 0 lasted 3 steps in the recording, episode 1 only 1: after that each gets the policy's own actions
    played = handover.RecordedActions(policy, play=rec.actions, lengths=np.array([3, 1])).bind(env=None)
    out = [played(obs)[:, 0].tolist() for _ in range(4)]
    assert out == [[0.0, 0.0], [1.0, 4.0], [2.0, 5.0], [6.0, 6.0]]
    with pytest.raises(ValueError, match="together"):
        handover.RecordedActions(policy, play=rec.actions)


def test_open_loop_plays_the_first_simulators_actions_after_the_handover(capsys):
    assert handover.main(["reference", "--motion", "jump", "--phases", "2", "--seeds", "0", "--seconds", "0.2",
                          "--after", "0.1", "--trace", "0", "--open-loop"]) == 0
    assert "at 0.1 s with MuJoCo's own actions (open loop)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        handover.main(["reference", "--motion", "jump", "--open-loop"])


def test_touching_names_the_spheres_on_the_ground_per_foot():
    # per foot: heel +y, heel -y, toe +y, toe -y (left foot first); positive penetration touches
    assert handover.touching(np.array([1, 1, 1, 1, -1, -1, -1, -1]) * 1e-3) == "HT/-"
    assert handover.touching(np.array([0, 1, -1, 1, -1, -1, 2, 2]) * 1e-3) == "ht/T"


def test_the_script_prints_and_writes_one_row_per_handover_time(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert handover.main(["reference", "--motion", "jump", "--phases", "2", "--seeds", "0", "--seconds", "0.2",
                          "--after", "0", "0.1", "inf", "--trace", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["after_s"] for r in rows] == [0.0, 0.1, None]
    assert all(r["falls"] == 0 and r["episodes"] == 2 for r in rows)
    assert rows[0]["start_s"] == pytest.approx([0.0, 7.5]) and rows[0]["end_s"] == pytest.approx([0.2, 7.7])
    text = capsys.readouterr().out
    assert "| never (MuJoCo throughout) | 0 of 2 |" in text
    assert "episode 1: MuJoCo alone against handed over to ours at 0.1 s" in text
    # the trace: from the first step (0.1 s before the handover, 7.5 s into the clip) every 0.1 s to the end
    assert "| 7.52 |" in text and "| 7.62 |" in text and "| 7.72 |" not in text
    # the reference replay stands on both feet, all of their spheres down
    assert "HT/HT |" in text


def test_bad_arguments_are_refused_in_one_line():
    with pytest.raises(SystemExit):
        handover.main(["reference", "--motion", "jump", "--after", "-1"])
    with pytest.raises(SystemExit):
        handover.main(["reference", "--motion", "jump", "--trace", "8"])
