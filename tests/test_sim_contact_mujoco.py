"""Contact against an independent reference: standing, a drop onto the feet, a sideways slide and a spin, in bcg.sim
and in C MuJoCo from the same state with the same PD targets (:mod:`bcg.evaluation.contact_scenarios`).

Every tolerance of this file is in the block below, next to the values measured when it was set, so that a change
of the contact code re-tunes them in one place. ``python benchmarks/contact_vs_mujoco.py`` prints the same metrics.
"""

from __future__ import annotations

import pytest

from bcg.evaluation.contact_scenarios import SCENARIOS, metrics, run_bcg, run_mujoco

# ---- bounds ---------------------------------------------------------------------------------------------------
# Measured with the per-foot normal regulariser and beta 0.5 (bcg kappa 300, 10 PGS sweeps; MuJoCo 5 ms
# implicitfast), "ours vs MuJoCo"; the values of commit 7f693f1 (per-sphere regulariser, beta 0.2) in brackets.
KAPPA = 300.0

CLOSE_TO_MUJOCO: dict[tuple[str, str], float] = {
    # |bcg - MuJoCo| allowed, SI units (m, s)
    ("stand", "pelvis_z"): 0.5e-3,  # 0.7912 vs 0.7914 m: -0.21 mm (-0.70 mm)
    ("stand", "mean_penetration"): 0.4e-3,  # 0.55 vs 0.38 mm over 5-10 s: +0.17 mm (+0.68 mm)
    ("stand", "peak_penetration"): 0.6e-3,  # 0.76 vs 0.48 mm over 5-10 s: +0.28 mm (+0.98 mm)
    ("drop", "peak_penetration"): 3.5e-3,  # 3.20 vs 5.19 mm: -1.99 mm (-2.60 mm; bcg's contact is stiffer on impact)
    ("drop", "settled_height"): 0.5e-3,  # 0.7912 vs 0.7914 m: -0.20 mm (-0.70 mm)
    ("drop", "settling_time"): 0.075,  # 0.115 vs 0.150 s (to 2 mm of the settled height): -0.035 s (-0.05 s)
    ("slide", "feet_0.1"): 2.5e-3,  # 6.19 vs 7.42 mm: -1.23 mm (-1.66 mm)
    ("slide", "feet_0.2"): 4.0e-3,  # 25.6 vs 27.5 mm: -1.9 mm (-3.6 mm)
    ("slide", "feet_0.5"): 1.5e-3,  # 55.2 vs 55.6 mm: -0.4 mm (-1.3 mm)
    ("slide", "pelvis_0.1"): 1.0e-3,  # 46.9 vs 47.2 mm: -0.3 mm (-0.2 mm)
    ("slide", "pelvis_0.2"): 1.0e-3,  # 79.2 vs 79.7 mm: -0.5 mm (-0.3 mm)
    ("slide", "pelvis_0.5"): 1.5e-3,  # 133.2 vs 134.3 mm: -1.1 mm (+0.8 mm)
    # the spin (rad): ours turns further before friction stops it, then springs back to MuJoCo's heading (the
    # friction rows are weighted by the activation sigmoid(kappa d), 0.54 at the resting depth; docs/simulator.md)
    ("spin", "feet_0.1"): 12e-3,  # 43.8 vs 33.7 mrad: +10.1 mrad
    ("spin", "feet_0.2"): 21e-3,  # 54.4 vs 36.0 mrad: +18.4 mrad
    ("spin", "feet_0.5"): 1.5e-3,  # 35.2 vs 34.9 mrad: +0.3 mrad
    ("spin", "pelvis_0.1"): 11e-3,  # 56.0 vs 47.1 mrad: +9.0 mrad
    ("spin", "pelvis_0.2"): 20e-3,  # 56.7 vs 39.6 mrad: +17.1 mrad
    ("spin", "pelvis_0.5"): 4e-3,  # 35.8 vs 38.8 mrad: -2.9 mrad
}

