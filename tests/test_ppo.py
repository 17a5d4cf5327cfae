"""PPO on stable-baselines3: end to end on the adapter (with ADD), the adaptive-KL rule, exact resume, export,
learning on a small problem (a constant pose), and refused configs."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.agents.add import ADDConfig
from bcg.agents.base import METRIC_NAMES, Agent
from bcg.agents.ppo import PRESETS, PPOAgent, PPOConfig, adaptive_kl_lr, gaussian_kl
from bcg.envs.config import EnvConfig

TINY = dataclasses.replace(PRESETS["cpu-small"], num_envs=4, n_steps=8, n_epochs=2, n_minibatches=2,
                           actor_hidden=(32, 32), critic_hidden=(32,))


@pytest.fixture(scope="module")
def env_config(tmp_path_factory: pytest.TempPathFactory) -> EnvConfig:
    path = write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=0.6)
    return EnvConfig(motion_file=str(path))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


# ------------------------------------------------------------------------------------------------ adaptive KL


def test_gaussian_kl_is_rsl_rls_expression_and_the_analytic_kl() -> None:
    g = torch.Generator().manual_seed(0)
    mu_old, mu = torch.randn(5, 29, generator=g), torch.randn(5, 29, generator=g)
    s_old, s = torch.rand(5, 29, generator=g) + 0.1, torch.rand(5, 29, generator=g) + 0.1
    exact = torch.distributions.kl_divergence(torch.distributions.Normal(mu_old, s_old),
                                              torch.distributions.Normal(mu, s)).sum(-1)
    kl = gaussian_kl(mu_old, s_old, mu, s)
    # rsl_rl's +1e-5 inside the log: at most 29 * 1e-5 * s_old / s away from the analytic KL
    assert (kl - exact).abs().max() < 29 * 1e-5 * (s_old / s).max()
    # a hand-made case: one dimension, sigma 0.3 -> 0.3, mean shift 0.03: KL = 0.03^2 / (2 0.09) = 0.005
    one = gaussian_kl(torch.tensor([[0.0]]), torch.tensor([[0.3]]), torch.tensor([[0.03]]), torch.tensor([[0.3]]))
    assert abs(float(one) - (0.005 + math.log(1 + 1e-5))) < 1e-7


def test_adaptive_kl_rule_on_hand_made_kls() -> None:
    kw = dict(desired_kl=0.01, factor=1.5, lr_min=1e-5, lr_max=1e-2)
    assert adaptive_kl_lr(1e-3, 0.03, **kw) == pytest.approx(1e-3 / 1.5)      # > 2 KL*: down
    assert adaptive_kl_lr(1e-3, 0.02, **kw) == 1e-3                          # = 2 KL*: unchanged
    assert adaptive_kl_lr(1e-3, 0.01, **kw) == 1e-3                          # in band: unchanged
    assert adaptive_kl_lr(1e-3, 0.004, **kw) == pytest.approx(1.5e-3)        # < KL*/2: up
    assert adaptive_kl_lr(1e-3, 0.0, **kw) == 1e-3                           # KL = 0 is not "0 < KL"
    assert adaptive_kl_lr(1.2e-5, 1.0, **kw) == 1e-5                         # floor
    assert adaptive_kl_lr(9e-3, 1e-4, **kw) == 1e-2                          # ceiling


def test_adaptive_kl_runs_after_every_minibatch(env_config: EnvConfig) -> None:
    """One iteration calls the rule once per minibatch (n_epochs x n_minibatches) with the KL to the rollout policy:
    the first is ~0 (29 * log(1 + 1e-5): the policy has not moved yet); the optimiser's lr follows the rule."""
    agent = PPOAgent(TINY, env_config, seed=0)
    lr0 = agent.model.adaptive_lr
    out = agent.train_iteration()
    kls = agent.model.kl_values
    assert len(kls) == TINY.n_epochs * TINY.n_minibatches
    assert abs(kls[0] - 29 * math.log(1 + 1e-5)) < 1e-6 and all(k >= kls[0] - 1e-6 for k in kls)
    lr = lr0
    for k in kls:
        lr = adaptive_kl_lr(lr, k, TINY.desired_kl, TINY.lr_factor, TINY.lr_min, TINY.lr_max)
    assert out["lr"] == pytest.approx(lr, rel=1e-12) and agent.model.adaptive_lr == pytest.approx(lr, rel=1e-12)
    # SB3 resets the optimiser's lr from its schedule at every train(); ours keeps the adaptive value
    agent.train_iteration()
    assert agent.model.policy.optimizer.param_groups[0]["lr"] == agent.model.adaptive_lr
    fixed = PPOAgent(dataclasses.replace(TINY, adaptive_kl=False), env_config, seed=0)
    assert fixed.train_iteration()["lr"] == TINY.learning_rate and fixed.model.kl_values == []


