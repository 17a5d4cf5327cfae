"""The ``bcg`` estimator (Bundled Contact Gradients, issue 9): trigger never = bptt bit for bit, zero perturbation
= bptt values bit for bit with bundles open, the lagged and rollback triggers, bundles of H steps that close at a
reset, a restored state that carries its bundles, window boundaries (env.detach) inside a bundle, rows that repeat an
environment, determinism."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest
import torch
from test_estimators import N, _actions, _env, _rollout

from bcg.envs import simulator_step
from bcg.estimators import EstimatorStats, make
from bcg.estimators.bundled import BCG, open_rows
from bcg.estimators.contact_trigger import ACTIVATION_KEY, ActivationTrigger
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
    assert open_rows(got[3].memory).numel() == 0 and got[3].memory["bcg.left"].shape == (N,)


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
    _, _, c, _ = simulator_step(env.model, s.q, s.qd, env.action_to_target(torch.zeros(N, 29)))
    point = BCG(aggregation="per_point").trigger_quantity(env.model, c)
    foot = BCG(aggregation="per_foot").trigger_quantity(env.model, c)
    assert (foot >= point).all() and (foot > point).any()


def test_a_restored_state_carries_its_bundles_and_detach_keeps_them() -> None:
    est = make("bcg", trigger="always", branches=2, horizon=3)
    env = _env(est)
    snap = env.state
    env.step(_actions(env, 0))
    assert open_rows(env.state.memory).tolist() == list(range(N))
    inside = env.state
    env.load_state(snap)  # a state from before the bundles: nothing open there, so new ones open
    env.step(_actions(env, 0))
    assert est.last_stats.envs_triggered == N
    env.load_state(inside)  # a state inside the bundles: they continue from it
    env.step(_actions(env, 1))
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * N
    env.load_state(snap)
    env.step(_actions(env, 0))
    env.detach()          # a window boundary inside the bundles: they continue, with no graph into the old window
    assert not env.state.memory["bcg.off_q"].requires_grad
    a = _actions(env, 1)
    _, rew, _, _, _ = env.step(a)
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * N
    assert env.state.memory["bcg.off_q"].requires_grad  # the offsets of the new window carry its graph
    rew.sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    env.reset(seed=0)
    assert open_rows(env.state.memory).numel() == 0


def test_rows_that_repeat_an_environment_carry_their_own_bundles() -> None:
    """Two rows of each environment (a branch batch) with bundles of H = 2: every row opens its own bundle and
    continues it from its own memory at the next call."""
    est = BCG(trigger="always", branches=2, horizon=2, seed=3)
    env = _env()
    s = env.state.repeat_interleave(2)
    t = env.action_to_target(torch.zeros(2 * N, 29), joint_offset=s.joint_offset).detach()
    q1, qd1, _, mem = est(env.model, s.q.detach(), s.qd.detach(), t, env_ids=s.env_id)
    assert est.last_stats.envs_triggered == 2 * N and open_rows(mem).tolist() == list(range(2 * N))
    assert not torch.equal(mem["bcg.off_q"][0::2], mem["bcg.off_q"][1::2])  # the copies drew their own offsets
    est(env.model, q1, qd1, t, env_ids=s.env_id, memory=mem)
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * 2 * N
    with pytest.raises(ValueError, match=f"memory holds bundles of 2 branches for {2 * N} rows, this step has "
                                         f"{2 * N} rows and 3 branches"):
        BCG(trigger="always", branches=3)(env.model, q1, qd1, t, env_ids=s.env_id, memory=mem)


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
    assert open_rows(s1.memory).tolist() == list(range(N))
    s2, *_ = env.transition(s1, a1)
    assert est.last_stats.envs_triggered == 0 and open_rows(s2.memory).numel() == 0
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
        q, qd, _, _ = simulator_step(env.model, q, qd, t0)
        q, qd, _, _ = simulator_step(env.model, q, qd, t1)
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

    def linear(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        q1 = torch.cat([q[:, :7], q[:, 7:] + 0.02 * qd[:, 6:] + 0.001 * targets], 1)
        z = q.new_zeros(q.shape[0], 8)
        return q1, qd @ A.T, ContactReport(z, z, z), {}

    env = _env()
    s = env.state
    q0 = s.q.clone()
    q0[:, 7:] = 0.0  # every hinge well inside its range: no clamping
    targets = env.action_to_target(torch.zeros(N, 29))
    nominal = linear(env.model, q0, s.qd, targets)
    for est in (GRS(branches=4, antithetic=True, sigma_q=0.01, sigma_qd=0.1),
                BCG(trigger="always", branches=4, horizon=2, antithetic=True, sigma_q=0.01, sigma_qd=0.1)):
        est.set_inner(linear)
        q1, qd1, _, mem = est(env.model, q0, s.qd, targets)
        torch.testing.assert_close(q1, nominal[0], rtol=0, atol=2e-6)
        torch.testing.assert_close(qd1, nominal[1], rtol=0, atol=2e-6)
    # the second step of the bcg bundle (branches continue from their own states)
    q2, qd2, _, _ = est(env.model, q1, qd1, targets, memory=mem)
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
    assert open_rows(env.state.memory).tolist() == [0, 2]  # the reset cleared env 1's memory
    _, _, _, trunc, _ = env.step(_actions(env, 1))
    assert trunc.tolist() == [True, False, True] and est.last_stats.envs_triggered == 1
    assert open_rows(env.state.memory).tolist() == [1]  # the autoreset cleared the memory of envs 0 and 2
    snap, sd = env.state.clone(), est.state_dict()
    a2 = _actions(env, 2)
    obs, rew, _, trunc, _ = env.step(a2)
    assert est.last_stats.envs_triggered == 2 and est.last_stats.branches_simulated == 3 * N
    # new bundles in envs 0 and 2 (H - 1 steps left); env 1's episode ended at this step, its reset closed the bundle
    assert trunc.tolist() == [False, True, False] and env.state.memory["bcg.left"].tolist() == [2, 0, 2]

    ref = BCG(**params)
    env_ref = _plain_env(ref, max_episode_steps=2)
    env_ref.load_state(snap.clear_memory(torch.tensor([True, False, True])))  # closed by hand
    ref.load_state_dict(sd)
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
    """``env.transition`` on rows that repeat an environment (``state.repeat_interleave(k)``) for every configuration,
    each row with its own memory; where nothing carries over (H = 1 with trigger always) each row equals grs with the
    same seed, bit for bit. Gathered rows of distinct environments continue their own bundles; a lookahead with the
    attached estimator leaves the env's state, and so its bundles, as they were."""
    from bcg.estimators.grs import GRS

    k = 2
    with torch.no_grad():
        est = BCG(trigger="always", branches=3, horizon=2, seed=4)
        env = _plain_env(est)
        s = env.state
        a = _actions(env, 0).detach()
        rows, *_ = env.transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))
        assert open_rows(rows.memory).tolist() == list(range(k * N)) and est.last_stats.envs_triggered == k * N
        for lagged in (BCG(tau=20.0), BCG(tau=20.0, horizon=1), BCG(timing="rollback")):  # lagged, or H > 1
            lagged.attach(env)
            nxt, *_ = env.transition(s.repeat_interleave(k), a.repeat_interleave(k, 0))
            assert nxt.memory["bcg.peak"].shape == (k * N, 2) and lagged.last_stats.envs == k * N

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
        assert open_rows(env.state.memory).tolist() == [0, 1, 2]
        idx = torch.tensor([0, 2])
        before = env.state
        ahead, *_ = env.transition(env.state[idx], _actions(env, 1).detach()[idx])
        assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 2 * 3
        assert open_rows(ahead.memory).numel() == 0  # their H = 2 steps are done
        # that call was a lookahead: the env's state and its bundles are untouched, its own step continues all three
        assert env.state is before and open_rows(env.state.memory).tolist() == [0, 1, 2]
        env.step(_actions(env, 1).detach())
        assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == 3 * N
        assert open_rows(env.state.memory).numel() == 0


