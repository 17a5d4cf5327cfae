"""Gymnasium environments: registration, vector env semantics, determinism, NaN guard, observation vs MuJoCo,
domain randomisation, single env and the Gymnasium / SB3 environment checkers."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.envs.registration import ENV_IDS, register_envs

ID = "BCG-G1-Run-v0"


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=1.0)


def make_vec(motion_path: Path, n: int = 3, **kw):
    register_envs()
    return gym.make_vec(ID, num_envs=n, vectorization_mode="vector_entry_point", motion_file=str(motion_path), **kw)


def test_registration_is_idempotent_and_complete() -> None:
    register_envs()
    register_envs()
    for env_id, clip in ENV_IDS.items():
        spec = gym.spec(env_id)
        assert spec.vector_entry_point == "bcg.envs.vector_env:G1TrackingVectorEnv"
        assert spec.kwargs["default_motion"] == clip


def test_make_vec_is_native_batched_env(motion_path: Path) -> None:
    from bcg.envs.vector_env import G1TrackingVectorEnv
    from bcg.sim import SimModel

    env = make_vec(motion_path, 3)
    assert isinstance(env, G1TrackingVectorEnv)
    assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
    assert isinstance(env.model, SimModel)
    assert env.motion.num_frames == 51
    obs, info = env.reset(seed=0)
    assert obs.shape == (3, env.obs_dim) and obs.dtype == torch.float32
    assert env.obs_dim == 849  # docs/method.md §7.1 for the G1, derived from the model
    assert env.single_action_space.shape == (29,)
    names = [n for n, _ in env.observation_layout]
    assert names[0] == "root_height" and names[-1] == "ref3_key_pos_h"
    short = make_vec(motion_path, 1, ref_steps=2)
    assert short.obs_dim == 849 - 204


def _rollout(env, seed: int, steps: int, action_seed: int = 0):
    obs, _ = env.reset(seed=seed)
    g = torch.Generator().manual_seed(action_seed)
    out = [obs]
    rews = []
    for _ in range(steps):
        a = torch.randn(env.num_envs, 29, generator=g) * 0.3
        obs, r, te, tr, info = env.step(a)
        out.append(obs)
        rews.append(r)
    return torch.stack(out), torch.stack(rews)


def test_determinism_for_fixed_seed(motion_path: Path) -> None:
    a = _rollout(make_vec(motion_path, 3), seed=7, steps=12)
    b = _rollout(make_vec(motion_path, 3), seed=7, steps=12)
    c = _rollout(make_vec(motion_path, 3), seed=8, steps=12)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    assert not torch.equal(a[0][0], c[0][0])


def test_autoreset_same_step_truncation_and_termination(motion_path: Path) -> None:
    env = make_vec(motion_path, 3)
    env.reset(seed=1)
    last = env.num_frames - 1
    q = env.q.clone()
    q[2, 0] += 2.0  # env 2: 2 m away from its reference -> terminated after the step
    env.load_state(dataclasses.replace(env.state, frame=torch.tensor([last - 1, 10, 20]), q=q))
    obs, rew, term, trunc, info = env.step(torch.zeros(3, 29))
    assert trunc.tolist() == [True, False, False]
    assert term.tolist() == [False, False, True]
    assert not bool((term & trunc).any())
    assert info["_final_obs"].tolist() == [True, False, True]
    assert not info["fell"][2]
    # finished envs were reset in the same step: a new episode, a fresh frame, a different observation
    assert env.frame[0] < last and env.episode_steps[0] == 0 and env.episode_steps[1] == 1
    assert not torch.allclose(obs[0], info["final_obs"][0])
    torch.testing.assert_close(obs[1], info["final_obs"][1])
    assert env.q[2, 0] < 1.5
    # the returned obs of a reset env is the observation of its new state
    torch.testing.assert_close(obs, env.observe(), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(rew).all()


def test_fall_terminates(motion_path: Path) -> None:
    env = make_vec(motion_path, 2, termination_height=1.0)  # the standing pelvis (0.79 m) counts as fallen
    env.reset(seed=0)
    _, _, term, trunc, info = env.step(torch.zeros(2, 29))
    assert term.all() and info["fell"].all() and not trunc.any()


def test_max_episode_steps_truncates(motion_path: Path) -> None:
    env = make_vec(motion_path, 2, max_episode_steps=3)
    env.reset(seed=0)
    env.load_state(dataclasses.replace(env.state, frame=torch.zeros(2, dtype=torch.long)))
    for _k in range(3):
        _, _, term, trunc, _ = env.step(torch.zeros(2, 29))
    assert trunc.all() and not term.any()


def test_actions_are_validated(motion_path: Path) -> None:
    env = make_vec(motion_path, 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(2, 28))
    bad = torch.zeros(2, 29)
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        env.step(bad)
    with pytest.raises(RuntimeError, match="reset"):
        make_vec(motion_path, 1).step(torch.zeros(1, 29))


def test_no_grad_mode_keeps_no_graph(motion_path: Path) -> None:
    env = make_vec(motion_path, 2)
    env.reset(seed=0)
    a = torch.zeros(2, 29, requires_grad=True)
    obs, rew, *_ = env.step(a)
    assert not obs.requires_grad and not rew.requires_grad and not env.q.requires_grad


def test_differentiable_step_reaches_actions_and_state(motion_path: Path) -> None:
    env = make_vec(motion_path, 2, differentiable=True)
    env.reset(seed=0)
    q, qd = env.get_state()
    q0, qd0 = q.clone().requires_grad_(True), qd.clone().requires_grad_(True)
    env.set_state(q0, qd0)
    a = torch.zeros(2, 29, requires_grad=True)
    obs, rew, *_ = env.step(a)
    (rew.sum() + obs.pow(2).mean()).backward()
    for t in (a, q0, qd0):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
    env.detach()
    assert not env.q.requires_grad


def test_unstable_state_is_reset_before_the_simulator(motion_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state beyond bcg.sim.MAX_SPEED (or NaN) never reaches the simulator: the env resets it first and counts it."""
    import bcg.sim

    env = make_vec(motion_path, 4)
    env.reset(seed=3)
    env.step(torch.zeros(4, 29))
    q, qd = env.get_state()
    qd = qd.clone()
    qd[0, 10] = 1.01 * bcg.sim.MAX_SPEED  # too fast for the simulator
    q = q.clone()
    q[2, 5] = float("nan")
    q[1, 3:7] = 0.0  # a zero root quaternion, which the simulator refuses too
    env.set_state(q, qd)
    seen = []
    real = bcg.sim.step
    monkeypatch.setattr(bcg.sim, "step", lambda m, q, qd, *a: seen.append(float(qd.abs().max())) or real(m, q, qd, *a))
    obs, rew, term, trunc, info = env.step(torch.zeros(4, 29))
    assert seen and seen[0] < bcg.sim.MAX_SPEED
    assert info["unstable_reset"].tolist() == [True, True, True, False] and info["num_unstable"] == 3
    assert env.nonfinite_count == 3 and torch.isfinite(obs).all() and torch.isfinite(rew).all()
    assert env.episode_steps.tolist() == [1, 1, 1, 2]  # envs 0-2 began new episodes before this step


