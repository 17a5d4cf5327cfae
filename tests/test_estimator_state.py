"""Estimator state for exact checkpoints: ``est.state_dict()`` / ``est.load_state_dict(sd)`` hold every run-time
datum (generator states, counters) as tensors and plain values, and ``env.state`` holds the rest (bcg's open bundles
and lagged trigger forces, in its transition memory), so a snapshot of both taken mid-run (also inside an open
bundle), saved with ``torch.save`` and read with ``torch.load(..., weights_only=True)``, continues bit for bit in a
fresh environment and a fresh estimator."""

from __future__ import annotations

import io

import gymnasium as gym
import pytest
import torch

import bcg  # noqa: F401  (registers the env ids)
from bcg.envs import EnvState
from bcg.estimators import make
from bcg.estimators.bundled import open_rows

N = 4


def _env(est, differentiable: bool = False):
    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=N, differentiable=differentiable)
    est.attach(env)
    env.reset(seed=0)
    return env


def _actions(env, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(200 + k)
    ref = env.target_to_action(env.motion.qpos[(env.state.frame + 1).clamp(max=env.num_frames - 1), 7:])
    return ref + 0.05 * torch.randn(N, 29, generator=g)


def _roundtrip(sd: dict) -> dict:
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _continue(env, est, start: int, steps: int):
    out = []
    for k in range(start, start + steps):
        obs, rew, term, trunc, _ = env.step(_actions(env, k))
        out.append((obs, rew, term, trunc, est.last_stats))
    return out


@pytest.mark.parametrize("name, params, differentiable", [
    ("bcg", {"tau": 20.0, "branches": 3, "seed": 5}, False),                # lagged trigger, H = 2: open at step 1
    ("bcg", {"tau": 20.0, "branches": 2, "horizon": 3, "timing": "rollback", "law": "cartesian",
             "aggregation": "per_foot", "seed": 2}, False),
    ("bcg", {"trigger": "always", "branches": 2, "horizon": 3, "seed": 7}, True),  # offsets with graph: saved detached
    ("grs", {"branches": 3, "seed": 1}, False),
])
def test_checkpoint_mid_run_continues_bit_for_bit(name: str, params: dict, differentiable: bool) -> None:
    est = make(name, **params)
    env = _env(est, differentiable)
    _continue(env, est, 0, 2)
    if name == "bcg":
        assert open_rows(env.state.memory).numel() > 0  # the snapshot is taken inside open bundles
    snap, sd = _roundtrip(env.state.saved()), _roundtrip(est.state_dict())
    snap = EnvState.from_saved(snap, env.model, "cpu")
    if differentiable:
        assert not snap.memory["bcg.off_q"].requires_grad  # saved without a graph
    ref = _continue(env, est, 2, 4)
    ref_total = est.total_stats

    est2 = make(name, **params)
    env2 = _env(est2, differentiable)
    env2.load_state(snap)
    est2.load_state_dict(sd)
    got = _continue(env2, est2, 2, 4)
    for (o1, r1, t1, u1, s1), (o2, r2, t2, u2, s2) in zip(ref, got, strict=True):
        assert torch.equal(o1, o2) and torch.equal(r1, r2) and torch.equal(t1, t2) and torch.equal(u1, u2)
        assert s1 == s2
    assert est2.total_stats == ref_total
    assert sum(s.envs_triggered for *_, s in ref) > 0 or name == "grs"

    # a fresh estimator without the state draws other perturbations (the test can fail)
    est3 = make(name, **params)
    env3 = _env(est3, differentiable)
    env3.load_state(snap)
    other = _continue(env3, est3, 2, 4)
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(ref, other, strict=True))


def test_state_dict_is_plain_and_checked() -> None:
    est = make("bcg", tau=20.0, branches=2)
    env = _env(est)
    _continue(env, est, 0, 2)
    sd = est.state_dict()
    assert set(sd) == {"version", "name", "params", "seed_override", "generators", "last_stats", "total_stats"}
    assert sd["name"] == "bcg" and sd["params"]["tau"] == 20.0 and set(sd["generators"]) == {"cpu"}
    saved = env.state.saved()["memory"]
    assert open_rows(saved).numel() > 0 and saved["bcg.off_q"].shape == (N, 2, 36)
    # the snapshot is a copy: stepping on does not change it
    gen, left = sd["generators"]["cpu"].clone(), saved["bcg.left"].clone()
    _continue(env, est, 2, 1)
    assert torch.equal(sd["generators"]["cpu"], gen) and torch.equal(saved["bcg.left"], left)
    with pytest.raises(ValueError, match="other hyperparameters: tau=20.0 \\(here 400.0\\)"):
        make("bcg", branches=2).load_state_dict(sd)
    with pytest.raises(ValueError, match="saved by estimator 'bcg', this one is 'grs'"):
        make("grs").load_state_dict(sd)
    with pytest.raises(ValueError, match="made by Estimator.state_dict"):
        make("bcg").load_state_dict({"q": torch.zeros(1)})
    make("bcg", tau=30.0, branches=2).load_state_dict(sd, strict=False)  # a deliberate change of tau
    # a state written before the open bundles moved into the env's state (they were under "memory") still loads
    make("bcg", tau=20.0, branches=2).load_state_dict(dict(sd, memory={"left": torch.zeros(N, dtype=torch.long)}))
    # a state saved before the bundle-size options existed reads as fixed bundles: it loads into today's default and
    # is refused by an estimator that sizes its bundles
    old = dict(sd, params={k: v for k, v in sd["params"].items()
                           if k not in ("size", "min_branches", "activation_change")})
    make("bcg", tau=20.0, branches=2).load_state_dict(old)
    with pytest.raises(ValueError, match="size='fixed' \\(here 'sensitivity'\\)"):
        make("bcg", tau=20.0, branches=2, size="sensitivity", min_branches=2).load_state_dict(old)
    # reset() after a load starts over from the seed
    est.load_state_dict(sd)
    est.reset()
    assert est.state_dict()["generators"] == {}