def test_a_reset_of_another_row_keeps_an_open_bundles_graph() -> None:
    """Env 1 diverges inside its bundle (every branch NaN) and is reset while env 0's bundle is open: nothing changes
    for env 0, whose branches keep their own sensitivities (the graph of their offsets), so the gradient of its later
    reward to its first action is the one without the other row's reset. (Before the bundles moved into the state's
    memory, the estimator kept an offset's graph only when the incoming state tensor was the very one it returned;
    a reset of any other row made a new tensor, and so cut every open bundle's branch sensitivities.)"""
    grads = []
    for reset_other in (False, True):
        calls = []

        def inner(model, q, qd, targets, physics=None, *, env_ids=None, memory=None, calls=calls,
                  reset_other=reset_other):
            q1, qd1, c, mem = simulator_step(model, q, qd, targets, physics)
            calls.append(1)
            if reset_other and len(calls) == 2:
                qd1 = torch.where((env_ids == 1)[:, None], float("nan"), qd1)
            return q1, qd1, c, mem

        est = BCG(trigger="always", branches=3, horizon=3, seed=2, law="joint_gaussian", sigma_q=0.05,
                  sigma_qd=0.2).set_inner(inner)
        env = _env(est)
        a0 = _actions(env, 0)
        env.step(a0)
        _, _, term, _, _ = env.step(_actions(env, 1).detach())
        assert term.tolist() == [False, reset_other, False] and est.last_stats.envs_all_nonfinite == int(reset_other)
        _, rew, *_ = env.step(_actions(env, 2).detach())
        assert est.last_stats.envs_triggered == int(reset_other)  # env 0 is inside its bundle all along
        (g,) = torch.autograd.grad(rew[0], a0)
        assert g[0].abs().sum() > 0
        grads.append(g[0])
    assert torch.equal(grads[0], grads[1])


