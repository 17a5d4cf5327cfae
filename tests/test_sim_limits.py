"""Joint limits (implicit predictive dampers, reference.py step 2, and the guard after the contact solve, step 6):
gradients through active limits, agreement with C MuJoCo on which limits are active, and saturated random actions
in the four tracking envs.

Scenario of the first checks: the G1 in the air (root 2 m above its standing height, no contact), seven joints
started at or near a limit and PD-driven 0.3-0.45 rad past it (knees at both ends of their range, elbows at both
ends, a wrist, an ankle roll, the waist roll), the other joints held at the standing pose.

Every tolerance is in the block below, next to the value measured when it was set (with the guard, CPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bcg.robots import g1
from bcg.sim import reference, step

# ---- bounds ---------------------------------------------------------------------------------------------------
FD_REL = 8e-6
"""|Warp directional derivative - float64 central difference (eps 1e-5)| / max |derivative|, 3 directions: measured
2.7e-6 and 5.6e-6 on two float32 orderings of the guard's solve (derivatives -0.00018, 0.00081, -0.00053: small, the guard holds the pushed joints at their limits, so their
targets barely move them; 0.003-0.009 with the dampers alone). The float64 reference's own directional derivatives
agree with the differences to 1.6e-7."""
GRAD_REL = 1e-5
"""||Warp gradient - float64 reference autograd gradient|| / ||reference gradient||, all 8 x 29 entries: measured
5.0e-6 and 5.8e-6 (4.4e-6 with the dampers alone)."""
MJ_ACTIVE_TOL = 0.02
"""A joint counts as at its limit when within this of it or past it [rad]."""
MJ_JOINT_POS = 0.03
"""|bcg - MuJoCo| joint position after 0.5 s, every joint but the left ankle roll [rad]: measured 0.0213 (the
elbows; bcg 0.009 rad past the limit, MuJoCo 0.030: the guard holds our joints harder than MuJoCo's soft limits;
7e-3 with the dampers alone, at 0.023 rad past)."""
MJ_ANKLE_ROLL = 0.13
"""The same for the left ankle roll [rad]: measured 0.108 (bcg 0.009 rad past its limit, MuJoCo 0.117: MuJoCo's
soft limit yields far under the 50 N m actuator of this light joint; with the dampers alone ours was 0.044 past)."""
# ---------------------------------------------------------------------------------------------------------------

T = 8
PUSH = {  # joint: (start angle, PD target) [rad]
    "left_elbow_joint": (2.0, 2.45),  # upper limit 2.094
    "right_elbow_joint": (-0.95, -1.4),  # lower limit -1.047
    "left_knee_joint": (0.0, -0.45),  # lower limit -0.087
    "right_knee_joint": (2.8, 3.2),  # upper limit 2.880
    "left_wrist_pitch_joint": (1.55, 1.95),  # upper limit 1.614
    "left_ankle_roll_joint": (0.2, 0.6),  # upper limit 0.262
    "waist_roll_joint": (-0.45, -0.8),  # lower limit -0.52
}
PUSHED = [g1.JOINT_NAMES.index(n) for n in PUSH]


def _scenario(steps: int = T, noise: float = 0.05, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial qpos [1, 36] (float64, raised 2 m) and PD targets [1, steps, 29] (float64, with target noise)."""
    q0 = torch.tensor(g1.default_qpos(), dtype=torch.float64)[None]
    q0[0, 2] += 2.0
    tg = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float64)[None, None].repeat(1, steps, 1)
    for name, (start, target) in PUSH.items():
        j = g1.JOINT_NAMES.index(name)
        q0[0, 7 + j] = start
        tg[0, :, j] = target
    gen = torch.Generator().manual_seed(seed)
    return q0, tg + noise * torch.randn(tg.shape, generator=gen, dtype=torch.float64)