# ------------------------------------------------------------------------------------------------ end to end


def test_end_to_end_with_add_metrics_and_export(env_config: EnvConfig, tmp_path: Path) -> None:
    from bcg.agents.export import load_policy, save_policy

    agent = PPOAgent(TINY, env_config, add=ADDConfig(hidden=(32,)), seed=0)
    assert isinstance(agent, Agent)
    assert agent.env.reward_fn is agent.add
    outs = [agent.train_iteration() for _ in range(2)]
    assert agent.iteration == 2 and agent.samples == 2 * TINY.num_envs * TINY.n_steps
    for out in outs:
        assert set(METRIC_NAMES) <= set(out)
        for k in ("reward", "tracking_error_cm", "grad_norm", "actor_loss", "critic_loss", "lr", "disc_loss"):
            assert math.isfinite(out[k]), k
        assert out["trigger_rate"] == 0 and out["reward"] > 0 and out["tracking_error_cm"] > 0
        assert out["disc_residuals"] == TINY.num_envs * TINY.n_steps  # one ADD update per rollout, all residuals
    # the 0.6 s clip (30 frames) ends within the 16 steps of two iterations: episodes were recorded
    assert math.isfinite(outs[1]["episode_return"]) or math.isfinite(outs[0]["episode_return"])

    path = save_policy(tmp_path / "ppo.pt", agent.export_policy())
    policy = load_policy(path)
    obs = agent.vec_normalize.get_original_obs()
    with torch.no_grad():
        a = policy(torch.as_tensor(obs))
        norm = torch.as_tensor(agent.vec_normalize.normalize_obs(obs))
        mean = agent.model.policy.get_distribution(norm).distribution.mean
    # float64 statistics in the export vs VecNormalize's numpy float64 path: agree to float32 rounding
    torch.testing.assert_close(a, mean, rtol=1e-4, atol=1e-5)


def test_resume_repeats_the_uninterrupted_run(env_config: EnvConfig) -> None:
    """Checkpoint after one iteration (through torch.save / torch.load(weights_only=True)), restore into a new agent
    made with another seed: the next iterations give the same numbers bit for bit (ADD included)."""
    add = ADDConfig(hidden=(32,), replay_capacity=50, replay_push=8)
    a = PPOAgent(TINY, env_config, add=add, seed=0)
    a.train_iteration()
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    ref = [a.train_iteration() for _ in range(2)]
    b = PPOAgent(TINY, env_config, add=add, seed=7)
    b.load_state_dict(state)
    got = [b.train_iteration() for _ in range(2)]
    for x, y in zip(ref, got, strict=True):
        assert _same(x, y), {k: (x[k], y[k]) for k in x if not _same({k: x[k]}, {k: y[k]})}
    for (n, p), q in zip(a.model.policy.state_dict().items(), b.model.policy.state_dict().values(), strict=True):
        assert torch.equal(p, q), n
    assert np.array_equal(a.vec_normalize.obs_rms.mean, b.vec_normalize.obs_rms.mean)
    assert a.env.state.equal(b.env.state) and a.samples == b.samples and b.iteration == 3


