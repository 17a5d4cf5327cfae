"""benchmarks/mujoco_variants.py: each variant changes the part of MuJoCo's model it names, and nothing else, and the
script replays a policy once per variant."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

from bcg.evaluation.mujoco_loop import MujocoLoop
from bcg.robots import g1

variants = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "mujoco_variants.py")

FIELDS = ("geom_solref", "geom_solimp", "geom_condim", "geom_friction", "jnt_limited", "jnt_actfrcrange",
          "actuator_forcerange", "actuator_biasprm", "actuator_gainprm")


def _changed(variant: str) -> dict[str, np.ndarray]:
    base, model = MujocoLoop(1).model, MujocoLoop(1).model
    variants.model_change(variant)(model)
    assert (variant == "elliptic-cones") == (model.opt.cone != base.opt.cone)
    assert (variant == "noslip") == (model.opt.noslip_iterations != base.opt.noslip_iterations)
    return {f: getattr(model, f) != getattr(base, f) for f in FIELDS if (getattr(model, f) != getattr(base, f)).any()}


def test_each_variant_changes_only_its_part_of_the_model():
    assert _changed("mujoco") == {} and _changed("elliptic-cones") == {} and _changed("noslip") == {}
    assert set(_changed("stiff-contact")) == {"geom_solref"}
    assert set(_changed("torsional-friction")) == {"geom_condim", "geom_friction"}
    assert set(_changed("no-joint-limits")) == {"jnt_limited"}
    assert set(_changed("damping-x2")) == {"geom_solref"} and not _changed("damping-x2")["geom_solref"][:, 0].any()
    model = MujocoLoop(1).model
    variants.model_change("impedance-x0.6")(model)
    assert np.allclose(model.geom_solimp[:, :2], [0.54, 0.57]) and np.allclose(model.geom_solimp[:, 2], 0.001)
    assert np.allclose(variants.model_change("impedance-x2")(MujocoLoop(1).model).geom_solimp[:, :2], 0.9999)
    friction = _changed("friction-x2")
    assert set(friction) == {"geom_friction"} and friction["geom_friction"][:, 0].all()
    assert not friction["geom_friction"][:, 1:].any()
    ankles = _changed("ankle-torque-x1.5")
    model = MujocoLoop(1).model
    variants.model_change("ankle-torque-x1.5")(model)
    # the G1's four ankle joints (pitch and roll, both legs) and only them: 50 N m -> 75 N m
    assert ankles["jnt_actfrcrange"].any(1).sum() == 4
    assert np.allclose(np.abs(model.jnt_actfrcrange[ankles["jnt_actfrcrange"].any(1)]), 75.0)
    assert _changed("torque-x1.5")["jnt_actfrcrange"].any(1).sum() == 29
    # our PD law's damping: every actuator's velocity bias, kv -> kv + h kp (5 -> 6 N m s/rad on the legs)
    pd = _changed("bcg-pd")
    assert set(pd) == {"actuator_biasprm"} and pd["actuator_biasprm"][:, 2].all()
    assert not pd["actuator_biasprm"][:, :2].any()
    model = variants.model_change("bcg-pd")(MujocoLoop(1).model)
    assert np.allclose(-model.actuator_biasprm[:, 2], g1.KD + 0.005 * g1.KP)


def test_unknown_variants_and_bad_factors_are_refused():
    with pytest.raises(ValueError, match="unknown variant 'softer'"):
        variants.model_change("softer")
    with pytest.raises(ValueError, match="must be a number > 0"):
        variants.model_change("torque-x0")


def test_the_script_replays_once_per_variant(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert variants.main(["reference", "--motion", "jump", "--phases", "2", "--seeds", "0", "--seconds", "0.2",
                          "--variants", "mujoco", "stiff-contact", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["mujoco", "stiff-contact"]
    # 0.2 s of the reference replay stand either way; phase 1 starts at frame 375 of the jump's 751 (7.5 s)
    assert all(r["falls"] == 0 and r["episodes"] == 2 for r in rows)
    assert rows[0]["start_s_per_phase"] == pytest.approx([0.0, 7.5])
    assert "| stiff-contact | 0 of 2 |" in capsys.readouterr().out


def test_variants_of_our_simulator_change_its_model():
    from bcg.sim import load_model

    model = load_model()
    assert variants.bcg_change("bcg")(model) is model
    assert variants.bcg_change("friction-x0.5")(model).params.mu == pytest.approx(0.5 * model.params.mu)
    assert variants.bcg_change("beta-x0.2")(model).params.beta == pytest.approx(0.2 * model.params.beta)
    assert variants.bcg_change("beta-x5")(model).params.beta == 1.0  # a Baumgarte factor above 1 would overshoot
    joined = variants.bcg_change("soft-contact+friction-x2")(model)
    assert joined.params.soft_timeconst == 0.02 and joined.params.mu == pytest.approx(2 * model.params.mu)
    assert not variants.bcg_change("no-joint-limits")(model).dof_limited.any() and model.dof_limited.any()
    assert variants.bcg_change("mujoco-pd")(model).params.pd_lookahead is False and model.params.pd_lookahead
    stronger = variants.bcg_change("torque-x1.19")(model)
    assert np.allclose(stronger.torque_limit, 1.19 * model.torque_limit) and np.array_equal(stronger.kd, model.kd)
    with pytest.raises(ValueError, match="unknown variant 'stiff-contact' of our simulator"):
        variants.bcg_change("stiff-contact")


def test_a_variant_of_our_simulator_reaches_the_replay():
    from bcg.evaluation.mujoco_transfer import ReferenceReplayPolicy, TransferOptions

    options = TransferOptions(phases=1, seeds=(0,), seconds=0.4)
    same = [variants.falls_with(ReferenceReplayPolicy(), "jump", options, {}, "bcg", "bcg") for _ in range(2)]
    icy = variants.falls_with(ReferenceReplayPolicy(), "jump", options, {}, "friction-x0.05", "bcg")
    assert same[0]["e_track_cm"] == same[1]["e_track_cm"]
    # reruns agree exactly, and 1/20 of the friction under a standing start moves the replay (measured 0.014 cm)
    assert abs(icy["e_track_cm"] - same[0]["e_track_cm"]) > 0.005