def test_activation_trigger_parameters() -> None:
    assert BCG(trigger="activation").activation_change == 0.5
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="activation_change"):
            BCG(trigger="activation", activation_change=bad)


def test_activation_changes_per_foot() -> None:
    """The per-foot quantity is the largest |sigmoid(kappa d_now) - recorded| of the foot's spheres; rows without a
    record (a cleared memory row) read 0."""
    env = _env()
    model, nc = env.model, len(env.model.sphere_foot)
    g = torch.Generator().manual_seed(5)
    d0, d1 = 0.01 * torch.randn(N, nc, generator=g), 0.01 * torch.randn(N, nc, generator=g)
    kappa = model.params.kappa
    recorded = torch.cat([torch.sigmoid(kappa * d0), torch.ones(N, 1)], 1)
    recorded[2] = 0.0  # row 2: nothing recorded
    c = ContactReport(torch.zeros(N, nc), torch.zeros(N, nc), d1)
    got = BCG(trigger="activation").contact_trigger.foot_quantity(model, c, {ACTIVATION_KEY: recorded})
    assert torch.equal(ActivationTrigger(0.5).foot_quantity(model, c), torch.zeros(N, len(model.foot_body)))
    change = (torch.sigmoid(kappa * d1) - torch.sigmoid(kappa * d0)).abs()
    foot = torch.as_tensor(model.sphere_foot)
    for f in range(len(model.foot_body)):
        torch.testing.assert_close(got[:2, f], change[:2, foot == f].amax(1), rtol=0, atol=0)
    assert torch.equal(got[2], torch.zeros(len(model.foot_body)))


def _dropped_env(est):
    """The jump env through ``est``, its robots at rest 3 cm above their reset pose (in the air), no memory."""
    env = _env(est)
    s = env.state
    q = s.q.clone()
    q[:, 2] += 0.03
    env.load_state(dataclasses.replace(s, q=q, qd=torch.zeros_like(s.qd), memory={}))
    return env


