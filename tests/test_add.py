"""ADD reward: gradients through the features (finite differences, root position included), the discriminator learns
to rank the zero residual above a bad policy's, the replay push rule, exact state round trip, clamping."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.agents.add import ADDConfig, ADDReward
from bcg.envs.rewards import StepContext
from bcg.envs.vector_env import G1TrackingVectorEnv
from bcg.motion.features import FeatureFn

N = 6


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> G1TrackingVectorEnv:
    path = write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=1.0)
    return G1TrackingVectorEnv(N, str(path))


def _ctx(n: int, dtype: torch.dtype = torch.float32) -> StepContext:
    return StepContext(torch.zeros(n, 29, dtype=dtype), torch.zeros(n, 29, dtype=dtype), None)


def _bad_policy_residuals(env: G1TrackingVectorEnv, add: ADDReward, steps: int, seed: int) -> None:
    """Random large actions (a bad policy): the env calls ``add`` every step, which records the residuals."""
    g = torch.Generator().manual_seed(seed)
    env.reward_fn = add
    env.reset(seed=seed)
    for _ in range(steps):
        env.step(2.0 * torch.randn(N, 29, generator=g))


def _small(**kw) -> ADDConfig:
    return ADDConfig(hidden=(64, 32), **kw)


def test_reward_gradient_matches_finite_difference(env: G1TrackingVectorEnv) -> None:
    """d reward / d (q, qd) of the simulated state (float64 features) against central differences, along a random
    direction and for each root-position coordinate (MimicKit detaches the root position; we must not)."""
    add = ADDReward(env, _small(), seed=1)
    _bad_policy_residuals(env, add, steps=5, seed=0)
    add.update()  # a non-trivial normaliser and discriminator
    fn64 = FeatureFn(env.model, torch.float64)
    g = torch.Generator().manual_seed(3)
    frame = torch.arange(N) + 5
    ref = env.ref_features(frame).cast(torch.float64)
    q0 = env.motion.qpos[frame].double() + 0.05 * torch.randn(N, 36, generator=g, dtype=torch.float64)
    qd0 = env.motion.qvel[frame].double() + 0.2 * torch.randn(N, 35, generator=g, dtype=torch.float64)

    def reward(q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        return add(fn64(q, qd), ref, _ctx(N, torch.float64))

    q, qd = q0.clone().requires_grad_(True), qd0.clone().requires_grad_(True)
    r = reward(q, qd)
    assert r.dtype == torch.float64 and torch.all(r > 0)
    gq, gqd = torch.autograd.grad(r.sum(), (q, qd))
    vq = torch.randn(N, 36, generator=g, dtype=torch.float64)
    vqd = torch.randn(N, 35, generator=g, dtype=torch.float64)
    eps = 1e-6
    with torch.no_grad():
        fd = (reward(q0 + eps * vq, qd0 + eps * vqd) - reward(q0 - eps * vq, qd0 - eps * vqd)) / (2 * eps)
    an = (gq * vq).sum(1) + (gqd * vqd).sum(1)
    # measured relative error 3e-9 (float64, piecewise-linear MLP away from its kinks)
    torch.testing.assert_close(an, fd, rtol=1e-6, atol=1e-8)
    assert gq[:, 0:3].abs().amin() > 0, "the root position must receive gradient"
    for k in range(3):
        e = torch.zeros(N, 36, dtype=torch.float64)
        e[:, k] = eps
        with torch.no_grad():
            fd_k = (reward(q0 + e, qd0) - reward(q0 - e, qd0)) / (2 * eps)
        torch.testing.assert_close(gq[:, k], fd_k, rtol=1e-6, atol=1e-8)
    # the discriminator's parameters are constants of the reward
    assert all(p.grad is None for p in add.disc.parameters())


def test_reward_reaches_the_state_through_the_differentiable_env(env: G1TrackingVectorEnv,
                                                                 tmp_path: Path) -> None:
    """Installed as ``env.reward_fn`` in a differentiable env, the reward's gradient reaches the actions."""
    path = write_synthetic_motion(tmp_path / "syn.npz", seconds=0.5)
    denv = G1TrackingVectorEnv(2, str(path), differentiable=True)
    add = ADDReward(denv, _small(), seed=0)
    denv.reward_fn = add
    denv.reset(seed=0)
    a = torch.zeros(2, 29, requires_grad=True)
    _, r, *_ = denv.step(a)
    r.sum().backward()
    assert a.grad is not None and a.grad.abs().sum() > 0 and torch.isfinite(a.grad).all()
    assert add.num_pending == 2


def test_zero_residual_ranks_above_a_bad_policy(env: G1TrackingVectorEnv) -> None:
    """After a few updates on a bad policy's residuals (default network and optimiser), the reward at Delta = 0 is
    above the reward of fresh residuals of the same policy."""
    add = ADDReward(env, ADDConfig(), seed=0)
    for it in range(4):
        _bad_policy_residuals(env, add, steps=8, seed=it)
        info = add.update()
    _bad_policy_residuals(env, add, steps=8, seed=99)
    bad = add.reward_of_normalized(add.normalizer.normalize(torch.cat(add._pending))).mean()
    zero = add.reward_of_normalized(torch.zeros(1, add.dim))[0]
    # measured: zero 1.40 (logit ~0: biases only), bad policy 0.048 (logits ~ -4.5); neg accuracy 1.0
    assert zero > 1.2 and bad < 0.3, (float(zero), float(bad))
    assert info["disc_acc_neg"] > 0.9