def test_diverged_step_terminates_and_blocks_gradient(motion_path: Path) -> None:
    """A step that diverges inside the physics (here: a transition function returning NaN for env 0) ends that
    episode with reward 0 and no gradient; the other environment's values and gradients are untouched."""
    from bcg.envs.transition import simulator_step

    def nan_row0(model, q, qd, targets, physics=None, *, env_ids, memory):
        q1, qd1, contact, mem = simulator_step(model, q, qd, targets, physics)
        return q1, torch.where((env_ids == 0)[:, None], torch.full_like(qd1, float("nan")), qd1), contact, mem

    def run(fn):
        env = make_vec(motion_path, 2, differentiable=True)
        if fn is not None:
            env.transition_fn = fn
        env.reset(seed=3)
        a = torch.full((2, 29), 0.1, requires_grad=True)
        obs, rew, term, trunc, info = env.step(a)
        rew.sum().backward()
        return obs, rew, term, info, a.grad, env

    obs, rew, term, info, grad, env = run(nan_row0)
    obs_ref, rew_ref, _, _, grad_ref, _ = run(None)
    assert info["nonfinite"].tolist() == [True, False] and info["num_unstable"] == 1
    assert term[0] and rew[0] == 0 and env.nonfinite_count == 1
    assert torch.isfinite(obs).all() and torch.isfinite(grad).all()
    assert torch.all(grad[0] == 0) and grad[1].abs().sum() > 0
    torch.testing.assert_close(grad[1], grad_ref[1], rtol=0, atol=0)
    torch.testing.assert_close(rew[1], rew_ref[1], rtol=0, atol=0)
    torch.testing.assert_close(obs[1], obs_ref[1], rtol=0, atol=0)
    assert env.q[0].abs().max() < 10 and env.episode_steps[0] == 0  # autoreset: a new episode


