"""The PD law's position term (``ContactParams.pd_lookahead``): the end-of-step position (the default) or MuJoCo's
start-of-step one.

Checked like the rest of the simulator: the parameter, the Warp rollout gradient against finite differences of the
float64 oracle, the Warp trajectory against the oracle, and a jump's push-off against MuJoCo's
(:data:`bcg.evaluation.contact_scenarios.PUSH`; docs/simulator.md, *Actuators*).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script
from test_sim_rollout_grads import directional_gradient_error, trajectory_errors

from bcg.envs import Dynamics
from bcg.evaluation.contact_scenarios import DT, PUSH, metrics, run_bcg, run_bcg_batch, run_mujoco
from bcg.sim.model import ContactParams

MUJOCO_LAW = {"pd_lookahead": False}


def test_pd_lookahead_is_checked_and_reaches_the_model():
    assert ContactParams().pd_lookahead is True
    with pytest.raises(ValueError, match="ContactParams.pd_lookahead must be True or False"):
        ContactParams(pd_lookahead=0.5)
    with pytest.raises(ValueError, match="pd_lookahead must be True, False or None"):
        Dynamics(pd_lookahead=1)
    assert Dynamics(pd_lookahead=False).sim_params() == {"pd_lookahead": False}
    assert Dynamics.from_mapping({"pd_lookahead": False}).pd_lookahead is False


def test_mujoco_pd_law_rollout_gradient_matches_finite_differences(g1_model):
    err = directional_gradient_error(g1_model.with_params(**MUJOCO_LAW), 301)
    assert err < 3e-5, err


def test_mujoco_pd_law_warp_trajectory_equals_float64_reference(g1_model):
    model = g1_model.with_params(**MUJOCO_LAW)
    worst_q, worst_imp = trajectory_errors(model)
    weight_impulse = model.total_mass * 9.81 * model.params.control_dt
    assert worst_q < 8e-6, worst_q
    assert worst_imp < 1e-4 * weight_impulse, worst_imp


def test_push_off_without_lookahead_is_closer_to_mujoco():
    """A jump's take-off under saturated knees and hips: the lookahead's extra damping (h kp, 20 % of kd on the legs)
    slows the legs' extension, MuJoCo's law does not."""
    mj = metrics(run_mujoco(PUSH))
    ours = metrics(run_bcg(PUSH))
    ours_mj_law = metrics(run_bcg(PUSH, **MUJOCO_LAW))
    # measured take-off speed of the centre of mass: MuJoCo 2.455, ours 2.218, ours with MuJoCo's law 2.294 m/s;
    # its rise 0.414 / 0.345 / 0.366 m (most of the rest of the gap is MuJoCo's 5 ms step: the test below)
    assert 0.20 < mj["takeoff_speed"] - ours["takeoff_speed"] < 0.27, (mj, ours)
    assert 0.12 < mj["takeoff_speed"] - ours_mj_law["takeoff_speed"] < 0.19, (mj, ours_mj_law)
    assert ours_mj_law["com_rise"] - ours["com_rise"] > 0.015, (ours, ours_mj_law)
    for m in (mj, ours, ours_mj_law):  # a real jump: the feet leave the ground within 0.1 s of the push
        assert 0.05 <= m["lift_off"] <= 0.11 and m["com_rise"] > 0.3, m


def test_mujocos_push_off_converges_to_ours_at_finer_steps():
    """At the MJCF's 5 ms step MuJoCo's toes lose their contact for a whole step as the ankles snap at their torque
    limit, sink tens of millimetres into its soft ground and spring back: a faster take-off. At 1 and 0.2 ms they do
    not, and MuJoCo's push-off converges to ours under its PD law (docs/evaluation.md, *MuJoCo's own step*)."""
    push = slice(int(0.85 / DT), int(1.0 / DT))
    coarse, fine, finest = (run_mujoco(PUSH, refine=r) for r in (1, 5, 25))
    ours = run_bcg(PUSH, **MUJOCO_LAW)
    sink = {name: tr.penetration[push].max() for name, tr in
            (("5 ms", coarse), ("1 ms", fine), ("0.2 ms", finest), ("ours", ours))}
    # measured deepest foot sphere in the push: 46.2, 3.36, 0.68 mm; ours 4.08 mm
    assert sink["5 ms"] > 0.040 and sink["1 ms"] < 0.004 and sink["0.2 ms"] < 0.001 and sink["ours"] < 0.005, sink
    m5, m1, m02, mo = (metrics(tr) for tr in (coarse, fine, finest, ours))
    # measured take-off 2.455 / 2.346 / 2.323 m/s, ours 2.294; push impulse 111.87 / 106.32 / 104.89 N s, ours 104.52
    assert m5["takeoff_speed"] - m02["takeoff_speed"] > 0.12, (m5, m02)
    assert abs(m1["takeoff_speed"] - m02["takeoff_speed"]) < 0.03, (m1, m02)
    assert abs(m02["takeoff_speed"] - mo["takeoff_speed"]) < 0.035, (m02, mo)
    assert abs(m02["push_impulse"] - mo["push_impulse"]) < 0.006 * m02["push_impulse"], (m02, mo)
    with pytest.raises(ValueError, match="refine must be an integer >= 1"):
        run_mujoco(PUSH, refine=0)


def test_randomisation_family_covers_mujocos_push_off_only_with_mujocos_law():
    """The corners of --contact-randomization and --torque-limit-randomization, through the push-off: with the
    default law every member takes off slower than MuJoCo, with MuJoCo's law MuJoCo lies inside the family."""
    bench = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "push_off_randomization.py")
    members = bench.family()
    assert len(members) == 18 and {scale for _, scale, _ in members} == {0.85, 1.0, 1.2}
    mj = metrics(run_mujoco(PUSH))["takeoff_speed"]
    strongest = [m for m in members if m[1] == 1.2 and m[2] == {"beta": 0.1, "soft_timeconst": 0.03}]
    assert len(strongest) == 1
    _, scale, params = strongest[0]
    # measured: MuJoCo 2.455 m/s; the family's fastest member 2.419 (default law) and 2.520 (MuJoCo's law)
    assert metrics(run_bcg(PUSH, torque_scale=scale, **params))["takeoff_speed"] < mj - 0.02
    assert metrics(run_bcg(PUSH, torque_scale=scale, pd_lookahead=False, **params))["takeoff_speed"] > mj + 0.03
    speeds, factors = bench.drawn_speeds(4, seed=0, pd_lookahead=True)  # draws from the whole default family
    assert speeds.shape == (4,) and len(set(speeds.round(4))) == 4 and (speeds > 1.9).all() and (speeds < 2.7).all()
    assert ((factors["kp"] >= 0.8) & (factors["kp"] <= 1.2)).all() and len(set(factors["kd"].round(4))) == 4
    with pytest.raises(ValueError, match="torque_scale must be a finite value > 0"):
        run_bcg(PUSH, torque_scale=0.0)