UPRIGHT_HEIGHT = 0.75
"""Pelvis height [m] both simulators stay above in every scenario (the slide's lowest is 0.786 m in both)."""

IMPULSE_BALANCE = 5e-3
"""|normal impulse of the last second / weight impulse - 1| while standing: measured < 1e-4 in both."""

STAND_DRIFT_1S = 1.5e-3
"""Horizontal pelvis drift in the first second of standing [m]: measured 0.84 mm (MuJoCo 2.73 mm; issue 7 asks for
at most 2x MuJoCo's). It was 13.7 mm with the per-sphere regulariser and beta 0.2 (docs/simulator.md, *Standing*)."""

STAND_CREEP = 0.03e-3
"""Foot creep after the first second of standing [m/s]: measured 0.013 mm/s (MuJoCo 0.001 mm/s); it was 0.16 mm/s."""

SLIDE_FEET_05 = 0.1
"""Horizontal distance of the feet 0.5 s into the slide, both simulators [m]: measured 54-56 mm; without friction
it would be 250 mm."""

SLIDE_REST = 1e-3
"""Distance the feet move in the last 0.1 s (0.9-1.0 s) of the slide, both simulators [m]: measured 0.33 mm
(MuJoCo 0.07 mm): the feet have come to rest."""

SPIN_FEET_05 = 0.1
"""Heading the feet have turned 0.5 s into the spin, both simulators [rad]: measured 35 mrad; without friction they
would turn with the robot, 1 rad."""

SPIN_REST = 2e-3
"""Heading change of the feet in the last 0.1 s (0.9-1.0 s) of the spin, both simulators [rad]: measured -0.51 mrad
(ours, still springing back) and -0.24 mrad (MuJoCo); 10.6 / 2.3 mrad from 0.1 to 0.2 s."""
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces():
    """{(scenario, "bcg" | "mujoco"): ContactTrace}, each scenario run once (about 3 s of CPU in all)."""
    out = {}
    for s in SCENARIOS:
        out[s.name, "bcg"] = run_bcg(s, kappa=KAPPA)
        out[s.name, "mujoco"] = run_mujoco(s)
    return out


@pytest.mark.parametrize("scenario, metric", list(CLOSE_TO_MUJOCO))
def test_metric_close_to_mujoco(traces, scenario, metric):
    ours = metrics(traces[scenario, "bcg"])[metric]
    theirs = metrics(traces[scenario, "mujoco"])[metric]
    bound = CLOSE_TO_MUJOCO[scenario, metric]
    assert abs(ours - theirs) <= bound, f"{scenario} {metric}: bcg {ours:.6g}, MuJoCo {theirs:.6g}, bound {bound:g}"


@pytest.mark.parametrize("scenario", [s.name for s in SCENARIOS])
@pytest.mark.parametrize("sim", ["bcg", "mujoco"])
def test_stays_upright(traces, scenario, sim):
    lowest = float(traces[scenario, sim].pelvis[:, 2].min())
    assert lowest > UPRIGHT_HEIGHT, f"{sim} {scenario}: pelvis down to {lowest:.3f} m"


def test_standing_normal_impulse_balances_weight(traces):
    for sim in ("bcg", "mujoco"):
        ratio = metrics(traces["stand", sim])["impulse_over_weight"]
        assert abs(ratio - 1) < IMPULSE_BALANCE, (sim, ratio)


def test_standing_drift_and_creep(traces):
    m = metrics(traces["stand", "bcg"])
    assert m["drift_1s"] < STAND_DRIFT_1S, m["drift_1s"]
    assert m["creep"] < STAND_CREEP, m["creep"]


def test_slide_is_stopped_by_friction(traces):
    """The slide metrics are only meaningful if friction acts, and the feet must come to rest afterwards."""
    for sim in ("bcg", "mujoco"):
        tr = traces["slide", sim]
        assert tr.horizontal_displacement(0.5, "feet") < SLIDE_FEET_05, sim
        late = tr.horizontal_displacement(1.0, "feet") - tr.horizontal_displacement(0.9, "feet")
        assert abs(late) < SLIDE_REST, (sim, late)