def _tan_norm(R: np.ndarray) -> np.ndarray:
    return np.concatenate([R[..., :, 0], R[..., :, 2]], -1)


def _heading_inv(R: np.ndarray) -> np.ndarray:
    yaw = np.arctan2(R[1, 0], R[0, 0])
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])


def _mj_robot_terms(mj, d, q, qd):
    import mujoco

    from bcg.robots.g1 import KEY_BODIES

    d.qpos[:], d.qvel[:] = q, qd
    mujoco.mj_kinematics(mj, d)
    R = d.xmat[1:].reshape(-1, 3, 3)
    p = d.xpos[1:]
    Hi = _heading_inv(R[0])
    keys = np.stack([p[mj.body(k.body).id - 1] + R[mj.body(k.body).id - 1] @ np.array(k.offset) for k in KEY_BODIES])
    return R, p, Hi, keys


def test_observation_matches_mujoco_recomputation(motion_path: Path, g1_mj) -> None:
    import mujoco

    env = make_vec(motion_path, 2)
    env.reset(seed=5)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        obs, *_ = env.step(torch.randn(2, 29, generator=g) * 0.5)
    d = mujoco.MjData(g1_mj)
    qs, qds = env.q.double().numpy(), env.qd.double().numpy()
    ref_q = env.motion.qpos.double().numpy()
    worst = 0.0
    for i in range(2):
        R, p, Hi, keys = _mj_robot_terms(g1_mj, d, qs[i], qds[i])
        root = qs[i, :3]
        parts = [
            [qs[i, 2]],
            _tan_norm(Hi @ R[0]),
            Hi @ qds[i, 0:3],
            Hi @ R[0] @ qds[i, 3:6],
            _tan_norm(Hi[None] @ R).ravel(),
            qds[i, 6:],
            ((keys - root) @ Hi.T).ravel(),
        ]
        for k in (1, 2, 3):
            f = min(int(env.frame[i]) + k, env.num_frames - 1)
            Rr, pr, Hr, keys_r = _mj_robot_terms(g1_mj, d, ref_q[f], np.zeros(35))
            parts += [Hi @ (ref_q[f, :3] - root), _tan_norm(Hi @ Rr[0]), _tan_norm(Hr[None] @ Rr).ravel(),
                      ((keys_r - root) @ Hi.T).ravel()]
        expected = np.concatenate([np.ravel(x) for x in parts])
        assert expected.shape == (env.obs_dim,)
        worst = max(worst, float(np.abs(obs[i].double().numpy() - expected).max()))
    assert worst < 2e-5, worst


