"""The ``bcg`` estimator (Bundled Contact Gradients, issue 9): trigger never = bptt bit for bit, zero perturbation
= bptt values bit for bit with bundles open, the lagged and rollback triggers, bundles of H steps that close at a
reset or a restored state, window boundaries (env.detach) inside a bundle, determinism."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from test_estimators import N, _actions, _env, _rollout

from bcg.envs import simulator_step
from bcg.estimators import EstimatorStats, make
from bcg.estimators.bundled import BCG
from bcg.sim.reference import ContactReport


def test_parameters_are_checked() -> None:
    assert make("bcg") == BCG() and BCG().tau == 400.0 and BCG().branches == 10 and BCG().horizon == 2
    for bad in ({"branches": 0}, {"horizon": 0}, {"tau": -1.0}, {"trigger": "sometimes"}, {"timing": "late"},
                {"aggregation": "per_leg"}, {"antithetic": True, "branches": 3}):
        with pytest.raises(ValueError):
            BCG(**bad)


def test_trigger_never_is_bit_identical_to_bptt() -> None:
    plain = _rollout(_env())
    est = make("bcg", trigger="never")
    got = _rollout(_env(est))
    assert torch.equal(plain[0], got[0]) and torch.equal(plain[1], got[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[2], got[2], strict=True))
    assert est.total_stats == EstimatorStats(calls=4, envs=4 * N, branches_simulated=4 * N)


def test_steps_where_nothing_triggers_are_bit_identical_to_bptt() -> None:
    """A force threshold nobody reaches: every step takes the nominal-only path (one plain inner call); values and
    gradients equal bptt's bit for bit, and the estimator keeps no open bundle."""
    plain = _rollout(_env())
    est = make("bcg", tau=1e5)
    got = _rollout(_env(est))
    assert torch.equal(plain[0], got[0]) and torch.equal(plain[1], got[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[2], got[2], strict=True))
    assert est.total_stats == EstimatorStats(calls=4, envs=4 * N, branches_simulated=4 * N)
    assert est.open_bundles.numel() == 0


@pytest.mark.parametrize("zero", [{"law": "joint_gaussian", "sigma_q": 0.0, "sigma_qd": 0.0},
                                  {"law": "cartesian", "sigma_p": 0.0, "sigma_v": 0.0}], ids=["joint", "cartesian"])
