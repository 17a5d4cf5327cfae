"""Checkpoints: atomic writes, safe (weights-only) reads, and refusals that say what is wrong."""

from __future__ import annotations

import pickle
import random
import re

import pytest
import torch

from bcg.agents.checkpoint import (
    CheckpointError,
    atomic_torch_save,
    check_compatible,
    config_differences,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_state_fits,
)

CONFIG = {"agent": "shac", "estimator": {"name": "bcg", "tau": 400.0, "branches": 10}, "iterations": 10,
          "shac": {"num_envs": 16, "actor_hidden": [256, 128]}}


def _state(width: int = 4) -> dict:
    return {"w": torch.arange(width, dtype=torch.float32), "iteration": 3, "gen": torch.Generator().get_state(),
            "nested": {"lr": 1e-3, "sizes": [1, 2]}}


def _save(path, width=4, config=CONFIG, iteration=3):
    return save_checkpoint(path, agent_state=_state(width), iteration=iteration, run_id="run-x", config=config,
                           metrics_header=["iteration", "samples", "reward"],
                           metrics_rows=[[1, 10, 0.5], [2, 20, 0.25], [3, 30, 0.125]])


def test_round_trip(tmp_path):
    path = _save(tmp_path / "checkpoints" / "iter_000003.pt")
    ck = load_checkpoint(path)
    assert ck.iteration == 3 and ck.run_id == "run-x" and ck.config == CONFIG
    assert torch.equal(ck.agent_state["w"], _state()["w"]) and ck.agent_state["nested"]["sizes"] == [1, 2]
    assert ck.metrics_rows[-1] == [3.0, 30.0, 0.125]
    raw = torch.load(path, weights_only=True)  # the file is a plain weights-only torch file
    assert raw["format"] == "bcg-checkpoint" and raw["version"] == 1


def test_latest_checkpoint(tmp_path):
    for it in (2, 10, 4):
        _save(tmp_path / "checkpoints" / f"iter_{it:06d}.pt", iteration=it)
    assert latest_checkpoint(tmp_path).name == "iter_000010.pt"
    assert load_checkpoint(tmp_path).iteration == 10  # a run directory means its latest checkpoint
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        latest_checkpoint(tmp_path / "empty_dir")


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_atomic_write_keeps_old_file(tmp_path):
    path = _save(tmp_path / "ck.pt")
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="cannot pickle"):
        atomic_torch_save({"format": "bcg-checkpoint", "bad": _Unpicklable()}, path)
    assert path.read_bytes() == before  # the failed write never touched the file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]  # and left no temporary behind
    atomic_torch_save({"x": torch.ones(2)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(2))


def test_truncated_and_empty_refused(tmp_path):
    path = _save(tmp_path / "ck.pt")
    data = path.read_bytes()
    for n in (len(data) // 2, 100, len(data) - 1):
        bad = tmp_path / f"trunc{n}.pt"
        bad.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            load_checkpoint(bad)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(empty)
    rng = random.Random(0)
    for i in range(20):  # random bytes, and the real file with bytes flipped in its middle
        garbage = tmp_path / f"garbage{i}.pt"
        if i % 2:
            garbage.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
        else:
            flip = bytearray(data)
            for _ in range(32):
                flip[rng.randrange(len(flip) // 4, len(flip))] ^= 0xFF
            garbage.write_bytes(bytes(flip))
        if i % 2:  # random bytes are not called a pickled object: they are no torch file at all
            with pytest.raises(CheckpointError, match=r"\(4096 bytes\) is not a torch file: it starts with"):
                load_checkpoint(garbage)
            continue
        try:
            load_checkpoint(garbage)
        except CheckpointError as exc:
            assert re.search("truncated or corrupt|pickled|not a bcg checkpoint|damaged", str(exc)), str(exc)


class _Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickled_object_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "bcg-checkpoint", "version": 1, "agent": _Payload(marker)}, evil)  # torch zip + pickle
    with pytest.raises(CheckpointError, match="pickled Python object") as err:
        load_checkpoint(evil)
    assert "open" in str(err.value) and "weights_only" in str(err.value)
    assert not marker.exists()
    plain = tmp_path / "plain.pkl"  # a bare pickle stream (legacy format) is refused the same way
    plain.write_bytes(pickle.dumps(_Payload(marker), protocol=2))
    with pytest.raises(CheckpointError, match="pickled Python object"):
        load_checkpoint(plain)
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # what an unsafe load would have done: run the payload
    assert marker.exists()


def test_other_formats_refused(tmp_path):
    p = tmp_path / "policy.pt"
    torch.save({"format": "bcg-policy", "version": 1}, p)
    with pytest.raises(CheckpointError, match="policy export"):
        load_checkpoint(p)
    q = tmp_path / "sd.pt"
    torch.save({"weight": torch.ones(2)}, q)
    with pytest.raises(CheckpointError, match="not a bcg checkpoint"):
        load_checkpoint(q)
    r = tmp_path / "v9.pt"
    torch.save({"format": "bcg-checkpoint", "version": 9}, r)
    with pytest.raises(CheckpointError, match="version 9"):
        load_checkpoint(r)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_incompatible_config_names_fields(tmp_path):
    ck = load_checkpoint(_save(tmp_path / "ck.pt"))
    other = {**CONFIG, "estimator": {"name": "grs", "tau": 400.0, "branches": 10}, "iterations": 99,
             "shac": {"num_envs": 8, "actor_hidden": [256, 128]}}
    diffs = config_differences(ck.config, other, ignore=("iterations",))
    assert [d[0] for d in diffs] == ["estimator.name", "shac.num_envs"]
    with pytest.raises(CheckpointError) as err:
        check_compatible(ck, other, ignore=("iterations",))
    msg = str(err.value)
    assert "estimator.name: checkpoint 'bcg', requested 'grs'" in msg and "shac.num_envs" in msg
    assert "iterations" not in msg
    check_compatible(ck, {**CONFIG, "iterations": 50}, ignore=("iterations",))  # run-control fields may differ


def test_another_estimator_is_named_once_in_one_line(tmp_path):
    """Resuming with --estimator grs listed every field grs has and the checkpoint's estimator lacks ('<absent>'),
    over several lines; the estimator's name says it, on the one line bcg prints."""
    ck = load_checkpoint(_save(tmp_path / "ck.pt"))
    other = {**CONFIG, "estimator": {"name": "grs", "sigma_q": 0.02, "branches": 10}, "agent": "ppo"}
    with pytest.raises(CheckpointError) as err:
        check_compatible(ck, other)
    msg = str(err.value)
    assert "\n" not in msg and "<absent>" not in msg and "sigma_q" not in msg
    assert msg.endswith("(differing fields): agent: checkpoint 'shac', requested 'ppo'; estimator.name: checkpoint "
                        "'bcg', requested 'grs'"), msg


def test_state_that_does_not_fit(tmp_path):
    ck = load_checkpoint(_save(tmp_path / "ck.pt", width=4))
    verify_state_fits(ck.agent_state, _state(4), ck.path)
    with pytest.raises(CheckpointError, match=r"w: checkpoint \(4,\), agent \(6,\)"):
        verify_state_fits(ck.agent_state, _state(6), ck.path)
    with pytest.raises(CheckpointError, match=r"missing entries \['critic'\]"):
        verify_state_fits(ck.agent_state, {**_state(4), "critic": torch.ones(1)}, ck.path)
    fresh = _state(4)  # entries below the top level that a fresh agent lacks (optimiser moments) are fine
    fresh["nested"] = {"lr": 1e-3}
    verify_state_fits(ck.agent_state, fresh, ck.path)