def test_discriminator_separates_zero_from_random_residuals(env: G1TrackingVectorEnv) -> None:
    """Random residuals against the zero positive: the classification loss falls clearly and measurably."""
    add = ADDReward(env, ADDConfig(hidden=(128, 64)), seed=0)
    g = torch.Generator().manual_seed(0)
    losses, logits = [], []
    for _ in range(30):
        add.record(torch.randn(256, add.dim, generator=g) * 0.3)
        info = add.update()
        losses.append(info["disc_cls_loss"])
        logits.append(info["disc_logit_neg"])
    # measured: 0.698 -> 0.442 over 30 updates, negative logits -> -1.55; the floor is 0.5 log 2 = 0.35 because the
    # zero positive's logit moves only through the biases (ReLU MLP), slowly at lr 2.5e-4
    assert losses[0] > 0.65 and losses[-1] < 0.47, losses
    assert logits[-1] < -1.2 and info["disc_acc_neg"] == 1.0, logits
    assert all(b <= a + 0.01 for a, b in zip(losses, losses[1:], strict=False)), losses


def test_replay_push_rule(env: G1TrackingVectorEnv) -> None:
    """All new residuals until the ring is full, then ``replay_push`` random new ones per update; the ring wraps."""
    add = ADDReward(env, _small(replay_capacity=100, replay_push=10), seed=0)
    batches = [torch.full((60, add.dim), float(i + 1)) for i in range(4)]
    add.record(batches[0])
    add.update()
    assert (add.replay.size, add.replay.head) == (60, 60)
    add.record(batches[1])
    add.update()  # not full before the push: all 60 go in and wrap around
    assert (add.replay.size, add.replay.head) == (100, 20)
    vals = add.replay.data[:, 0]
    assert (vals[:20] == 2).all() and (vals[20:60] == 1).all() and (vals[60:100] == 2).all()
    add.record(batches[2])
    add.update()  # full: only 10 of the 60
    assert (add.replay.size, add.replay.head) == (100, 30)
    assert (add.replay.data[20:30, 0] == 3).all() and (add.replay.data[:, 0] == 3).sum() == 10
    # replay samples only ever come from stored residuals
    s = add.replay.sample(500, torch.Generator().manual_seed(0))
    assert set(s[:, 0].tolist()) <= {1.0, 2.0, 3.0}


def test_state_dict_round_trip_repeats_rewards_and_updates(env: G1TrackingVectorEnv) -> None:
    add = ADDReward(env, _small(replay_capacity=300, replay_push=20), seed=0)
    for it in range(3):
        _bad_policy_residuals(env, add, steps=10, seed=it)
        add.update()
    _bad_policy_residuals(env, add, steps=3, seed=7)  # pending residuals are part of the state too
    buf = io.BytesIO()
    torch.save(add.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    other = ADDReward(env, _small(replay_capacity=300, replay_push=20), seed=123)
    other.load_state_dict(state)

    def continue_run(a: ADDReward) -> list:
        out = []
        for it in range(2):
            _bad_policy_residuals(env, a, steps=10, seed=10 + it)
            out.append(a.update())
            out.append(a.reward_of_normalized(torch.linspace(-1, 1, a.dim)[None].repeat(3, 1)))
        out.append([p.detach().clone() for p in a.disc.parameters()])
        return out

    a, b = continue_run(add), continue_run(other)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            assert x == y
        elif isinstance(x, list):
            for u, v in zip(x, y, strict=True):
                assert torch.equal(u, v)
        else:
            assert torch.equal(x, y)


def test_state_of_another_network_is_refused(env: G1TrackingVectorEnv) -> None:
    state = ADDReward(env, _small(), seed=0).state_dict()
    with pytest.raises(ValueError, match="hidden layers"):
        ADDReward(env, ADDConfig(hidden=(16,)), seed=0).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        ADDReward(env, _small(), seed=0).load_state_dict({"disc": state["disc"]})


def test_clamp_keeps_reward_finite_for_huge_residuals(env: G1TrackingVectorEnv) -> None:
    add = ADDReward(env, _small(), seed=0)
    g = torch.Generator().manual_seed(0)
    x = (1e6 * torch.randn(64, add.dim, generator=g)).requires_grad_(True)
    r = add.reward_of_normalized(x)
    assert torch.isfinite(r).all() and r.max() <= 2 * math.log1p(math.exp(9.0)) + 1e-4
    assert r.max() > 17.9  # some logits of such residuals are far above the clamp
    r.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("field,value", [("lr", 0.0), ("epochs", 0), ("hidden", ()), ("momentum", 1.0),
                                         ("grad_penalty", -1.0), ("replay_capacity", 2.5)])
def test_config_refuses_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ADDConfig(**{field: value})