def _violation(model, joints: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Signed distance past the nearer limit [..., 29] (positive past it) of hinge angles [..., 29]."""
    rng = torch.as_tensor(model.dof_range[6:], dtype=torch.float64)
    j = torch.as_tensor(joints, dtype=torch.float64)
    return torch.maximum(j - rng[:, 1], rng[:, 0] - j)


def _loss(q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """Final angles and (scaled) rates of the pushed joints."""
    return q[:, [7 + j for j in PUSHED]].sum(1) + 0.01 * qd[:, [6 + j for j in PUSHED]].sum(1)


def _rollout(step_fn, model, q, qd, targets, trace: list | None = None):
    for t in range(targets.shape[1]):
        q, qd, _ = step_fn(model, q, qd, targets[:, t])
        if trace is not None:
            trace.append(q.detach())
    return q, qd


@pytest.fixture(scope="module")
def gradients(g1_model):
    """Warp (float32 tape) and float64 reference autograd gradients of the loss w.r.t. the targets, and the states."""
    q0, tg = _scenario()
    tw = tg.float().requires_grad_(True)
    _loss(*_rollout(step, g1_model, q0.float(), torch.zeros(1, g1_model.nv), tw)).sum().backward()
    tr = tg.clone().requires_grad_(True)
    trace: list = []
    _loss(*_rollout(reference.step, g1_model, q0, torch.zeros(1, g1_model.nv, dtype=torch.float64), tr, trace)
          ).sum().backward()
    return tw.grad.double(), tr.grad, torch.cat(trace, 0)


def test_scenario_keeps_the_limits_active(g1_model, gradients):
    """The pushed joints sit at (within 0.02 rad of) their limits from the second step on, past them in 48 of the 56
    joint-steps (by up to 0.007 rad; 0.045 with the dampers alone), the others far inside."""
    viol = _violation(g1_model, gradients[2][:, 7:])  # [T, 29]
    assert bool((viol[1:, PUSHED] > -MJ_ACTIVE_TOL).all()), viol[:, PUSHED]
    assert int((viol[:, PUSHED] > 0).sum()) >= 0.75 * T * len(PUSHED)
    others = [j for j in range(29) if j not in PUSHED]
    assert float(viol[:, others].max()) < -0.2
    # the limits take the targets' effect: targets of a pushed joint move it far less than those of a free one
    g_wp = gradients[0][0]  # [T, 29]
    assert float(g_wp[:, PUSHED].abs().sum(0).max()) < 0.03  # measured 0.008 (0.06-0.2 with the dampers alone)


def test_gradient_through_active_limits_matches_finite_differences(g1_model, gradients):
    q0, tg = _scenario()
    gen = torch.Generator().manual_seed(1)
    dirs = torch.randn(3, 1, T, g1_model.nu, generator=gen, dtype=torch.float64)
    dirs /= dirs.flatten(1).norm(dim=1)[:, None, None, None]
    eps = 1e-5
    tt = torch.cat([tg + eps * dirs[:, 0], tg - eps * dirs[:, 0]], 0)
    with torch.no_grad():
        loss = _loss(*_rollout(reference.step, g1_model, q0.repeat(6, 1),
                               torch.zeros(6, g1_model.nv, dtype=torch.float64), tt))
    fd = (loss[:3] - loss[3:]) / (2 * eps)
    analytic = (gradients[0][None] * dirs).flatten(1).sum(1)
    scale = analytic.abs().max()
    assert scale > 5e-4  # measured 8.1e-4
    assert ((analytic - fd).abs() / scale).max() < FD_REL, (analytic, fd)


def test_warp_gradient_equals_float64_reference_gradient(gradients):
    g_wp, g_ref, _ = gradients
    rel = (g_wp - g_ref).norm() / g_ref.norm()
    assert rel < GRAD_REL, rel


def test_limits_change_the_gradient(g1_model, gradients):
    """Without limits the same rollout has a clearly different gradient (the check above is about the limits)."""
    free = g1_model.without_joint_limits()
    q0, tg = _scenario()
    tr = tg.clone().requires_grad_(True)
    _loss(*_rollout(reference.step, free, q0, torch.zeros(1, free.nv, dtype=torch.float64), tr)).sum().backward()
    assert float((tr.grad - gradients[1]).norm()) > 0.5 * float(gradients[1].norm())


def test_mujoco_agrees_on_active_limits(g1_model, g1_mj):
    """0.5 s holding the targets past the limits, free root in the air, in bcg and in C MuJoCo (5 ms steps)."""
    import mujoco

    q0, tg = _scenario(steps=1, noise=0.0)
    assert [g1_mj.joint(g1_mj.actuator_trnid[a, 0]).name for a in range(g1_mj.nu)] == list(g1.JOINT_NAMES)
    m = mujoco.MjModel.from_xml_path(str(g1.MJCF_PATH))  # no floor
    m.opt.timestep = 0.005
    d = mujoco.MjData(m)
    d.qpos[:] = q0[0].numpy()
    d.ctrl[:] = tg[0, 0].numpy()
    n = round(0.5 / g1_model.params.control_dt)
    for _ in range(round(0.5 / m.opt.timestep)):
        mujoco.mj_step(m, d)
    q, qd = q0.float(), torch.zeros(1, g1_model.nv)
    with torch.no_grad():
        for _ in range(n):
            q, qd, _ = step(g1_model, q, qd, tg[:, 0].float())
    ours, theirs = q[0, 7:].double().numpy(), d.qpos[7:].copy()
    active_ours = set(np.nonzero(_violation(g1_model, ours).numpy() > -MJ_ACTIVE_TOL)[0].tolist())
    active_theirs = set(np.nonzero(_violation(g1_model, theirs).numpy() > -MJ_ACTIVE_TOL)[0].tolist())
    assert active_ours == active_theirs == set(PUSHED), (active_ours, active_theirs)
    diff = np.abs(ours - theirs)
    ankle = g1.JOINT_NAMES.index("left_ankle_roll_joint")
    assert diff[ankle] < MJ_ANKLE_ROLL, diff[ankle]
    diff[ankle] = 0.0
    assert diff.max() < MJ_JOINT_POS, (g1.JOINT_NAMES[int(diff.argmax())], diff.max())


# ---- saturated random actions in the tracking envs --------------------------------------------------------------
CLIPS = ("Run", "Jump", "Fight", "Dance")
LAWS = ("uniform", "sign")


def _stress(clip: str, law: str, steps: int, num_envs: int = 16, seed: int = 0, mujoco: bool = False,
            **env_kwargs: float) -> tuple[float, int, float]:
    """Random actions ("uniform": i.i.d. U[-1, 1], the action Box; "sign": i.i.d. +-1) for ``steps`` control steps.

    Returns (the largest joint-limit violation [rad] of any finite state the simulator produced, over all steps and
    environments (read inside the transition function, so states of environments that autoreset count too); the
    environments' instability resets, the sum of ``info["num_unstable"]``; the 99th percentile over steps of the
    largest violation of the step [rad]). ``env_kwargs`` go to the environment (e.g. ``substeps``, ``sim_dt``).
    ``mujoco``: step the same environments in MuJoCo (``MujocoTransition``) instead of our simulator.
    """
    import gymnasium as gym

    import bcg  # noqa: F401  (registers the ids)
    from bcg.envs import simulator_step

    produced: dict[str, torch.Tensor] = {}

    inner = simulator_step
    if mujoco:
        from bcg.evaluation.mujoco_transfer import MujocoTransition

        mj = MujocoTransition(num_envs, substeps=int(env_kwargs.get("substeps", 4)),
                              timestep=float(env_kwargs.get("sim_dt", 0.005)))

        def inner(model, q, qd, targets, physics=None, *, env_ids, memory):
            return mj(model, q, qd, targets, physics, env_ids=ids, memory=memory)

    ids = torch.arange(num_envs)

    def recording_step(model, q, qd, targets, physics=None, *, env_ids, memory):
        out = inner(model, q, qd, targets, physics, env_ids=env_ids, memory=memory)
        produced["q"] = out[0]
        return out

    env = gym.make_vec(f"BCG-G1-{clip}-v0", num_envs=num_envs, vectorization_mode="vector_entry_point",
                       transition_fn=recording_step, **env_kwargs)
    env.reset(seed=seed)
    limited = np.nonzero(env.model.dof_limited)[0]
    lo = torch.as_tensor(env.model.dof_range[limited, 0])
    hi = torch.as_tensor(env.model.dof_range[limited, 1])
    gen = torch.Generator().manual_seed(seed + 1)
    per_step, unstable = [], 0
    for _ in range(steps):
        a = 2 * torch.rand(num_envs, env.model.nu, generator=gen) - 1
        if law == "sign":
            a = torch.sign(a)
        _, _, _, _, info = env.step(a)
        unstable += int(info["num_unstable"])
        q = produced["q"][:, limited + 1].double()
        q = q[torch.isfinite(q).all(1)]
        per_step.append(float(torch.maximum(q - hi, lo - q).max()) if len(q) else 0.0)
    env.close()
    return max(per_step), unstable, float(np.quantile(per_step, 0.99))


def _pd_replay(model, motion, steps: int) -> tuple[float, bool]:
    """Plain bcg.sim.step from the clip's first frame, PD targets = the reference joint angles of the next frame.

    Returns (largest joint-limit violation over the replay [rad], whether every state stayed finite)."""
    q = motion.qpos[:1].float()
    qd = motion.qvel[:1].float()
    worst, finite = -np.inf, True
    with torch.no_grad():
        for t in range(steps):
            q, qd, _ = step(model, q, qd, motion.qpos[t + 1: t + 2, 7:].float())
            if not bool(torch.isfinite(q).all() and torch.isfinite(qd).all()):
                return worst, False
            worst = max(worst, float(_violation(model, q[0, 7:].double()).max()))
    return worst, finite


# Measured with the joint-limit guard (16 envs, seed 0, CPU): (largest violation [rad], instability resets, p99 over
# steps of the step's largest violation [rad]). Issue 7's bound -- within range + 0.05 rad, no NaN-guard hit -- is met
# on every clip: joints pressed into their limits rest within 8 mrad of them (one flung joint reached 12 mrad). With the dampers alone (before the
# guard; the torque-speed envelope in place) the largest violation was 0.22-0.35 rad and the p99 0.073-0.126 rad,
# from joints flung past their limits by the contact impulses and by their neighbours; before the envelope too,
# 1.1-45 rad with 10-234 resets. The bounds below are regression bounds (1.25x the measurement).
STRESS_MEASURED: dict[tuple[str, str], tuple[float, int, float]] = {
    ("Run", "uniform"): (0.0077, 0, 0.0065),  # dampers alone: (0.2334, 0, 0.0753); before the envelope (1.1346, 12, 0.1158)
    ("Run", "sign"): (0.0079, 0, 0.0070),  # (0.2909, 0, 0.1262); (39.4554, 234, 0.4007)
    ("Jump", "uniform"): (0.0076, 0, 0.0065),  # (0.2525, 0, 0.0785); (25.2706, 17, 0.113)
    ("Jump", "sign"): (0.0118, 0, 0.0069),  # (0.2879, 0, 0.1206); (5.9139, 232, 0.4396)
    ("Fight", "uniform"): (0.0077, 0, 0.0066),  # (0.2361, 0, 0.0754); (14.1071, 13, 0.1282)
    ("Fight", "sign"): (0.0077, 0, 0.0069),  # (0.3488, 0, 0.1160); (19.3698, 216, 0.4315)
    ("Dance", "uniform"): (0.0077, 0, 0.0065),  # (0.2185, 0, 0.0731); (3.0091, 10, 0.1193)
    ("Dance", "sign"): (0.0080, 0, 0.0069),  # (0.3237, 0, 0.1234); (45.2644, 168, 0.3438)
}
STRESS_LIGHT_MEASURED: dict[str, tuple[float, int, float]] = {  # Run clip, 500 steps
    # with the guard; seeds 1 and 2 give 0.0071 / 0 / 0.0067 and 0.0077 / 0 / 0.0073 (uniform), 0.0077 / 0 / 0.0070
    # and 0.0071 / 0 / 0.0068 (+-1). With the dampers alone: (0.1022, 0, 0.0762) and (0.2760, 0, 0.1384).
    "uniform": (0.0066, 0, 0.0062),
    "sign": (0.0074, 0, 0.0071),
}
ISSUE_BOUND = 0.05
"""Issue 7: joint positions within range + 0.05 rad under saturated random actions, no NaN-guard hit."""


def _check_stress(measured: tuple[float, int, float], got: tuple[float, int, float]) -> None:
    worst, resets, p99 = got
    assert worst < ISSUE_BOUND, f"largest violation {worst:.4f} rad, issue 7 asks for < {ISSUE_BOUND}"
    assert worst < 1.25 * measured[0], f"largest violation {worst:.4f} rad, measured {measured[0]}"
    slack = 2 if measured[1] else 0  # none measured: none allowed
    assert resets <= int(1.25 * measured[1]) + slack, f"{resets} instability resets, measured {measured[1]}"
    assert p99 < 1.25 * measured[2], f"p99 violation {p99:.4f} rad, measured {measured[2]}"


@pytest.mark.parametrize("law", LAWS)
def test_random_actions_light(law):
    """Run clip, 500 steps x 16 envs (about 5 s per law): issue 7's bound, and 1.25x the measurement."""
    _check_stress(STRESS_LIGHT_MEASURED[law], _stress("Run", law, 500))


# MuJoCo (5 ms implicitfast, its default soft limits) on the same environments, actions and seed, 200 steps:
# largest violation / resets / p99 measured MUJOCO_LIGHT_MEASURED; ours STRESS_200_MEASURED. MuJoCo's limits are
# soft against the actuators' saturated push (their softness scales with the joint's effective inertia); ours are
# implicit dampers plus the guard's hard stop after the contact solve, and the envelope keeps our joints at
# resolvable speeds.
MUJOCO_LIGHT_MEASURED = {"uniform": (1.1667, 6, 1.0337), "sign": (29.5515, 45, 2.8061)}
STRESS_200_MEASURED = {"uniform": (0.0062, 0, 0.0061), "sign": (0.0074, 0, 0.0072)}


@pytest.mark.parametrize("law", LAWS)
def test_random_actions_violate_limits_less_than_mujoco(law):
    """Run clip, 200 steps x 16 envs in both simulators (about 10 s per law)."""
    ours = _stress("Run", law, 200)
    theirs = _stress("Run", law, 200, mujoco=True)
    _check_stress(STRESS_200_MEASURED[law], ours)
    assert ours[2] < 0.01 * theirs[2], (ours, theirs)  # measured 0.0061 / 1.03 and 0.0072 / 2.81 rad
    assert theirs[1] >= MUJOCO_LIGHT_MEASURED[law][1] // 2, theirs  # MuJoCo's NaN-guard resets: 6 and 45


@pytest.mark.slow
@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("clip", CLIPS)
def test_random_actions_8000_steps(clip, law):
    """8000 steps x 16 envs per clip and law (about 1-1.5 min each on one CPU core); see STRESS_MEASURED."""
    _check_stress(STRESS_MEASURED[clip, law], _stress(clip, law, 8000))


FINE_SUBSTEPS = dict(substeps=8, sim_dt=0.0025)
"""8 substeps of 2.5 ms per 20 ms control step (twice the cost). Run clip, 500 steps, seed 0, with the guard: largest
violation 0.0078 rad (uniform), 0.0088 (+-1), no reset (with the dampers alone 0.057 / 0.070 rad: before the guard
the finer step was the only way to the issue's bound)."""


@pytest.mark.slow
@pytest.mark.parametrize("law, worst_measured", [("uniform", 0.0078), ("sign", 0.0088)])
def test_random_actions_at_fine_substeps(law, worst_measured):
    """Run clip, 500 steps x 16 envs, 2.5 ms substeps (about 10 s each): the guard holds at a finer step too."""
    worst, resets, p99 = _stress("Run", law, 500, **FINE_SUBSTEPS)
    assert resets == 0, resets
    assert worst < min(ISSUE_BOUND, 1.25 * worst_measured), worst


# PD replay of the packaged clips (15 s, 750 control steps each, plain bcg.sim.step from the first frame, targets =
# the next frame's reference joint angles): largest violation measured 0.0068 (run), 0.0059 (jump), 0.0068 (fight),
# 0.0061 rad (dance), every state finite (with the dampers alone 0.0215 / 0.0124 / 0.0144 / 0.0119). The reference
# clips themselves stay inside the ranges.
REPLAY_VIOLATION = 0.009


@pytest.mark.parametrize("clip", ["Run", pytest.param("Jump", marks=pytest.mark.slow),
                                  pytest.param("Fight", marks=pytest.mark.slow),
                                  pytest.param("Dance", marks=pytest.mark.slow)])
def test_pd_replay_of_clip_stays_in_range(clip):
    import gymnasium as gym

    import bcg  # noqa: F401

    env = gym.make_vec(f"BCG-G1-{clip}-v0", num_envs=1, vectorization_mode="vector_entry_point")
    motion = env.motion
    assert motion.num_frames - 1 >= round(15.0 / env.model.params.control_dt)
    assert float(_violation(env.model, motion.qpos[:, 7:].double()).max()) < 1e-6
    worst, finite = _pd_replay(env.model, motion, motion.num_frames - 1)
    assert finite
    assert worst < REPLAY_VIOLATION, worst


def test_guard_off_leaves_the_dampers_alone(g1_model):
    """``limit_guard_window=0`` turns the guard off: Warp still equals the float64 reference, and the pushed joints
    go as far past their limits as with the dampers alone (0.045 rad measured, against 0.007 with the guard)."""
    from bcg.sim import load_model

    off = load_model(limit_guard_window=0.0)
    q0, tg = _scenario()
    with torch.no_grad():
        trace_wp: list = []
        _rollout(step, off, q0.float(), torch.zeros(1, off.nv), tg.float(), trace_wp)
        trace_ref: list = []
        _rollout(reference.step, off, q0, torch.zeros(1, off.nv, dtype=torch.float64), tg, trace_ref)
        trace_on: list = []
        _rollout(reference.step, g1_model, q0, torch.zeros(1, off.nv, dtype=torch.float64), tg, trace_on)
    q_wp, q_ref, q_on = (torch.cat(t, 0).double() for t in (trace_wp, trace_ref, trace_on))
    assert float((q_wp - q_ref).abs().max()) < 1e-6  # measured 3.6e-7
    worst_off = float(_violation(off, q_ref[:, 7:])[:, PUSHED].max())
    worst_on = float(_violation(g1_model, q_on[:, 7:])[:, PUSHED].max())
    assert worst_off > 0.04 and worst_on < 0.01, (worst_off, worst_on)  # measured 0.0453 and 0.0069