def test_domain_randomization(motion_path: Path) -> None:
    from bcg.envs.randomization import DomainRandomization

    dr = DomainRandomization(push_interval=(0.04, 0.06))
    env = make_vec(motion_path, 4, domain_randomization=dr)
    obs, info = env.reset(seed=11)
    ph, base = env.physics, env.model
    # physical parameters: one independent draw per environment, within the docs/method.md §7.3 ranges
    assert ph is not None and ((ph.mu >= 0.3) & (ph.mu <= 1.2)).all() and ph.mu.unique().numel() == 4
    ratio = ph.kp / torch.as_tensor(base.kp, dtype=torch.float32)
    assert torch.allclose(ratio, ratio[:, :1]) and ((ratio >= 0.8) & (ratio <= 1.2)).all()
    assert ratio[:, 0].unique().numel() == 4
    scale = ph.body_mass[:, 1:] / torch.as_tensor(base.body_mass[1:], dtype=torch.float32)
    assert ((scale >= 0.8 - 1e-6) & (scale <= 1.2 + 1e-6)).all()
    dm = ph.body_mass[:, 0] - float(base.body_mass[0]) * 1.0
    assert (dm.abs() <= 3.0 + 0.2 * float(base.body_mass[0])).all() and dm.unique().numel() == 4
    assert (ph.body_com - torch.as_tensor(base.body_com, dtype=torch.float32)).abs().max() <= 0.03 + 1e-6
    assert env.joint_offset.abs().max() <= 0.01 and env.joint_offset.abs().max() > 0
    # observation noise: critic_obs is clean, the difference is within the per-term half-widths
    noise = obs - info["critic_obs"]
    assert bool((noise.abs() <= env.obs_noise.half_width + 1e-6).all()) and noise.abs().max() > 0
    # pushes every 2-3 steps change the velocity; episodes and draws are reproducible
    for _ in range(4):
        obs, r, *_ = env.step(torch.zeros(4, 29))
    again = make_vec(motion_path, 4, domain_randomization=dr)
    obs2, _ = again.reset(seed=11)
    for _ in range(4):
        obs2, r2, *_ = again.step(torch.zeros(4, 29))
    torch.testing.assert_close(obs, obs2, rtol=0, atol=0)
    torch.testing.assert_close(again.physics.mu, env.physics.mu, rtol=0, atol=0)
    # a partial reset redraws the reset environment's parameters only
    before = again.physics.mu.clone()
    again.reset(options={"reset_mask": np.array([True, False, False, False])})
    assert again.physics.mu[0] != before[0] and torch.equal(again.physics.mu[1:], before[1:])


def test_contact_and_torque_limit_draws(motion_path: Path) -> None:
    """The contact draws: the Baumgarte factor within its range, a soft ground (g_free = the impedance, g_start =
    2 h / T - i for T in its range) for about the asked share, the model's own contact for the rest; the draws
    before them are those of the ranges without contact draws (same seed), so existing runs keep their numbers. The
    torque limits' and the contact dropout's draws within their ranges."""
    import dataclasses

    from bcg.envs.randomization import DomainRandomization
    from bcg.sim import default_physics

    n = 64
    dr = DomainRandomization(contact_beta=(0.1, 0.5), contact_soft_timeconst=(0.01, 0.03), contact_soft_share=0.5)
    env = make_vec(motion_path, n, domain_randomization=dr)
    env.reset(seed=3)
    g = env.physics.contact_bias
    p = env.model.params
    assert ((g[:, 2] >= 0.1) & (g[:, 2] <= 0.5)).all() and g[:, 2].unique().numel() == n
    soft = g[:, 1] != 0
    assert 16 <= int(soft.sum()) <= 48  # Binomial(64, 0.5): outside in 1e-4 of seeds
    assert torch.equal(g[~soft, 0], torch.ones(int((~soft).sum())))
    torch.testing.assert_close(g[soft, 0], torch.full((int(soft.sum()),), p.soft_impedance))
    t = 2 * p.dt / (g[soft, 1] + p.soft_impedance)  # the time constant back from g_start
    assert ((t >= 0.01 - 1e-6) & (t <= 0.03 + 1e-6)).all()
    plain = make_vec(motion_path, n, domain_randomization=dataclasses.replace(
        dr, contact_beta=None, contact_soft_timeconst=None))
    plain.reset(seed=3)
    for name in plain.physics._fields:
        if name != "contact_bias":
            assert torch.equal(getattr(plain.physics, name), getattr(env.physics, name)), name
    tl = make_vec(motion_path, 4, domain_randomization=DomainRandomization(torque_limit_scale=(0.85, 1.2)))
    tl.reset(seed=3)
    scale = tl.physics.torque_limit / default_physics(tl.model, 4).torque_limit
    assert ((scale >= 0.85 - 1e-6) & (scale <= 1.2 + 1e-6)).all() and scale.unique().numel() == scale.numel()
    drop = make_vec(motion_path, n, domain_randomization=DomainRandomization(dropout_probability=(0.2, 0.6)))
    drop.reset(seed=3)
    p_drop = drop.physics.contact_dropout
    assert ((p_drop >= 0.2) & (p_drop <= 0.6)).all() and p_drop.unique().numel() == n
    assert torch.equal(tl.physics.contact_dropout, torch.zeros(4))  # off: the model's own, never
    with pytest.raises(ValueError, match=r"dropout_probability must lie in \[0, 1\]"):
        DomainRandomization(dropout_probability=(0.5, 1.5))
    with pytest.raises(ValueError, match="contact_beta must lie in"):
        DomainRandomization(contact_beta=(0.2, 1.5))
    with pytest.raises(ValueError, match="at least|>= 2 substeps"):
        make_vec(motion_path, 2, domain_randomization=DomainRandomization(
            contact_soft_timeconst=(0.005, 0.02))).reset(seed=0)