def test_scenarios_reject_bad_values_and_unknown_metrics(traces):
    from dataclasses import replace

    from bcg.evaluation.contact_scenarios import DROP, Scenario
    from bcg.robots import g1

    with pytest.raises(ValueError, match="Scenario.height must be a finite value >= 0"):
        Scenario("x", 1.0, height=-0.1)
    with pytest.raises(ValueError, match="Scenario.velocity must be three finite values"):
        Scenario("x", 1.0, velocity=(0.0, float("nan"), 0.0))
    with pytest.raises(ValueError, match="Scenario.seconds must be a finite value > 0"):
        Scenario("x", 0.0)
    with pytest.raises(ValueError, match="Scenario.yaw_rate must be a finite value"):
        Scenario("x", 1.0, yaw_rate=float("inf"))
    q, qd = DROP.initial_state()
    assert q[2] == pytest.approx(DROP.height + g1.DEFAULT_BASE_HEIGHT) and not qd.any()
    assert replace(DROP, velocity=(0.0, 0.0, -1.0)).initial_state()[1][2] == -1.0
    assert replace(DROP, yaw_rate=2.0).initial_state()[1][3:6].tolist() == [0.0, 0.0, 2.0]
    with pytest.raises(ValueError, match="metrics are defined for the scenarios"):
        metrics(replace(traces["drop", "bcg"], name="jump"))


def test_spin_is_stopped_by_friction(traces):
    """The spin metrics are only meaningful if friction turns the feet less than the robot's spin would, and the feet
    must come to rest afterwards."""
    for sim in ("bcg", "mujoco"):
        tr = traces["spin", sim]
        assert abs(tr.turned(0.5)) < SPIN_FEET_05, sim
        late = tr.turned(1.0) - tr.turned(0.9)
        assert abs(late) < SPIN_REST, (sim, late)


def test_keyframes_interpolate_the_targets_and_are_checked():
    """The push-off's PD targets: the default pose before the first keyframe, linear between keyframes, held after
    the last; a suffix names every joint ending with it."""
    import numpy as np

    from bcg.evaluation.contact_scenarios import PUSH, PUSH_START, Scenario
    from bcg.robots import g1

    names = list(g1.JOINT_NAMES)
    knees = [names.index("left_knee_joint"), names.index("right_knee_joint")]
    ankles = [names.index("left_ankle_pitch_joint"), names.index("right_ankle_pitch_joint")]
    base = np.asarray(g1.DEFAULT_JOINT_POS)
    np.testing.assert_allclose(PUSH.targets(0.0), base)
    np.testing.assert_allclose(PUSH.targets(0.25)[knees], base[knees] + 0.6)  # half way into the crouch
    np.testing.assert_allclose(PUSH.targets(PUSH_START)[knees], base[knees] + 1.2)
    after = PUSH.targets(PUSH_START + 0.2)
    np.testing.assert_allclose(after[knees], base[knees])
    np.testing.assert_allclose(after[ankles], base[ankles] + 0.4)
    others = np.setdiff1d(np.arange(len(names)), knees + ankles + [names.index("left_hip_pitch_joint"),
                                                                   names.index("right_hip_pitch_joint")])
    np.testing.assert_allclose(PUSH.targets(PUSH_START)[others], base[others])
    assert Scenario("x", 1.0, keyframes=((0.0, (("knee_joint", 1.0),)),)).targets(0.0)[knees].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="no G1 joint name ends with 'toe_joint'"):
        Scenario("x", 1.0, keyframes=((0.5, (("toe_joint", 1.0),)),))
    with pytest.raises(ValueError, match="keyframes times must be finite, >= 0 and increasing"):
        Scenario("x", 1.0, keyframes=((0.5, ()), (0.2, ())))
