"""The soft normal contact (``ContactParams.soft_timeconst``): impacts braked over several substeps as in MuJoCo.

Checked like the rest of the contact: its parameters, the Warp rollout gradient against finite differences of the
float64 oracle, the Warp trajectory against the oracle, and MuJoCo's drop and standing (docs/simulator.md,
*Soft normal contact*).
"""

from __future__ import annotations

import pytest
from test_sim_rollout_grads import directional_gradient_error, trajectory_errors

from bcg.evaluation.contact_scenarios import SCENARIOS, metrics, run_bcg, run_mujoco
from bcg.sim import load_model
from bcg.sim.model import ContactParams

SOFT = {"soft_timeconst": 0.02}


def test_soft_contact_parameters_are_checked_and_set_the_normal_bias():
    assert ContactParams().normal_bias_gains() == (1.0, 0.0, 0.5)  # the Baumgarte contact
    i, start, depth = ContactParams(soft_timeconst=0.02, beta=0.2).normal_bias_gains()
    # J v_next = (1 - i) J v_free + (i - 2 h / T) J v_0 + beta d / h: MuJoCo's velocity braking, h = 5 ms, T = 20 ms
    assert (i, depth) == (0.95, 0.2) and start == pytest.approx(2 * 0.005 / 0.02 - 0.95)
    for bad in ({"soft_timeconst": 0.005}, {"soft_timeconst": -0.02}, {"soft_timeconst": float("nan")},
                {"soft_impedance": 1.0}, {"soft_impedance": 0.0}):
        with pytest.raises(ValueError, match="ContactParams.soft_"):
            ContactParams(**bad)
    with pytest.raises(ValueError, match="soft_timeconst"):
        load_model(soft_timeconst=0.001)


@pytest.mark.parametrize("params", [SOFT, {**SOFT, "beta": 0.2}], ids=["soft", "soft-beta0.2"])
def test_soft_contact_rollout_gradient_matches_finite_differences(g1_model, params):
    assert directional_gradient_error(g1_model.with_params(**params), 300) < 3e-5  # measured 7.9e-6 / 8.9e-6


def test_soft_contact_warp_trajectory_equals_float64_reference(g1_model):
    model = g1_model.with_params(**SOFT)
    worst_q, worst_imp = trajectory_errors(model)
    weight_impulse = model.total_mass * 9.81 * model.params.control_dt
    assert worst_q < 8e-6, worst_q  # measured 4.2e-6
    assert worst_imp < 1e-4 * weight_impulse, worst_imp  # measured 5.3e-5 of m g dt


@pytest.fixture(scope="module")
def scenario_metrics():
    out = {}
    for s in SCENARIOS:
        if s.name in ("stand", "drop"):
            out[s.name] = (metrics(run_bcg(s, kappa=300.0)), metrics(run_bcg(s, kappa=300.0, **SOFT)),
                           metrics(run_mujoco(s)))
    return out


def test_soft_contact_lands_like_mujoco(scenario_metrics):
    """A 5 cm drop onto the feet: the peak penetration and the pelvis's lowest point, against MuJoCo's."""
    hard, soft, mj = scenario_metrics["drop"]
    # measured: peak penetration 3.20 (hard) / 5.24 (soft) / 5.19 mm (MuJoCo); lowest pelvis 789.1 / 787.0 / 786.7 mm
    assert abs(soft["peak_penetration"] - mj["peak_penetration"]) < 0.3e-3
    assert abs(hard["peak_penetration"] - mj["peak_penetration"]) > 1.5e-3
    assert abs(soft["lowest_pelvis_z"] - mj["lowest_pelvis_z"]) < 0.6e-3
    assert abs(soft["settled_height"] - mj["settled_height"]) < 0.5e-3  # 791.2 vs 791.4 mm


def test_soft_contact_still_stands(scenario_metrics):
    """Standing 10 s: the soft contact keeps the push-out of the depth, so it rests and drifts as the hard one."""
    hard, soft, mj = scenario_metrics["stand"]
    # measured: pelvis 791.21 (soft) / 791.23 (hard) / 791.44 mm (MuJoCo); mean penetration 0.58 / 0.55 / 0.38 mm;
    # drift in the first second 0.74 / 0.84 / 2.73 mm
    assert abs(soft["pelvis_z"] - mj["pelvis_z"]) < 0.5e-3
    assert abs(soft["mean_penetration"] - mj["mean_penetration"]) < 0.4e-3
    assert soft["drift_1s"] < 1.5e-3