def test_zero_perturbation_bundles_reproduce_bptt(zero: dict) -> None:
    """Bundles open every step (trigger always, H = 2, B = 3) with zero offsets: values bit for bit, gradients to
    float rounding (the branches' sensitivities are summed with weights 1/3)."""
    plain = _rollout(_env())
    est = make("bcg", trigger="always", branches=3, horizon=2, **zero)
    got = _rollout(_env(est))
    assert torch.equal(plain[0], got[0]) and torch.equal(plain[1], got[1])
    for a, b in zip(got[2], plain[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # bundles of 2 steps back to back: new ones at steps 0 and 2, continued at 1 and 3
    assert est.total_stats == EstimatorStats(calls=4, envs=4 * N, envs_triggered=2 * N, branches_simulated=12 * N)


def _run(est, steps: int):
    env = _env(est)
    acts, rews, stats = [], [], []
    for k in range(steps):
        a = _actions(env, k)
        _, rew, _, _, _ = env.step(a)
        acts.append(a)
        rews.append(rew)
        stats.append(est.last_stats)
    torch.stack(rews).sum().backward()
    return env, torch.stack(rews).detach(), [a.grad for a in acts], stats


def test_lagged_trigger_bundles_and_determinism() -> None:
    """tau = 20 N: every environment is in contact at the reset, so the lagged trigger opens bundles at step 1 (none
    at step 0, which has no previous forces); they continue at step 2 and the trigger is read again at step 3."""
    B = 4
    env, rew, grads, stats = _run(make("bcg", tau=20.0, branches=B, seed=3), 4)
    assert [s.envs_triggered for s in stats] == [0, N, 0, N]
    assert [s.branches_simulated for s in stats] == [N, N * B, N * B, N * B]
    assert all(torch.isfinite(g).all() for g in grads) and grads[0].abs().sum() > 0
    _, rew2, grads2, _ = _run(make("bcg", tau=20.0, branches=B, seed=3), 4)
    assert torch.equal(rew, rew2) and all(torch.equal(a, b) for a, b in zip(grads, grads2, strict=True))
    _, rew3, _, _ = _run(make("bcg", tau=20.0, branches=B, seed=4), 4)
    assert not torch.equal(rew, rew3)
    # a threshold nobody reaches never branches
    _, _, _, quiet = _run(make("bcg", tau=1e5, branches=B), 3)
    assert sum(s.envs_triggered for s in quiet) == 0 and all(s.branches_simulated == N for s in quiet)


def test_rollback_trigger_and_per_foot() -> None:
    B = 2
    est = make("bcg", tau=20.0, branches=B, timing="rollback")
    _, _, grads, stats = _run(est, 2)
    assert stats[0].envs_triggered == N and stats[0].branches_simulated == N + N * B  # nominal, then the bundle
    assert stats[1].envs_triggered == 0 and stats[1].branches_simulated == N * B      # the bundle continues
    assert all(torch.isfinite(g).all() for g in grads)
    env = _env()
    env.step(torch.zeros(N, 29))
    s = env.state
    _, _, c = simulator_step(env.model, s.q, s.qd, env.action_to_target(torch.zeros(N, 29)))
    point = BCG(aggregation="per_point").trigger_quantity(env.model, c)
    foot = BCG(aggregation="per_foot").trigger_quantity(env.model, c)
    assert (foot >= point).all() and (foot > point).any()


def test_bundles_close_at_a_restored_state_and_survive_detach() -> None:
    est = make("bcg", trigger="always", branches=2, horizon=3)
    env = _env(est)
    snap = env.state
    env.step(_actions(env, 0))
    assert est.open_bundles.tolist() == list(range(N))
    env.load_state(snap)  # not the mean the estimator returned: the bundles close, new ones open
    env.step(_actions(env, 0))
    assert est.last_stats.envs_triggered == N
    env.detach()          # a window boundary inside the bundles: they continue, with no graph into the old window
    a = _actions(env, 1)
    _, rew, _, _, _ = env.step(a)
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * N
    rew.sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    est.reset()
    assert est.open_bundles.numel() == 0


def test_one_row_per_environment() -> None:
    env = _env()
    s = env.state.repeat_interleave(2)
    with pytest.raises(ValueError, match="one row per environment"):
        BCG(trigger="always")(env.model, s.q, s.qd,
                              env.action_to_target(torch.zeros(2 * N, 29), joint_offset=s.joint_offset),
                              env_ids=s.env_id, state=s)


def test_gradient_of_a_two_step_bundle_is_the_mean_of_branch_gradients() -> None:
    """docs/method.md §3.9 (4) through a whole bundle (H = 2, B = 3, shared actions): autograd of a loss linear in the
    bundle's final mean equals the mean of the gradients of the branches simulated one by one; every branch keeps its
    own state and sensitivity across the two steps."""
    from bcg.estimators.grs import joint_gaussian_offsets

    B, seed = 3, 7
    est = BCG(trigger="always", branches=B, horizon=2, seed=seed, law="joint_gaussian", sigma_q=0.05, sigma_qd=0.2)
    env = _env(est)
    s0 = env.state
    a0, a1 = _actions(env, 0), _actions(env, 1)
    s1, *_ = env.transition(s0, a0)
    assert est.open_bundles.tolist() == list(range(N))
    s2, *_ = env.transition(s1, a1)
    assert est.last_stats.envs_triggered == 0 and est.open_bundles.numel() == 0
    g = torch.Generator().manual_seed(11)
    w_q, w_qd = torch.randn(29, generator=g), torch.randn(35, generator=g)

    def loss(q, qd):
        return (q[:, 7:] * w_q).sum() + (qd * w_qd).sum() + q[:, :3].sum()

    ga0, ga1 = torch.autograd.grad(loss(s2.q, s2.qd), (a0, a1))
    dq, dqd = joint_gaussian_offsets(env.model, s0.q, s0.qd, B, 0.05, 0.2, False, torch.Generator().manual_seed(seed))
    per0, per1, finals = [], [], []
    for b in range(B):  # every branch on its own (a test, not a hot path)
        t0, t1 = env.action_to_target(a0), env.action_to_target(a1)
        q = s0.q + torch.cat([torch.zeros(N, 7), dq[:, b]], 1)
        qd = s0.qd + torch.cat([torch.zeros(N, 6), dqd[:, b]], 1)
        q, qd, _ = simulator_step(env.model, q, qd, t0)
        q, qd, _ = simulator_step(env.model, q, qd, t1)
        finals.append(qd.detach())
        b0, b1 = torch.autograd.grad(loss(q, qd), (a0, a1))
        per0.append(b0)
        per1.append(b1)
    torch.testing.assert_close(s2.qd.detach(), torch.stack(finals).mean(0), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ga0, torch.stack(per0).mean(0), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(ga1, torch.stack(per1).mean(0), rtol=1e-3, atol=1e-4)


def test_antithetic_pairs_on_linear_dynamics_give_the_nominal_step() -> None:
    """docs/method.md §3.9 (3): with a linear inner step and antithetic offsets (away from the joint limits) the branch
    mean is the nominal next state, for grs and for a bcg bundle over both of its steps."""
    from bcg.estimators.grs import GRS

    g = torch.Generator().manual_seed(0)
    A = torch.eye(35) + 0.01 * torch.randn(35, 35, generator=g)

    def linear(model, q, qd, targets, physics=None, *, env_ids=None, state=None):
        q1 = torch.cat([q[:, :7], q[:, 7:] + 0.02 * qd[:, 6:] + 0.001 * targets], 1)
        z = q.new_zeros(q.shape[0], 8)
        return q1, qd @ A.T, ContactReport(z, z, z)

    env = _env()
    s = env.state
    q0 = s.q.clone()
    q0[:, 7:] = 0.0  # every hinge well inside its range: no clamping
    targets = env.action_to_target(torch.zeros(N, 29))
    nominal = linear(env.model, q0, s.qd, targets)
    for est in (GRS(branches=4, antithetic=True, sigma_q=0.01, sigma_qd=0.1),
                BCG(trigger="always", branches=4, horizon=2, antithetic=True, sigma_q=0.01, sigma_qd=0.1)):
        est.set_inner(linear)
        q1, qd1, _ = est(env.model, q0, s.qd, targets)
        torch.testing.assert_close(q1, nominal[0], rtol=0, atol=2e-6)
        torch.testing.assert_close(qd1, nominal[1], rtol=0, atol=2e-6)
    # the second step of the bcg bundle (branches continue from their own states)
    q2, qd2, _ = est(env.model, q1, qd1, targets)
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 4 * N
    n2 = linear(env.model, *nominal[:2], targets)
    torch.testing.assert_close(q2, n2[0], rtol=0, atol=4e-6)
    torch.testing.assert_close(qd2, n2[1], rtol=0, atol=4e-6)


# ------------------------------------------------------------------------------------------------ resets, row layouts


def _plain_env(est, **kw):
    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=N, differentiable=False, **kw)
    est.attach(env)
    env.reset(seed=0)
    return env


def test_an_autoreset_inside_an_open_bundle_closes_it() -> None:
    """docs/method.md §3.9 / issue 9: a bundle never straddles a reset. Episodes of 2 steps, bundles of H = 3: env 1 is
    reset by hand after step 0, so at step 1 envs 0 and 2 are inside their bundles and truncate (autoreset) while
    env 1 opened a new one. At step 2 envs 0 and 2 must start new bundles from their new episodes (not continue with
    the old episode's branch offsets), env 1 continues; the result equals an estimator whose bundles of envs 0 and 2
    were closed by hand, bit for bit."""
    params = {"trigger": "always", "branches": 3, "horizon": 3, "seed": 1}
    est = BCG(**params)
    env = _plain_env(est, max_episode_steps=2)
    env.step(_actions(env, 0))
    env.reset(options={"reset_mask": [False, True, False]})
    _, _, _, trunc, _ = env.step(_actions(env, 1))
    assert trunc.tolist() == [True, False, True] and est.last_stats.envs_triggered == 1
    assert est.open_bundles.tolist() == [0, 2, 1]       # as far as the estimator knows, all three are open
    snap, sd = env.state.clone(), est.state_dict()
    a2 = _actions(env, 2)
    obs, rew, *_ = env.step(a2)
    assert est.last_stats.envs_triggered == 2 and est.last_stats.branches_simulated == 3 * N
    assert sorted(est.open_bundles.tolist()) == [0, 1, 2]
    assert est.state_dict()["memory"]["left"].tolist() == [2, 1, 2]  # new bundles: H - 1 left; env 1: its last

    ref = BCG(**params)
    env_ref = _plain_env(ref, max_episode_steps=2)
    env_ref.load_state(snap)
    ref.load_state_dict(sd)
    ref.close_bundles(torch.tensor([0, 2]))
    obs_ref, rew_ref, *_ = env_ref.step(a2)
    assert torch.equal(obs, obs_ref) and torch.equal(rew, rew_ref) and ref.last_stats == est.last_stats

    # the lagged force trigger does not fire on the forces of the episode before the reset
    lag = BCG(tau=20.0, branches=2, horizon=1)
    env = _plain_env(lag, max_episode_steps=2)
    env.step(_actions(env, 0))
    _, _, _, trunc, _ = env.step(_actions(env, 1))
    assert trunc.all() and lag.last_stats.envs_triggered > 0
    env.step(_actions(env, 2))
    assert lag.last_stats.envs_triggered == 0 and lag.last_stats.branches_simulated == N


def test_branch_batches_and_gathered_rows() -> None:
    """``env.transition`` on rows that repeat an environment (``state.repeat_interleave(k)``): refused with the
    reason where bcg keeps bundles or lagged forces across calls; accepted where nothing carries over (H = 1 with
    trigger always or rollback), each row on its own (= grs with the same seed, bit for bit) and without touching the
    environments' bookkeeping. Gathered rows of distinct environments continue their own bundles and leave the others
    open."""
    from bcg.estimators.grs import GRS

    k = 2
    with torch.no_grad():
        est = BCG(trigger="always", branches=3, horizon=2, seed=4)
        env = _plain_env(est)
        s = env.state
        a = _actions(env, 0).detach()
        with pytest.raises(ValueError, match=r"6 rows for 3 environments.*one row per environment.*horizon=1"):
            env.transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))
        for bad in (BCG(tau=20.0), BCG(tau=20.0, horizon=1), BCG(timing="rollback")):  # lagged, or H > 1
            with pytest.raises(ValueError, match="env_ids repeat"):
                bad.attach(env)
                env.transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))

        one = BCG(trigger="always", branches=3, horizon=1, seed=4, law="joint_gaussian")
        grs = GRS(branches=3, seed=4, law="joint_gaussian")
        got = one.attach(env).transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))[0]
        want = grs.attach(env).transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))[0]
        assert torch.equal(got.q, want.q) and torch.equal(got.qd, want.qd)
        assert one.last_stats.envs == k * N and one.last_stats.envs_triggered == k * N
        assert not torch.equal(got.q[0::2], got.q[1::2])  # the copies of an environment draw their own offsets
        roll = BCG(tau=20.0, branches=2, horizon=1, timing="rollback")
        roll.attach(env).transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))
        assert roll.last_stats.envs == k * N and roll.last_stats.branches_simulated >= k * N

        # gathered rows (distinct environments) of a state whose bundles are open
        est.attach(env)
        env.step(a)
        assert est.open_bundles.tolist() == [0, 1, 2]
        idx = torch.tensor([0, 2])
        sd = est.state_dict()
        env.transition(env.state[idx], _actions(env, 1).detach()[idx])
        assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * 3
        assert est.open_bundles.tolist() == [1]  # 0 and 2 closed after their H = 2 steps; 1 is still open
        # that call was a lookahead: restoring the estimator's state undoes it, the env's own step continues all three
        est.load_state_dict(sd)
        env.step(_actions(env, 1).detach())
        assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 3 * N
        assert est.open_bundles.numel() == 0
        # a branch call of a stateless estimator leaves the environments' memory alone
        one.attach(env)
        before = one.state_dict()["memory"]
        env.transition(env.state.repeat_interleave(k), _actions(env, 1).detach().repeat_interleave(k, 0))
        assert one.state_dict()["memory"] is None and before is None
