"""The environment's fast paths (issue 12) give the values of the plain ones: the fused torch observation equals the
robot and reference parts built term by term, bit for bit, and the instability check (the Warp launch on the CPU)
flags exactly what the explicit finiteness-and-bounds check flags, including with an infinite ``state_limit``."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from bcg.envs.observations import reference_observation, robot_observation
from bcg.envs.resets import EpisodeStarts
from bcg.envs.vector_env import G1TrackingVectorEnv
from bcg.motion.rotations import heading_inverse, tan_norm


@pytest.fixture(scope="module")
def env() -> G1TrackingVectorEnv:
    """An env on its torch paths: the fused torch observation is the reference of the Warp one
    (``tests/test_env_warp_features.py`` compares the two)."""
    e = G1TrackingVectorEnv(12, "jump")
    e._use_warp(False)
    e.reset(seed=0)
    return e


def _states(env: G1TrackingVectorEnv, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The env's rows, turned and moved (yaw, a few metres away), with random velocities."""
    g = torch.Generator().manual_seed(seed)
    n = env.num_envs
    q, qd = env.q.clone(), torch.randn(n, env.model.nv, generator=g)
    q[:, :2] += 5 * torch.randn(n, 2, generator=g)
    q[:, 7:] += 0.2 * torch.randn(n, env.model.nu, generator=g)
    half = torch.rand(n, generator=g) * math.pi  # a yaw about z, applied to the root quaternion (w, x, y, z)
    yaw = torch.stack([torch.cos(half), 0 * half, 0 * half, torch.sin(half)], 1)
    w1, v1 = yaw[:, :1], yaw[:, 1:]
    w2, v2 = q[:, 3:4], q[:, 4:7]
    q[:, 3:4] = w1 * w2 - (v1 * v2).sum(1, keepdim=True)
    q[:, 4:7] = w1 * v2 + w2 * v1 + torch.cross(v1, v2, dim=1)
    return q, qd


def _term_by_term(env: G1TrackingVectorEnv, q: torch.Tensor, qd: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """The observation as the documented terms, each from its own function (the layout of observation_layout)."""
    sim = env.feature_fn(q, qd)
    obs_r, Hi = robot_observation(sim)
    fut = torch.stack([frame + k for k in range(1, env.ref_steps + 1)], 1).clamp(max=env.num_frames - 1)
    ref = env.motion.features
    rot6 = tan_norm(heading_inverse(ref.root_rot_w)[:, None] @ ref.body_rot_w)
    obs_ref = reference_observation(sim.root_pos_w, Hi, ref.root_pos_w[fut], ref.root_rot_w[fut], rot6[fut],
                                    ref.key_pos_w[fut])
    return torch.cat([obs_r, obs_ref], -1)


@pytest.mark.parametrize("seed", [0, 1])
def test_fused_observation_is_bit_identical(env: G1TrackingVectorEnv, seed: int) -> None:
    q, qd = _states(env, seed)
    # frames at the start, in the middle and at the end of the clip (the future frames clamp there)
    frame = torch.tensor([0, 1, env.num_frames // 2, env.num_frames - 3, env.num_frames - 2, env.num_frames - 1] * 2)
    want = _term_by_term(env, q, qd, frame)
    got = env.observe(dataclasses.replace(env.state, q=q, qd=qd, frame=frame))
    assert got.shape == (env.num_envs, env.obs_dim)
    assert torch.equal(got, want)


def test_fused_observation_gradient_matches(env: G1TrackingVectorEnv) -> None:
    """The gradients agree to float32 rounding (the fused graph sums the same contributions in another order:
    measured 7e-7 at most over 40-step rollouts)."""
    q, qd = _states(env, 2)
    frame = torch.arange(env.num_envs) * 3
    w = torch.randn(env.obs_dim, generator=torch.Generator().manual_seed(5))
    grads = []
    for fused in (True, False):
        qq, vv = q.clone().requires_grad_(True), qd.clone().requires_grad_(True)
        o = (env.observe(dataclasses.replace(env.state, q=qq, qd=vv, frame=frame)) if fused
             else _term_by_term(env, qq, vv, frame))
        (o * w).sum().backward()
        grads.append((qq.grad, vv.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _explicit_unstable(env: G1TrackingVectorEnv, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    import bcg.sim
    from bcg.sim.bridge import MAX_ROOT_POSITION

    ok = torch.isfinite(q).all(1) & torch.isfinite(qd).all(1)
    ok &= (q.abs().amax(1) <= env.state_limit) & (q[:, 0:3].abs().amax(1) <= MAX_ROOT_POSITION)
    ok &= q[:, 3:7].norm(dim=1) >= 1e-6
    ok &= qd.abs().amax(1) <= min(env.state_limit, bcg.sim.MAX_SPEED)
    return ~ok


@pytest.mark.parametrize("limit", [1e4, 50.0, math.inf])
def test_instability_check_matches_explicit_one(limit: float) -> None:
    env = G1TrackingVectorEnv(10, "jump", state_limit=limit if math.isfinite(limit) else 1e4)
    env.reset(seed=1)
    env.state_limit = limit  # EnvConfig refuses an infinite limit; the check still handles one set directly
    q, qd = env.q.clone(), env.qd.clone()
    q[0, 9] = float("nan")
    q[1, 12] = float("inf")
    qd[2, 20] = float("-inf")
    qd[3, 7] = 250.0  # beyond MAX_SPEED
    q[4, 3:7] = 0.0  # zero quaternion
    q[5, 0] = 2e4  # beyond the simulator's root bound
    q[6, 15] = 80.0  # beyond state_limit 50 only
    got = env._unstable(dataclasses.replace(env.state, q=q, qd=qd))
    want = _explicit_unstable(env, q, qd)
    assert torch.equal(got, want)
    assert got[:6].all() and not got[7:].any()
    assert bool(got[6]) == (limit < 80.0)


def test_reset_table_gives_the_computed_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without reset noise the reset state and its first observation come from a per-frame table; a rollout with
    many autoresets gives the same observations, rewards and states as computing every reset."""

    def rollout(table: bool) -> list[torch.Tensor]:
        env = G1TrackingVectorEnv(8, "jump", max_episode_steps=3)  # an autoreset every third step
        if not table:
            monkeypatch.setattr(EpisodeStarts, "noiseless", property(lambda self: False))
        env.reset(seed=4)
        g = torch.Generator().manual_seed(0)
        out, resets = [], 0
        for _ in range(7):
            obs, rew, term, trunc, info = env.step(0.3 * torch.randn(8, 29, generator=g))
            out += [obs, rew, info["final_obs"], env.q, env.qd, env.frame]
            resets += int(info["_final_obs"].sum())
        monkeypatch.undo()
        assert resets >= 16  # every environment at least twice
        return out

    with_table, computed = rollout(True), rollout(False)
    for a, b in zip(with_table, computed, strict=True):
        assert torch.equal(a, b)