def test_activation_trigger_opens_bundles_at_a_touchdown() -> None:
    """Three robots dropped from 3 cm: nothing triggers in the air or at the first step (no record yet); each row's
    bundle opens the step after one of its spheres' activation moved by more than 0.2 (lagged, as the force trigger),
    which happens for every row within a few steps of its touchdown; the memory's per-foot quantity is that change."""
    est = make("bcg", trigger="activation", activation_change=0.2, branches=2, horizon=2)
    env = _dropped_env(est)
    kappa, triggered, prev = env.model.params.kappa, torch.zeros(N, dtype=torch.bool), None
    for k in range(10):
        incoming = env.state.memory
        _, _, term, _, info = env.step(_actions(env, k).detach())
        assert not term.any()
        act = torch.sigmoid(kappa * info["contact_penetration"])
        if k == 0:
            assert est.last_stats.envs_triggered == 0 and (info["contact_penetration"] < -0.01).all()
        else:
            expect = (incoming["bcg.peak"].amax(1) > 0.2) & (incoming["bcg.left"] == 0)
            assert est.last_stats.envs_triggered == int(expect.sum())
            triggered |= expect
        got = env.state.memory["bcg.peak"].amax(1)
        want = torch.zeros(N) if prev is None else (act - prev).abs().amax(1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        prev = act
    assert triggered.all()


def test_activation_trigger_at_its_ceiling_is_bptt() -> None:
    """An activation change above 1 is impossible: activation_change = 1 never bundles and the rollout equals bptt
    bit for bit (values and gradients)."""
    plain = _rollout(_env())
    est = make("bcg", trigger="activation", activation_change=1.0)
    got = _rollout(_env(est))
    assert torch.equal(plain[0], got[0]) and torch.equal(plain[1], got[1])
    assert all(torch.equal(a, b) for a, b in zip(plain[2], got[2], strict=True))
    assert est.total_stats.envs_triggered == 0 and "bcg.act" in got[3].memory


def test_bundle_sizes_from_the_trigger_quantity() -> None:
    est = BCG(size="sensitivity", branches=10, min_branches=2, tau=400.0)
    got = est.bundle_sizes(torch.tensor([400.0, 500.0, 800.0, 2000.0]))
    assert got.tolist() == [2, 4, 8, 10]  # ceil(2 (x / 400)^2), clamped to [2, 10]
    assert BCG(size="sensitivity", branches=10, min_branches=3, antithetic=True).bundle_sizes(
        torch.tensor([400.0, 470.0])).tolist() == [4, 6]  # 3 -> 4, ceil(4.14) = 5 -> 6: pairs stay whole
    assert BCG().bundle_sizes(torch.tensor([400.0, 5000.0])).tolist() == [10, 10]
    for bad in ({"trigger": "always"}, {"trigger": "never"}, {"min_branches": 11}, {"min_branches": 0}):
        with pytest.raises(ValueError):
            BCG(size="sensitivity", **bad)


def test_sized_bundles_simulate_and_average_only_their_branches() -> None:
    """tau = 60 N opens a bundle in every environment at step 1 (their step-0 forces: 94, 97, 116 N); with
    size="sensitivity" each gets the branches its force sets (3, 3, 4 of 8), simulates only those (at the step it
    opens and the step it continues); with min_branches = branches it is the fixed size bit for bit, values and
    gradients."""
    B, N_rows = 8, N
    seen: list = []

    def inner(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        out = simulator_step(model, q, qd, targets, physics)
        seen.append((env_ids.clone(), out[1].detach().clone()))
        return out

    est = BCG(tau=60.0, branches=B, size="sensitivity", min_branches=1, seed=3).set_inner(inner)
    env = _env(est)
    env.step(_actions(env, 0).detach())
    peak = env.state.memory["bcg.peak"]
    sizes = est.bundle_sizes(torch.where(peak > 60.0, peak, torch.zeros_like(peak)).amax(1))
    assert sizes.tolist() == [3, 3, 4]
    env.step(_actions(env, 1).detach())
    assert est.last_stats.envs_triggered == N_rows and est.last_stats.branches_simulated == int(sizes.sum())
    ids, qd_rows = seen[-1]  # one inner call: each environment's own branches only, and the mean is theirs
    for e in range(N_rows):
        assert int((ids == e).sum()) == sizes[e]
        torch.testing.assert_close(env.state.qd[e], qd_rows[ids == e].mean(0), rtol=1e-5, atol=1e-5)
    assert est.last_stats.nonfinite_dropped == 0
    off = env.state.memory["bcg.off_q"]  # the branches past a bundle's size carry no offset (NaN), the others do
    for e in range(N_rows):
        assert torch.isfinite(off[e, :sizes[e]]).all() and torch.isnan(off[e, sizes[e]:]).all()
    env.step(_actions(env, 2).detach())  # the bundles continue with their own sizes
    assert est.last_stats.envs_triggered == 0 and est.last_stats.branches_simulated == int(sizes.sum())
    full = _run(make("bcg", tau=60.0, branches=B, seed=3), 3)
    same = _run(make("bcg", tau=60.0, branches=B, seed=3, size="sensitivity", min_branches=B), 3)
    assert torch.equal(full[1], same[1]) and all(torch.equal(a, b) for a, b in zip(full[2], same[2], strict=True))


def test_activation_trigger_with_rollback_opens_at_the_switching_step() -> None:
    """timing="rollback": the nominal step is simulated first and the rows whose activation moved by more than the
    threshold in it are re-simulated as bundles in the same step (no lag): the triggered rows are exactly those of the
    nominal call's contact report against the recorded activations."""
    calls: list = []

    def inner(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        out = simulator_step(model, q, qd, targets, physics)
        calls.append((env_ids.clone(), out[2]))
        return out

    est = BCG(trigger="activation", activation_change=0.2, timing="rollback", branches=2).set_inner(inner)
    env = _dropped_env(est)
    rule, opened = est.contact_trigger, 0
    for k in range(10):
        incoming, calls[:] = env.state.memory, []
        env.step(_actions(env, k).detach())
        free = (incoming.get("bcg.left", torch.zeros(N, dtype=torch.long)) == 0).nonzero().flatten()
        if free.numel() == 0:  # every row inside its bundle: no nominal call, nothing new opens
            assert len(calls) == 1 and est.last_stats.envs_triggered == 0
            continue
        ids, c = calls[0]  # the nominal rows of the step (those without an open bundle)
        assert torch.equal(ids, free)
        hit = rule.foot_quantity(env.model, c, {key: t[ids] for key, t in incoming.items()}) > 0.2
        assert est.last_stats.envs_triggered == int(hit.any(1).sum())
        opened += est.last_stats.envs_triggered
    assert opened >= N  # every robot lands within the 10 steps


def test_gradient_of_a_sized_bundle_is_the_mean_of_its_own_branch_gradients() -> None:
    """size="sensitivity" through a whole bundle (H = 2, up to 8 branches, sizes 3, 3, 4 from the step-0 forces):
    autograd of a loss linear in the bundle's final mean equals, per environment, the mean of the gradients of its
    first B_e branches simulated one by one; the branches past its size contribute nothing."""
    from bcg.estimators.grs import joint_gaussian_offsets

    B, seed = 8, 5
    est = BCG(tau=60.0, branches=B, size="sensitivity", min_branches=1, horizon=2, seed=seed, law="joint_gaussian",
              sigma_q=0.05, sigma_qd=0.2)
    env = _env(est)
    s0, *_ = env.transition(env.state, _actions(env, 0).detach())  # nominal: records the forces
    peak = s0.memory["bcg.peak"]
    sizes = est.bundle_sizes(torch.where(peak > 60.0, peak, torch.zeros_like(peak)).amax(1))
    assert sizes.tolist() == [3, 3, 4]
    a0, a1 = _actions(env, 1), _actions(env, 2)
    s1, *_ = env.transition(s0, a0)
    s2, *_ = env.transition(s1, a1)
    g = torch.Generator().manual_seed(11)
    w_q, w_qd = torch.randn(29, generator=g), torch.randn(35, generator=g)

    def loss(q, qd):  # one term per row
        return (q[:, 7:] * w_q).sum(1) + (qd * w_qd).sum(1) + q[:, :3].sum(1)

    ga0, ga1 = torch.autograd.grad(loss(s2.q, s2.qd).sum(), (a0, a1))
    dq, dqd = joint_gaussian_offsets(env.model, s0.q, s0.qd, B, 0.05, 0.2, False, torch.Generator().manual_seed(seed))
    per0, per1 = [], []
    for b in range(B):  # every branch on its own (a test, not a hot path)
        q = s0.q + torch.cat([torch.zeros(N, 7), dq[:, b]], 1)
        qd = s0.qd + torch.cat([torch.zeros(N, 6), dqd[:, b]], 1)
        q, qd, _, _ = simulator_step(env.model, q, qd, env.action_to_target(a0))
        q, qd, _, _ = simulator_step(env.model, q, qd, env.action_to_target(a1))
        b0, b1 = torch.autograd.grad(loss(q, qd).sum(), (a0, a1))
        per0.append(b0)
        per1.append(b1)
    for e in range(N):
        torch.testing.assert_close(ga0[e], torch.stack(per0)[:sizes[e], e].mean(0), rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(ga1[e], torch.stack(per1)[:sizes[e], e].mean(0), rtol=1e-3, atol=1e-4)