def test_state_refused_by_a_different_agent(env_config: EnvConfig) -> None:
    a = PPOAgent(TINY, env_config, seed=0)
    state = a.state_dict()
    other = PPOAgent(dataclasses.replace(TINY, actor_hidden=(16,)), env_config, seed=0)
    with pytest.raises(ValueError, match="actor_hidden"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="ADD"):
        PPOAgent(TINY, env_config, add=ADDConfig(hidden=(8,)), seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="not a PPO"):
        a.load_state_dict({**state, "agent": "shac"})


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("kw,match", [
    (dict(num_envs=0), "num_envs"),
    (dict(num_envs=5, n_steps=3, n_minibatches=4), "not divisible"),
    (dict(num_envs=1, n_steps=2, n_minibatches=2), "at least 2"),
    (dict(gamma=1.5), "gamma"),
    (dict(gae_lambda=-0.1), "gae_lambda"),
    (dict(learning_rate=0.5), r"\[lr_min, lr_max\]"),
    (dict(desired_kl=0.0), "desired_kl"),
    (dict(lr_factor=1.0), "lr_factor"),
    (dict(activation="gelu"), "activation"),
    (dict(actor_hidden=(64, 0)), "actor_hidden"),
    (dict(clip_range=float("nan")), "clip_range"),
    (dict(init_std=-0.3), "init_std"),
])
def test_config_refuses_bad_values(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kw)


def test_presets() -> None:
    assert PRESETS["paper"].num_envs == 4096 and PRESETS["paper"].batch_size == 4096 * 24 // 4
    assert PRESETS["cpu-small"].num_envs < 256
    assert PRESETS["paper"].init_std == 0.3 and PRESETS["paper"].actor_hidden == (512, 256, 128)


# ------------------------------------------------------------------------------------------------ learning


def _pose_clip(path: Path) -> Path:
    """A constant standing pose with the arms forward and bent (0.3 / 0.2 / 0.3 rad from the default pose)."""
    from bcg.motion import Motion
    from bcg.robots.g1 import JOINT_NAMES, default_qpos

    q = default_qpos().copy()
    j = {n: 7 + i for i, n in enumerate(JOINT_NAMES)}
    for side, s in (("left", 1), ("right", -1)):
        q[j[f"{side}_shoulder_pitch_joint"]] -= 0.3
        q[j[f"{side}_shoulder_roll_joint"]] += s * 0.2
        q[j[f"{side}_elbow_joint"]] -= 0.3
    return Motion.from_qpos(np.repeat(q[None], 101, 0), 0.02, name="pose").save(path)


def _learning_run(path: Path, broken: bool, iterations: int) -> list[float]:
    # a small problem: hold a constant pose (zero action holds the default pose instead: reward 0.46 per step with
    # the initial exploration). Myopic returns (gamma = lambda = 0.5) make it nearly a bandit, and a constant lr:
    # with the paper's gamma 0.99 and the adaptive rule, 46k samples did not improve it (docs/add_ppo.md).
    cfg = dataclasses.replace(PRESETS["cpu-small"], num_envs=64, actor_hidden=(128, 64), critic_hidden=(128, 64),
                              gamma=0.5, gae_lambda=0.5, adaptive_kl=False)
    agent = PPOAgent(cfg, EnvConfig(motion_file=str(path), max_episode_steps=50, action_scale=0.5), seed=0)
    if broken:  # the update computes everything but never changes the parameters (as lr = 0 would)
        agent.model.policy.optimizer.step = lambda *a, **k: None
    return [agent.train_iteration()["reward"] for _ in range(iterations)]


@pytest.mark.slow
def test_ppo_improves_holding_a_pose(tmp_path: Path) -> None:
    path = _pose_clip(tmp_path / "pose.npz")
    good = _learning_run(path, broken=False, iterations=20)
    bad = _learning_run(path, broken=True, iterations=20)
    first, last = np.mean(good[:3]), np.mean(good[-3:])
    print(f"per-step reward: first 3 {first:.3f}, last 3 {last:.3f}; broken update: last 3 {np.mean(bad[-3:]):.3f}")
    # measured (seed 0): first 3 0.458, last 3 0.647; broken update 0.452 (20 iterations of 1536 samples each,
    # 640 s for both runs on the loaded 2-core machine)
    assert last > first + 0.1
    assert last > np.mean(bad[-3:]) + 0.1