def test_the_gain_randomisation_reaches_mujocos_push_off_with_the_default_law():
    """Rows of per-environment physics through the push-off at once: the model's own row reproduces the single run,
    and the default family's gain corner (kp x1.2, kd x0.8) with the torque limits x1.2 takes off faster than MuJoCo
    with the default law, which no contact or torque corner alone does."""
    import torch

    from bcg.sim import default_physics, load_model

    model = load_model(substeps=1, dt=DT)
    base = default_physics(model, 2)
    scale = torch.tensor([[1.0], [1.2]])
    corner = base._replace(kp=base.kp * scale, kd=base.kd * torch.tensor([[1.0], [0.8]]),
                           torque_limit=base.torque_limit * scale)
    own, strong = (metrics(tr)["takeoff_speed"] for tr in run_bcg_batch(PUSH, model, corner))
    # measured: 2.2182 (as run_bcg), 2.507 against MuJoCo's 2.455
    assert own == pytest.approx(metrics(run_bcg(PUSH))["takeoff_speed"], abs=1e-6)
    assert strong > metrics(run_mujoco(PUSH))["takeoff_speed"] + 0.03
    with pytest.raises(ValueError, match="run_bcg_batch needs a model of one 0.005 s substep per call"):
        run_bcg_batch(PUSH, load_model(), base)
