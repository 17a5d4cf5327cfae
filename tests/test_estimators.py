"""The gradient-estimator registry (issue 9): registry, decorator and entry-point plugins, ``bptt`` bit-identical to
the env without an estimator, and the invariants of ``grs`` (docs/method.md §3.9): no perturbation = bptt, the mean over
branches and the mean of branch gradients, determinism with a seed, non-finite branches dropped, antithetic pairs,
the quaternion mean."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import gymnasium as gym
import pytest
import torch

import bcg  # noqa: F401  (registers the env ids)
from bcg.envs import simulator_step
from bcg.estimators import ESTIMATORS, Estimator, EstimatorStats, make, register
from bcg.estimators.base import quat_mean_wxyz
from bcg.estimators.grs import GRS, expand

N = 3


def _env(transition_fn=None):
    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=N, differentiable=True)
    if transition_fn is not None:
        env.transition_fn = transition_fn
    env.reset(seed=0)
    return env


def _actions(env, k: int) -> torch.Tensor:
    """Actions near the reference targets (a tracking policy), a little noise, as a leaf that requires grad."""
    g = torch.Generator().manual_seed(100 + k)
    ref = env.target_to_action(env.motion.qpos[(env.state.frame + 1).clamp(max=env.num_frames - 1), 7:])
    return (ref + 0.05 * torch.randn(N, 29, generator=g)).detach().requires_grad_(True)


def _rollout(env, steps: int = 4):
    obs_all, rew_all, acts = [], [], []
    for k in range(steps):
        a = _actions(env, k)
        obs, rew, term, trunc, info = env.step(a)
        obs_all.append(obs)
        rew_all.append(rew)
        acts.append(a)
    loss = torch.stack(rew_all).sum() + 1e-3 * torch.stack(obs_all).sum()
    loss.backward()
    return torch.stack(obs_all).detach(), torch.stack(rew_all).detach(), [a.grad for a in acts], env.state


# ------------------------------------------------------------------------------------------------ registry


def test_builtins_unknown_names_and_parameters() -> None:
    assert {"bptt", "grs"} <= set(ESTIMATORS) and ESTIMATORS["grs"] is GRS
    with pytest.raises(ValueError, match="unknown estimator 'nope'; registered: .*bptt.*grs"):
        make("nope")
    with pytest.raises(TypeError, match="no parameter.*foo.*branches"):
        make("grs", foo=1)
    est = make("grs", branches=4, sigma_q=0.01)
    assert est == GRS(branches=4, sigma_q=0.01) and est.name == "grs"
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.branches = 3
    for bad in ({"branches": 0}, {"sigma_q": -1.0}, {"sigma_qd": float("nan")}, {"antithetic": True, "branches": 3},
                {"law": "polar"}, {"seed": -1}, {"damping": -1.0}):
        with pytest.raises(ValueError):
            GRS(**bad)


def test_register_decorator() -> None:
    @register("test-null")
    @dataclasses.dataclass(frozen=True)
    class Null(Estimator):
        scale: float = 1.0
        """unused"""

        def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
            q1, qd1, c = self._call_inner(model, q, qd, targets, physics, env_ids)
            return q1, qd1, c, {}, EstimatorStats(calls=1)

    try:
        assert ESTIMATORS["test-null"] is Null and make("test-null", scale=2.0).scale == 2.0
        with pytest.raises(ValueError, match="already registered"):
            register("test-null")(GRS)
        with pytest.raises(TypeError):
            register("test-bad")(int)
    finally:
        ESTIMATORS._classes.pop("test-null", None)


def test_entry_point_plugin(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A distribution installed on sys.path that declares a ``bcg.estimators`` entry point shows up in the registry
    and in ``bcg estimators list`` (registered under the entry point's name without importing anything by hand)."""
    (tmp_path / "bcg_test_plugin.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from bcg.estimators import Estimator, EstimatorStats

        @dataclass(frozen=True)
        class Plugin(Estimator):
            gain: float = 1.0
            """a parameter"""

            def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
                q1, qd1, c = self._call_inner(model, q, qd, targets, physics, env_ids)
                return q1, qd1, c, {}, EstimatorStats(calls=1, envs=q.shape[0])
        '''))
    dist = tmp_path / "bcg_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bcg-test-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[bcg.estimators]\nplugin-est = bcg_test_plugin:Plugin\n"
                                           "broken-est = bcg_test_plugin_missing:Nothing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(RuntimeWarning, match="broken-est"):
            ESTIMATORS.load_entry_points(force=True)
        assert "plugin-est" in ESTIMATORS and "broken-est" not in ESTIMATORS
        est = make("plugin-est", gain=2.0)
        assert type(est).__name__ == "Plugin" and est.gain == 2.0
        from bcg.cli import main

        assert main(["estimators", "list"]) == 0
        out = capsys.readouterr().out
        assert "plugin-est:" in out and "gain: float = 1.0  a parameter" in out
        assert "grs: Global randomized smoothing" in out and "sigma_q: float = 0.02" in out and "bptt:" in out
    finally:
        ESTIMATORS._classes.pop("plugin-est", None)
        sys.modules.pop("bcg_test_plugin", None)


# ------------------------------------------------------------------------------------------------ bptt


def test_bptt_is_bit_identical_to_the_env_without_an_estimator() -> None:
    plain = _rollout(_env())
    est = make("bptt")
    bptt = _rollout(_env(est))
    assert torch.equal(plain[0], bptt[0]) and torch.equal(plain[1], bptt[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[2], bptt[2], strict=True))
    assert plain[3].detach().equal(bptt[3].detach())
    assert est.total_stats == EstimatorStats(calls=4, envs=4 * N, branches_simulated=4 * N)
    assert plain[2][0].abs().sum() > 0


# ------------------------------------------------------------------------------------------------ grs


@pytest.mark.parametrize("zero", [{"law": "joint_gaussian", "sigma_q": 0.0, "sigma_qd": 0.0},
                                  {"law": "cartesian", "sigma_p": 0.0, "sigma_v": 0.0}], ids=["joint", "cartesian"])
def test_grs_without_perturbation_equals_bptt(zero: dict) -> None:
    plain = _rollout(_env())
    est = make("grs", branches=3, **zero)
    grs = _rollout(_env(est))
    assert torch.equal(grs[0], plain[0]) and torch.equal(grs[1], plain[1])  # values: bit for bit
    for a, b in zip(grs[2], plain[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert est.total_stats == EstimatorStats(calls=4, envs=4 * N, envs_triggered=4 * N, branches_simulated=12 * N)


@pytest.fixture(scope="module")
def sim_inputs():
    env = _env()
    s = env.state
    targets = env.action_to_target(_actions(env, 0).detach())
    return env.model, s.q, s.qd, targets


def test_grs_is_the_mean_of_its_branches_and_of_their_gradients(sim_inputs) -> None:
    model, q0, qd0, t0 = sim_inputs
    B = 4
    est = GRS(branches=B, seed=3)
    t = t0.clone().requires_grad_(True)
    q1, qd1, _, _ = est(model, q0, qd0, t)
    w_q, w_qd = torch.randn(q1.shape[1] - 7, generator=torch.Generator().manual_seed(1)), torch.randn(qd1.shape[1])
    (g,) = torch.autograd.grad((q1[:, 7:] * w_q).sum() + (qd1 * w_qd).sum() + q1[:, :3].sum(), t)

    dq, dqd = est.sample(model, q0, qd0, torch.Generator().manual_seed(3))
    assert dq.abs().amax() > 0 and dq.shape == (N, B, 29)
    qb, qdb, _, _, _ = expand(q0, qd0, t0, None, None, B, dq, dqd)
    qb, qdb = qb.reshape(N, B, -1), qdb.reshape(N, B, -1)
    outs, grads = [], []
    for b in range(B):  # every branch on its own (a test, not a hot path)
        tb = t0.clone().requires_grad_(True)
        qo, qdo, _, _ = simulator_step(model, qb[:, b], qdb[:, b], tb)
        (gb,) = torch.autograd.grad((qo[:, 7:] * w_q).sum() + (qdo * w_qd).sum() + qo[:, :3].sum(), tb)
        outs.append((qo.detach(), qdo.detach()))
        grads.append(gb)
    q_mean = torch.stack([o[0] for o in outs], 1).mean(1)
    qd_mean = torch.stack([o[1] for o in outs], 1).mean(1)
    torch.testing.assert_close(q1[:, :3].detach(), q_mean[:, :3], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q1[:, 7:].detach(), q_mean[:, 7:], rtol=1e-6, atol=1e-6)
    quat = q_mean[:, 3:7] / q_mean[:, 3:7].norm(dim=1, keepdim=True)
    torch.testing.assert_close(q1[:, 3:7].detach(), quat, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(qd1.detach(), qd_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g, torch.stack(grads).mean(0), rtol=1e-4, atol=1e-5)


def test_grs_is_deterministic_with_a_seed(sim_inputs) -> None:
    model, q0, qd0, t0 = sim_inputs
    a, b, c = GRS(branches=3, seed=5), GRS(branches=3, seed=5), GRS(branches=3, seed=6)
    with torch.no_grad():
        ra = [a(model, q0, qd0, t0)[1] for _ in range(2)]
        rb = [b(model, q0, qd0, t0)[1] for _ in range(2)]
        rc = c(model, q0, qd0, t0)[1]
        assert all(torch.equal(x, y) for x, y in zip(ra, rb, strict=True))
        assert not torch.equal(ra[0], ra[1]) and not torch.equal(ra[0], rc)
        a.reset()
        assert torch.equal(a(model, q0, qd0, t0)[1], ra[0]) and a.total_stats.calls == 1


def test_grs_drops_nonfinite_branches(sim_inputs) -> None:
    """Branch 1 of environment 0 and every branch of environment 2 diverge: environment 0 is the mean of its three
    other branches (weights 1/3), environment 2 comes back NaN (the env resets it), and gradients stay finite."""
    model, q0, qd0, t0 = sim_inputs
    B = 4
    clean: dict = {}
    poison = torch.zeros(N * B, dtype=torch.bool)
    poison[1] = True
    poison[2 * B:] = True

    def diverging(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        q1, qd1, c, _ = simulator_step(model, q, qd, targets, physics)
        clean["q"], clean["qd"] = q1.detach(), qd1.detach()
        nan = torch.tensor(float("nan"))
        return torch.where(poison[:, None], nan, q1), torch.where(poison[:, None], nan, qd1), c, {}

    est = GRS(branches=B, seed=1).set_inner(diverging)
    t = t0.clone().requires_grad_(True)
    q = q0.clone().requires_grad_(True)
    q1, qd1, _, _ = est(model, q, qd0, t)
    assert est.last_stats.nonfinite_dropped == 1 + B and est.last_stats.envs_all_nonfinite == 1
    assert torch.isnan(q1[2]).all() and torch.isnan(qd1[2]).all()
    assert torch.isfinite(q1[:2]).all() and torch.isfinite(qd1[:2]).all()
    ref_qd = clean["qd"].reshape(N, B, -1)
    torch.testing.assert_close(qd1[0].detach(), ref_qd[0, [0, 2, 3]].mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qd1[1].detach(), ref_qd[1].mean(0), rtol=1e-5, atol=1e-5)
    (qd1[:2].sum() + q1[:2, 7:].sum()).backward()
    assert torch.isfinite(t.grad).all() and torch.isfinite(q.grad).all() and t.grad[:2].abs().sum() > 0

    # inside the env: the all-NaN environment ends as a diverged step (terminated, reward 0) and is reset
    env = _env(GRS(branches=B, seed=1).set_inner(diverging))
    a = _actions(env, 0)
    obs, rew, term, trunc, info = env.step(a)
    assert info["nonfinite"].tolist() == [False, False, True] and term[2] and rew[2] == 0
    assert torch.isfinite(obs).all()
    rew.sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad[2].abs().sum() == 0 and a.grad[0].abs().sum() > 0


def test_perturbation_law_antithetic_and_limits(sim_inputs) -> None:
    model, q0, qd0, _ = sim_inputs
    est = GRS(branches=6, antithetic=True, law="joint_gaussian", sigma_q=0.05, sigma_qd=0.1)
    g = torch.Generator().manual_seed(0)
    big = q0.repeat(200, 1)
    dq, dqd = est.sample(model, big, qd0.repeat(200, 1), g)
    lo, hi = (torch.as_tensor(model.dof_range[6:, i], dtype=torch.float32) for i in (0, 1))
    qp = big[:, None, 7:] + dq
    qn = big[:, None, 7:]
    assert ((qp >= torch.minimum(lo, qn) - 1e-6) & (qp <= torch.maximum(hi, qn) + 1e-6)).all()
    torch.testing.assert_close(dqd[:, :3], -dqd[:, 3:])  # rates are far from MAX_SPEED: exact pairs
    free = (qp[:, :3] > lo + 1e-3) & (qp[:, :3] < hi - 1e-3) & (qp[:, 3:] > lo + 1e-3) & (qp[:, 3:] < hi - 1e-3)
    assert free.float().mean() > 0.5
    torch.testing.assert_close(dq[:, :3][free], -dq[:, 3:][free])
    # sample statistics of the joint-space law (600 * 29 draws away from the limits)
    assert abs(dqd.std().item() / 0.1 - 1) < 0.03 and abs(dq[:, :3][free].std().item() / 0.05 - 1) < 0.05


def test_quaternion_mean_is_unit_and_sign_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.nn.functional.normalize(torch.randn(5, 1, 4, generator=g), dim=-1)
    quat = torch.nn.functional.normalize(base + 0.05 * torch.randn(5, 4, 4, generator=g), dim=-1)
    keep = torch.ones(5, 4, dtype=torch.bool)
    keep[0, 0] = False
    w = keep.float() / keep.sum(1, keepdim=True)
    m = quat_mean_wxyz(quat, w, keep)
    flip = torch.where(torch.rand(5, 4, 1, generator=g) < 0.5, -1.0, 1.0)
    m2 = quat_mean_wxyz(quat * flip, w, keep)
    torch.testing.assert_close(m.norm(dim=-1), torch.ones(5))
    torch.testing.assert_close(m2 * torch.sign((m2 * m).sum(-1, keepdim=True)), m)
    assert ((m * base[:, 0]).sum(-1).abs() > 0.99).all()


def test_estimator_statistics_reach_info() -> None:
    """The env puts the per-call counts of its transition function into info["estimator"]."""
    env = _env(make("grs", branches=4, seed=1))
    _, _, _, _, info = env.step(_actions(env, 0))
    stats = info["estimator"]
    assert stats["calls"] == 1 and stats["envs"] == N
    assert stats["envs_triggered"] == N and stats["branches_simulated"] == 4 * N
    _, _, _, _, plain = _env().step(torch.zeros(N, 29))
    assert "estimator" not in plain