def test_reward_callable_and_features(motion_path: Path) -> None:
    seen = {}

    def reward(sim, ref, ctx):
        seen["shapes"] = (sim.key_pos_w.shape, ref.body_rot_w.shape, ctx.actions.shape)
        return -(sim.joint_pos - ref.joint_pos).pow(2).sum(1)

    env = make_vec(motion_path, 2, reward=reward)
    env.reset(seed=0)
    _, rew, *_ = env.step(torch.zeros(2, 29))
    assert seen["shapes"] == ((2, 5, 3), (2, 30, 3, 3), (2, 29))
    # the env returns what the callable computed, on the stepped state and the next reference frame
    expected = -(env.q[:, 7:] - env.motion.qpos[env.frame, 7:]).pow(2).sum(1)
    torch.testing.assert_close(rew, expected, rtol=1e-5, atol=1e-6)
    assert (rew < 0).all()
    with pytest.raises(ValueError, match="reward"):
        make_vec(motion_path, 1, reward="nope")


def test_tracking_reward_is_one_at_the_reference(motion_path: Path) -> None:
    from bcg.envs.rewards import StepContext, TrackingReward

    env = make_vec(motion_path, 2)
    env.reset(seed=0)
    ref = env.ref_features(torch.tensor([3, 9]))
    z = torch.zeros(2, 29)
    r = TrackingReward()(ref, ref, StepContext(z, z, None))
    torch.testing.assert_close(r, torch.ones(2))


# ---------------------------------------------------------------------------------------------- single env


def test_single_env_check_env(motion_path: Path) -> None:
    from gymnasium.utils.env_checker import check_env

    register_envs()
    env = gym.make(ID, motion_file=str(motion_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", category=UserWarning)
        check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (849,)
    obs, r, term, trunc, info = env.step(env.action_space.sample())
    assert isinstance(r, float) and isinstance(term, bool) and "nonfinite" in info


def test_sb3_check_env(motion_path: Path) -> None:
    from stable_baselines3.common.env_checker import check_env

    register_envs()
    check_env(gym.make(ID, motion_file=str(motion_path)).unwrapped, warn=True)


@pytest.mark.parametrize("env_id", sorted(ENV_IDS))
def test_check_env_every_id_with_packaged_clip(env_id: str) -> None:
    from gymnasium.utils.env_checker import check_env

    from bcg.motion import packaged_motion_path

    if not packaged_motion_path(ENV_IDS[env_id]).is_file():
        pytest.skip(f"packaged clip {ENV_IDS[env_id]!r} not generated yet")
    register_envs()
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    assert env.unwrapped.motion.num_frames > 100


def test_render_rgb_array(motion_path: Path) -> None:
    from bcg.envs.rendering import RenderingUnavailableError

    register_envs()
    env = gym.make(ID, motion_file=str(motion_path), render_mode="rgb_array")
    env.reset(seed=0)
    try:
        frame = env.render()
    except RenderingUnavailableError as e:
        pytest.skip(str(e))
    assert frame.shape == (480, 640, 3) and frame.dtype == np.uint8 and frame.std() > 1
    env.close()


def test_info_tracking_error_is_the_mean_body_position_error() -> None:
    """info["tracking_error"] [m]: millimetres while following the clip's targets, centimetres off it."""
    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=4)
    env.reset(seed=0)
    s = env.state
    _, _, _, _, info = env.step(env.target_to_action(env.motion.qpos[s.frame + 1, 7:]))
    assert info["tracking_error"].shape == (4,)
    assert float(info["tracking_error"].max()) < 0.004  # measured 1.3-2.4 mm after one step
    for _ in range(2):
        _, _, _, _, info = env.step(torch.full((4, 29), 0.8))
    assert float(info["tracking_error"].min()) > 0.05  # measured 9.1-10.0 cm
