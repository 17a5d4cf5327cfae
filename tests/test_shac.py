"""SHAC (bcg.agents.shac): TD(lambda) targets, the actor loss against finite differences, learning on a standing
pose, the update guards, the exact state round trip, the policy export and config validation."""

from __future__ import annotations

import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import bcg.agents.shac as shac_mod
from bcg.agents.shac import PRESETS, SHAC, SHACConfig, td_lambda_targets
from bcg.envs import EnvConfig

# ------------------------------------------------------------------------------------------------ helpers


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One intra-op thread: on a shared 2-core machine torch's second thread spins while the other core is busy,
    which made the learning check 10-30x slower (docs/envs.md, Throughput)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)



class ToyEnv:
    """A tiny differentiable batched env with the step interface of G1TrackingVectorEnv (float64).

    x' = 0.8 x + 0.3 W tanh(a) + 0.05 sin(x); reward 1 - |x' - x*|^2; obs = [x, sin(x)] (4-D, x 2-D).
    Environment 0 terminates at its 3rd step of every episode (a fall), environment 1 is truncated at its 5th (a
    time-out); both times are state-independent, so the loss stays smooth in the policy parameters. With
    ``nan_timeout`` the pre-reset observation of environment 1's time-outs is NaN (the bootstrap must ignore it).
    """

    obs_dim, act_dim = 4, 2

    def __init__(self, num_envs: int = 3, nan_timeout: bool = False):
        self.num_envs = num_envs
        self.device = torch.device("cpu")
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float64)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (self.act_dim,), np.float64)
        self.transition_fn = None
        self.nan_timeout = nan_timeout
        self.W = torch.tensor([[1.0, -0.5], [0.3, 0.8]], dtype=torch.float64)
        self.target = torch.tensor([0.5, -0.3], dtype=torch.float64)
        self.x0 = torch.linspace(-0.4, 0.4, num_envs, dtype=torch.float64)[:, None].repeat(1, 2)
        self.x0[:, 1] *= -0.5
        self.x = self.x0.clone()
        self.t = torch.zeros(num_envs, dtype=torch.long)

    def _obs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, torch.sin(x)], 1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.x, self.t = self.x0.clone(), torch.zeros_like(self.t)
        return self._obs(self.x), {}

    def detach(self) -> None:
        self.x = self.x.detach()

    def snapshot(self):
        return self.x.detach().clone(), self.t.clone()

    def restore(self, snap) -> None:
        self.x, self.t = snap[0].clone(), snap[1].clone()

    def step(self, actions: torch.Tensor):
        x = 0.8 * self.x + 0.3 * torch.tanh(actions) @ self.W.T + 0.05 * torch.sin(self.x)
        reward = 1.0 - (x - self.target).square().sum(1)
        self.t = self.t + 1
        terminated = torch.zeros(self.num_envs, dtype=torch.bool)
        truncated = torch.zeros(self.num_envs, dtype=torch.bool)
        terminated[0] = bool(self.t[0] == 3)
        truncated[1] = bool(self.t[1] == 5)
        done = terminated | truncated
        final = self._obs(x)
        if self.nan_timeout and bool(truncated[1]):
            final = final.clone()
            final[1] = float("nan")
        x = torch.where(done[:, None], self.x0, x)
        self.t = torch.where(done, torch.zeros_like(self.t), self.t)
        self.x = x
        info = {"final_obs": final, "_final_obs": done, "tracking_error": (x - self.target).norm(dim=1).detach(),
                "num_unstable": 0}
        return self._obs(x), reward, terminated, truncated, info


def toy_config(**kw) -> SHACConfig:
    base = dict(num_envs=3, horizon=8, actor_hidden=(8,), critic_hidden=(8,), num_critics=2, critic_iterations=2,
                critic_minibatches=2, max_iterations=50, target_critic_alpha=0.5)
    base.update(kw)
    return SHACConfig(**base)


@pytest.fixture
def toy(monkeypatch):
    """``make(config, **env_kw)``: a SHAC agent on :class:`ToyEnv`, float64 networks."""
    made = []

    def make(config: SHACConfig, **env_kw) -> SHAC:
        monkeypatch.setattr(shac_mod, "make_env", lambda cfg, env_cfg: ToyEnv(cfg.num_envs, **env_kw))
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            agent = SHAC(config, EnvConfig(), seed=0)
        finally:
            torch.set_default_dtype(old)
        made.append(agent)
        return agent

    return make


def standing_motion(seconds: float = 2.0):
    """A constant standing pose (the G1's default pose) at 50 Hz, as a bcg.motion.Motion."""
    from bcg.motion import Motion
    from bcg.robots.g1 import default_qpos

    q = np.repeat(default_qpos()[None], round(seconds / 0.02) + 1, 0)
    return Motion.from_qpos(q, 0.02, name="standing")


# ------------------------------------------------------------------------------------------------ TD(lambda)


def test_td_lambda_targets_hand_computed() -> None:
    g, lam = 0.9, 0.5
    r = torch.tensor([[1.0, 0.5], [2.0, 1.0], [0.0, 2.0], [1.0, -1.0]])
    v = torch.tensor([[10.0, 4.0], [0.0, 6.0], [20.0, 8.0], [30.0, 10.0]])  # V'(s_{t+1}); env 0 falls at t = 1
    d = torch.tensor([[False, False], [True, False], [False, True], [False, False]])  # env 1 times out at t = 2
    out = td_lambda_targets(r, v, d, g, lam)
    # environment 0: the fall at t = 1 ends the first segment (V' = 0 there); t = 3 is the window end
    e0_3 = 1.0 + 0.9 * 30.0                                   # 28.0
    e0_2 = 0.0 + 0.9 * (0.5 * 20.0 + 0.5 * e0_3)              # 21.6
    e0_1 = 2.0 + 0.9 * 0.0                                    # 2.0
    e0_0 = 1.0 + 0.9 * (0.5 * 10.0 + 0.5 * e0_1)              # 6.4
    # environment 1: the time-out at t = 2 bootstraps with the pre-reset value 8
    e1_3 = -1.0 + 0.9 * 10.0                                  # 8.0
    e1_2 = 2.0 + 0.9 * 8.0                                    # 9.2
    e1_1 = 1.0 + 0.9 * (0.5 * 6.0 + 0.5 * e1_2)               # 7.84
    e1_0 = 0.5 + 0.9 * (0.5 * 4.0 + 0.5 * e1_1)               # 5.828
    want = torch.tensor([[e0_0, e1_0], [e0_1, e1_1], [e0_2, e1_2], [e0_3, e1_3]])
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(want, torch.tensor([[6.4, 5.828], [2.0, 7.84], [21.6, 9.2], [28.0, 8.0]]))
    # the same as the truncated lambda-return (1 - lam) sum_k lam^(k-1) G^(k) + lam^(T-1) G^(T) of env 0 at t = 2
    g1 = 0.0 + 0.9 * 20.0
    g2 = 0.0 + 0.9 * 1.0 + 0.81 * 30.0
    assert math.isclose(float(out[2, 0]), 0.5 * g1 + 0.5 * g2, rel_tol=1e-6)


def test_td_lambda_equals_diffrl_two_accumulator_recursion() -> None:
    gen = torch.Generator().manual_seed(0)
    n, e, g, lam = 12, 5, 0.99, 0.95
    r = torch.randn(n, e, generator=gen, dtype=torch.float64)
    v = torch.randn(n, e, generator=gen, dtype=torch.float64)
    d = torch.rand(n, e, generator=gen) < 0.2
    out = td_lambda_targets(r, v, d, g, lam)
    # DiffRL algorithms/shac.py compute_target_values (done_mask with the last step forced to 1)
    dm = d.to(torch.float64).clone()
    dm[-1] = 1.0
    f64 = dict(dtype=torch.float64)
    A, B, lm = torch.zeros(e, **f64), torch.zeros(e, **f64), torch.ones(e, **f64)
    want = torch.empty_like(r)
    for i in reversed(range(n)):
        lm = lm * lam * (1.0 - dm[i]) + dm[i]
        A = (1.0 - dm[i]) * (lam * g * A + g * v[i] + (1.0 - lm) / (1.0 - lam) * r[i])
        B = g * (v[i] * dm[i] + B * (1.0 - dm[i])) + r[i]
        want[i] = (1.0 - lam) * A + lm * B
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------ actor loss


def _window_loss(agent: SHAC, snap) -> torch.Tensor:
    """The actor loss of one window from the saved toy state (env, normalisers, noise, counters)."""
    env_snap, sd = snap
    agent.env.restore(env_snap)
    agent.obs_rms.load_state_dict(sd["obs_rms"])
    agent.ret_rms.load_state_dict(sd["ret_rms"])
    agent.noise_gen.set_state(sd["noise"])
    agent._ret, agent._obs, agent._critic_obs = sd["ret"].clone(), sd["obs"].clone(), sd["obs"].clone()
    norm, ret_std = agent._begin_window()
    return agent._rollout(norm, ret_std).actor_loss


@pytest.mark.parametrize("nan_timeout", [False, True])
def test_actor_loss_matches_finite_differences(toy, nan_timeout: bool) -> None:
    agent = toy(toy_config(), nan_timeout=nan_timeout)
    for _ in range(2):  # non-trivial normalisers, critics and return statistics
        agent.train_iteration()
    snap = (agent.env.snapshot(), {"obs_rms": agent.obs_rms.state_dict(), "ret_rms": agent.ret_rms.state_dict(),
                                   "noise": agent.noise_gen.get_state(), "ret": agent._ret.clone(),
                                   "obs": agent._obs.clone()})
    assert agent.ret_rms.var.item() != 1.0 and agent.obs_rms.count.item() > 10
    loss = _window_loss(agent, snap)
    assert torch.isfinite(loss)
    params = dict(agent.actor.named_parameters())
    grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    assert all(torch.isfinite(g).all() for g in grads.values())
    h = 1e-6
    checked = 0
    # an entry of the first layer's weights, of the output bias and of the log-std
    for name, idx in [("mean_net.0.weight", (1, 2)), ("mean_net.3.bias", (1,)), ("log_std", (0,))]:
        p, g = params[name], grads[name]
        with torch.no_grad():
            old = p[idx].item()
            p[idx] = old + h
            lp = _window_loss(agent, snap).item()
            p[idx] = old - h
            lm = _window_loss(agent, snap).item()
            p[idx] = old
        fd = (lp - lm) / (2 * h)
        # measured: |autograd - fd| = 3e-11 .. 7e-11 for |fd| = 6e-4 .. 0.15 (float64, h = 1e-6)
        assert abs(g[idx].item() - fd) <= 1e-9 + 1e-7 * abs(fd), (name, idx, g[idx].item(), fd)
        checked += abs(fd) > 1e-6
    assert checked == 3  # the loss does depend on these parameters


def test_nan_timeout_observation_bootstraps_zero(toy) -> None:
    agent = toy(toy_config(horizon=6), nan_timeout=True)
    norm, ret_std = agent._begin_window()
    w = agent._rollout(norm, ret_std)
    # environment 1 times out at its 5th step (t = 4): pre-reset observation NaN -> V' = 0; env 0 falls at t = 2
    assert w.dones[4, 1] and w.next_values[4, 1] == 0.0 and w.dones[2, 0] and w.next_values[2, 0] == 0.0
    assert torch.isfinite(w.next_values).all() and torch.isfinite(w.actor_loss)
    assert (w.next_values[:, 2] != 0).all()  # environment 2 never ends: its bootstrap is the critic's


# ------------------------------------------------------------------------------------------------ guards


def test_nonfinite_actor_gradient_is_skipped_and_counted(toy) -> None:
    agent = toy(toy_config())
    agent.train_iteration()
    before = {k: v.detach().clone() for k, v in agent.actor.state_dict().items()}
    opt_steps = [s["step"].item() for s in agent.actor_opt.state.values()]
    hook = agent.actor.log_std.register_hook(lambda g: g * float("nan"))
    m = agent.train_iteration()
    hook.remove()
    assert m["skipped_updates"] == 1 and m["skipped_actor_updates"] == 1 and not math.isfinite(m["grad_norm"])
    for k, v in agent.actor.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert [s["step"].item() for s in agent.actor_opt.state.values()] == opt_steps  # Adam untouched
    m = agent.train_iteration()  # the next update is applied again
    assert m["skipped_updates"] == 1 and math.isfinite(m["grad_norm"])
    assert any(not torch.equal(v, before[k]) for k, v in agent.actor.state_dict().items())


def test_absurd_gradient_norm_is_skipped(toy) -> None:
    agent = toy(toy_config(skip_grad_norm=1e-12))  # every norm is "absurd"
    before = {k: v.detach().clone() for k, v in agent.critics.state_dict().items()}
    m = agent.train_iteration()
    cfg = agent.config
    assert m["skipped_actor_updates"] == 1
    assert m["skipped_critic_updates"] == cfg.critic_iterations * cfg.critic_minibatches
    assert m["skipped_updates"] == 1 + cfg.critic_iterations * cfg.critic_minibatches
    for k, v in agent.critics.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("clip", [1e3, 1e-3])
def test_guarded_step_equals_clip_then_step_bit_for_bit(toy, clip: float) -> None:
    """Below the clip the step leaves out the clip's multiplication by 1.0; above it, it clips: either way the
    parameters and Adam's moments equal clip_grads_with_norm_ followed by the step, exactly."""
    import copy

    agent = toy(toy_config())
    agent.train_iteration()
    agent.sync()
    params = list(agent.critics.parameters())
    twin = copy.deepcopy(agent.critics)
    twin_opt = torch.optim.Adam(twin.parameters())
    twin_opt.load_state_dict(copy.deepcopy(agent.critic_opt.state_dict()))
    obs = torch.randn(5, agent.obs_dim, dtype=params[0].dtype)
    for net in (agent.critics, twin):
        net(obs).square().sum().backward()
    norm, applied = agent._guarded_step(agent.critic_opt, params, clip)
    assert applied and (norm < clip) == (clip == 1e3)
    torch.nn.utils.clip_grads_with_norm_(list(twin.parameters()), clip, torch.tensor(norm))
    twin_opt.step()
    for p, q in zip(params, twin.parameters(), strict=True):
        assert torch.equal(p, q)
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(agent.critic_opt.state[p][k], twin_opt.state[q][k])


def test_the_critic_fit_runner_gives_the_serial_fit_on_its_thread() -> None:
    """CriticFitRunner: a fit begun beside the caller (its thread) ends in the serial fit's numbers, parameters and
    Adam moments, bit for bit; join() is None once joined; close() drops what is pending; a bad worker is refused."""
    from bcg.agents.critic_fit import CriticFitRunner
    from bcg.agents.networks import CriticEnsemble
    from bcg.agents.threads import available_cores, torch_threads

    torch.manual_seed(0)
    nets = [CriticEnsemble(7, (8,), 2, "elu", False) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [torch.optim.Adam(n.parameters(), lr=1e-3, fused=True) for n in nets]
    runners = [CriticFitRunner(n, o, passes=3, minibatches=2, clip=1.0, skip_norm=1e6, threads=1, overlap=overlap)
               for n, o, overlap in zip(nets, opts, (False, True), strict=True)]
    obs, targets = torch.randn(12, 7), torch.randn(12)
    with torch_threads(1):
        started = [r.start(obs, targets, 3e-4) for r in runners]
        results = [r.join() for r in runners]
    assert started == [False, available_cores() >= 2]
    assert results[0] == results[1] and results[0][3] == 0 and runners[0].join() is None
    for p, q in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(p, q) and all(torch.equal(opts[0].state[p][k], opts[1].state[q][k])
                                         for k in ("exp_avg", "exp_avg_sq"))
    assert opts[1].param_groups[0]["lr"] == 3e-4
    runners[1].start(obs, targets, 3e-4)
    runners[1].close()
    assert runners[1].join() is None and runners[1].thread is None
    with pytest.raises(ValueError, match="critic_fit_worker must be 'thread' or 'process', got 'gpu'"):
        CriticFitRunner(nets[0], opts[0], passes=1, minibatches=1, clip=1.0, skip_norm=1e6, threads=1, overlap=True,
                        worker="gpu")


def test_critic_nan_gradient_is_skipped(toy) -> None:
    agent = toy(toy_config())
    p = next(agent.critics.parameters())
    hook = p.register_hook(lambda g: g * float("nan"))
    before = {k: v.detach().clone() for k, v in agent.critics.state_dict().items()}
    m = agent.train_iteration()
    hook.remove()
    assert m["skipped_actor_updates"] == 0 and m["skipped_critic_updates"] == 4
    for k, v in agent.critics.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_diverged_environment_is_reset_and_counted() -> None:
    """A NaN from the physics for environment 0 at one step: the env resets it, SHAC counts it and trains on."""
    from bcg.envs import simulator_step
    from bcg.estimators import make

    calls = []

    def flaky(model, q, qd, targets, physics=None, *, env_ids, memory):
        q1, qd1, contact, _ = simulator_step(model, q, qd, targets, physics)
        calls.append(1)
        if len(calls) == 3:
            q1 = q1.clone()
            q1[0, 10] = float("nan")
        return q1, qd1, contact, {}

    est = make("bptt").set_inner(flaky)
    cfg = SHACConfig(num_envs=2, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=1)
    agent = SHAC(cfg, EnvConfig(motion_file=standing_motion(0.5)), estimator=est)
    m = agent.train_iteration()
    assert m["nonfinite_resets"] == 1 and m["skipped_updates"] == 0 and math.isfinite(m["actor_loss"])
    assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    m = agent.train_iteration()
    assert m["nonfinite_resets"] == 1


# ------------------------------------------------------------------------------------------------ exact state


def _numbers(m: dict[str, float]) -> list[float]:
    return [m[k] for k in sorted(m)]


@pytest.mark.parametrize("estimator", ["bptt", "bcg", "bptt+add"])
def test_state_dict_round_trip_is_exact(tmp_path, estimator: str) -> None:
    from bcg.agents.add import ADDConfig
    from bcg.estimators import make

    def new_agent() -> SHAC:
        est = make("bcg", tau=20.0, branches=3) if estimator == "bcg" else None  # tau 20 N: bundles open at once
        add = ADDConfig(hidden=(16,), replay_capacity=50, replay_push=4) if estimator.endswith("add") else None
        cfg = SHACConfig(num_envs=2, horizon=3, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=2,
                         critic_minibatches=2, max_iterations=10, target_critic_alpha=0.9)
        return SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3), domain_randomization=True), estimator=est,
                    add=add, seed=3)

    a = new_agent()
    for _ in range(2):
        a.train_iteration()
    path = tmp_path / "shac.pt"
    torch.save(a.state_dict(), path)
    cont = [_numbers(a.train_iteration()) for _ in range(2)]
    b = new_agent()
    b.load_state_dict(torch.load(path, weights_only=True))
    resumed = [_numbers(b.train_iteration()) for _ in range(2)]
    assert cont == resumed  # bit for bit (NaN-free: episodes end within 0.3 s clips)
    if estimator == "bcg":  # bundles were open across the save (the estimator's state travelled with the agent)
        assert a.estimator.total_stats.envs_triggered > 0
    for (k, v), (k2, v2) in zip(a.actor.state_dict().items(), b.actor.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    assert a.samples == b.samples and a.iteration == b.iteration == 4
    assert a.env.state.equal(b.env.state)
    if estimator.endswith("add"):  # the ADD reward is the env's reward and its discriminator learns once a window
        assert a.env.reward_fn is a.add_reward and a.add_reward.num_updates == b.add_reward.num_updates == 4
        assert math.isfinite(a.train_iteration()["disc_loss"])


CRITIC_COLUMNS = ("critic_loss", "critic_loss_new", "critic_grad_norm", "skipped_critic_updates", "skipped_updates")


@pytest.mark.parametrize("estimator", ["bcg", "bptt+add"])
def test_the_critic_fit_beside_the_actor_update_changes_no_number(tmp_path, estimator: str) -> None:
    """overlap_critic_fit (the fit on a second thread while the actor's backward pass, the ADD update and the next
    window's steps run): every metric and parameter equal to the serial order's, bit for bit, over iterations with
    bundles open and episodes ending; the critic columns are the previous window's fit (NaN at the first); a saved
    state joins the fit and resumes exactly; the fit did run on the other thread; an error inside it reaches the
    caller."""
    import threading

    from bcg.agents.add import ADDConfig
    from bcg.estimators import make

    def new_agent(overlap: bool) -> SHAC:
        est = make("bcg", tau=20.0, branches=3) if estimator == "bcg" else None
        add = ADDConfig(hidden=(16,), replay_capacity=50, replay_push=4) if estimator.endswith("add") else None
        cfg = SHACConfig(num_envs=3, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=3,
                         critic_minibatches=2, max_iterations=10, target_critic_alpha=0.9)
        return SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3), domain_randomization=True), estimator=est,
                    add=add, seed=5, overlap_critic_fit=overlap)

    serial, overlapped = new_agent(False), new_agent(True)
    threads = set()
    fit = overlapped.critic_fit.fit

    def recording_fit(obs, targets):
        threads.add(threading.current_thread().name)
        return fit(obs, targets)

    overlapped.critic_fit.fit = recording_fit
    before = None
    for _ in range(4):
        m_s, m_o = serial.train_iteration(), overlapped.train_iteration()
        assert _numbers({k: v for k, v in m_s.items() if k not in CRITIC_COLUMNS}) == \
            _numbers({k: v for k, v in m_o.items() if k not in CRITIC_COLUMNS})
        if before is None:
            assert math.isnan(m_o["critic_loss"])
        else:
            assert [m_o[k] for k in CRITIC_COLUMNS[:3]] == [before[k] for k in CRITIC_COLUMNS[:3]]
        before = m_s
    assert threads and all(name.startswith("bcg-critic-fit") for name in threads)
    path = tmp_path / "overlapped.pt"
    torch.save(overlapped.state_dict(), path)  # joins the last fit
    for a, b in ((serial.actor, overlapped.actor), (serial.critics, overlapped.critics),
                 (serial.target_critics, overlapped.target_critics)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    resumed = new_agent(True)
    resumed.load_state_dict(torch.load(path, weights_only=True))
    assert _numbers(resumed.train_iteration()) == _numbers(overlapped.train_iteration())

    def broken_fit(obs, targets):
        raise RuntimeError("fit failed")

    overlapped.critic_fit.fit = broken_fit
    overlapped.train_iteration()  # the fit begins on the other thread; its error surfaces when it is joined
    with pytest.raises(RuntimeError, match="fit failed"):
        overlapped.train_iteration()


def test_the_critic_fit_in_a_worker_process_changes_no_number(tmp_path) -> None:
    """critic_fit_worker="process": the overlapping fit runs in another process on the critics and Adam state in
    shared memory, and every metric and parameter equals the serial order's bit for bit (the critic columns one
    window late, as on the thread); a saved state joins it and resumes exactly in a new agent with its own worker; a
    worker that dies is reported where the fit is joined."""
    import os

    from bcg.estimators import make

    def new_agent(overlap: bool) -> SHAC:
        cfg = SHACConfig(num_envs=3, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=3,
                         critic_minibatches=2, max_iterations=10, target_critic_alpha=0.9)
        return SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3), domain_randomization=True),
                    estimator=make("bcg", tau=20.0, branches=3), seed=5, overlap_critic_fit=overlap,
                    critic_fit_worker="process")

    serial, worker = new_agent(False), new_agent(True)
    before = None
    for _ in range(3):
        m_s, m_w = serial.train_iteration(), worker.train_iteration()
        assert _numbers({k: v for k, v in m_s.items() if k not in CRITIC_COLUMNS}) == \
            _numbers({k: v for k, v in m_w.items() if k not in CRITIC_COLUMNS})
        if before is not None:
            assert [m_w[k] for k in CRITIC_COLUMNS[:3]] == [before[k] for k in CRITIC_COLUMNS[:3]]
        before = m_s
    assert serial.critic_fit.process is None and worker.critic_fit.process._proc.pid != os.getpid()
    path = tmp_path / "worker.pt"
    torch.save(worker.state_dict(), path)  # joins the last fit
    for a, b in ((serial.critics, worker.critics), (serial.target_critics, worker.target_critics)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    for p, q in zip(serial.critics.parameters(), worker.critics.parameters(), strict=True):
        assert all(torch.equal(serial.critic_opt.state[p][k], worker.critic_opt.state[q][k])
                   for k in ("step", "exp_avg", "exp_avg_sq"))
    resumed = new_agent(True)
    resumed.load_state_dict(torch.load(path, weights_only=True))
    assert _numbers(resumed.train_iteration()) == _numbers(worker.train_iteration())
    resumed.sync()
    worker.critic_fit.process._proc.kill()
    worker.critic_fit.process._proc.join()
    with pytest.raises(RuntimeError, match="critic fit process ended unexpectedly"):
        worker.train_iteration()
        worker.train_iteration()


def test_a_worker_process_that_cannot_start_leaves_the_fit_on_a_thread(monkeypatch) -> None:
    """Where no worker process may start (a daemonic pool worker, say), the agent warns once and fits on the second
    thread, with the same numbers; stop_workers ends the thread (and a worker) and the next iteration starts it
    again."""
    from bcg.agents import critic_fit

    def refuse(*a, **k):
        raise AssertionError("daemonic processes are not allowed to have children")

    monkeypatch.setattr(critic_fit, "ProcessCriticFit", refuse)
    cfg = SHACConfig(num_envs=2, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=2,
                     critic_minibatches=2)
    agents = [SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3)), seed=3, overlap_critic_fit=overlap,
                   critic_fit_worker="process") for overlap in (False, True)]
    with pytest.warns(RuntimeWarning, match="cannot run in a worker process here .*daemonic.*second thread"):
        agents[1].train_iteration()
    agents[0].train_iteration()
    assert agents[1].critic_fit_worker == "thread" and agents[1].critic_fit.thread is not None
    agents[1].stop_workers()
    assert agents[1].critic_fit.thread is None and agents[1].critic_fit.process is None
    m = [a.train_iteration() for a in agents]
    assert _numbers({k: v for k, v in m[0].items() if k not in CRITIC_COLUMNS}) == \
        _numbers({k: v for k, v in m[1].items() if k not in CRITIC_COLUMNS})


def test_the_worker_process_fit_equals_the_fit_here_with_skipped_steps() -> None:
    """ProcessCriticFit against fit_critics on copies of the same critics: the same losses, norms and skipped steps
    (a window with a non-finite target skips every step), parameters and Adam moments, bit for bit."""
    import copy

    from bcg.agents.critic_fit import ProcessCriticFit, fit_critics
    from bcg.agents.networks import CriticEnsemble

    torch.manual_seed(0)
    here = CriticEnsemble(12, (8, 8), 2)
    there = copy.deepcopy(here)
    opts = [torch.optim.Adam(c.parameters(), lr=1e-2, betas=(0.7, 0.95), fused=True) for c in (here, there)]
    worker = ProcessCriticFit(there, opts[1], rows=20, passes=3, minibatches=2, clip=0.5, skip_norm=1e3)
    try:
        for w in range(3):
            obs, targets = torch.randn(20, 12), torch.randn(20)
            if w == 1:
                targets[3] = float("inf")
            a = fit_critics(here, opts[0], obs, targets, 3, 2, 0.5, 1e3)
            b = worker.submit(obs, targets, 1e-2).result()
            assert repr(a) == repr(b)  # NaN where the inf target's minibatch is (its steps skipped)
            assert a[3] == (3 if w == 1 else 0)
            for p, q in zip(here.parameters(), there.parameters(), strict=True):
                assert torch.equal(p, q)
                assert all(torch.equal(opts[0].state[p][k], opts[1].state[q][k]) for k in ("exp_avg", "exp_avg_sq"))
    finally:
        worker.close()
    assert not worker._proc.is_alive()


def test_state_dict_refuses_other_config() -> None:
    cfg = SHACConfig(num_envs=2, horizon=2, actor_hidden=(8,), critic_hidden=(8,), critic_iterations=1)
    env_cfg = EnvConfig(motion_file=standing_motion(0.3))
    sd = SHAC(cfg, env_cfg).state_dict()
    with pytest.raises(ValueError, match=r"different config; differing fields: gamma \(state 0.99, agent 0.9\)"):
        SHAC(dataclasses.replace(cfg, gamma=0.9), env_cfg).load_state_dict(sd)
    with pytest.raises(ValueError, match="not a SHAC state"):
        SHAC(cfg, env_cfg).load_state_dict({"format": "bcg.ppo/1"})


def test_the_schedule_follows_an_outside_progress_when_given_one() -> None:
    """A time-budgeted run drives the linear schedule by the share of its budget spent: at half of it the learning
    rates are half-way to final_lr, whatever the iteration; None goes back to iteration / max_iterations."""
    cfg = SHACConfig(num_envs=2, horizon=2, actor_hidden=(8,), critic_hidden=(8,), critic_iterations=1,
                     actor_lr=1e-3, final_lr=1e-5, max_iterations=10)
    agent = SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3)))
    assert agent._lr(1e-3) == 1e-3
    agent.set_schedule_progress(0.5)
    assert agent._lr(1e-3) == pytest.approx(0.5 * (1e-3 + 1e-5), rel=1e-12)
    agent.set_schedule_progress(3.0)  # past the budget (the last iteration overruns it): the final rate
    assert agent._lr(1e-3) == pytest.approx(1e-5, rel=1e-12)
    agent.train_iteration()
    assert agent.actor_opt.param_groups[0]["lr"] == pytest.approx(1e-5, rel=1e-12)
    agent.set_schedule_progress(None)
    assert agent._lr(1e-3) == pytest.approx(1e-3 + (1e-5 - 1e-3) * 0.1, rel=1e-12)  # iteration 1 of 10
    with pytest.raises(ValueError, match="finite number or None"):
        agent.set_schedule_progress(float("nan"))


# ------------------------------------------------------------------------------------------------ learning


def _learn(iterations: int, num_envs: int, horizon: int, flip_sign: bool = False, **kw) -> list[float]:
    """Per-iteration rewards of SHAC (cpu-small networks, seed 0) on the standing pose, from a random policy (action
    std 1, PyTorch's initialisation, actor lr 5e-3, the bootstrap from the start: the paper's SHAC settings, not
    cpu-small's gentler ones) with the env's default action map (``flip_sign``: ascend the loss)."""
    base = dataclasses.replace(PRESETS["cpu-small"], init_action_std=1.0, actor_output_scale=1.0, actor_lr=5e-3,
                               actor_bootstrap_warmup=0, critic_hidden=(128, 128))  # the widths it was measured with
    cfg = dataclasses.replace(base, num_envs=num_envs, horizon=horizon, **kw)
    agent = SHAC(cfg, EnvConfig(motion_file=standing_motion(2.0)), seed=0)
    if flip_sign:  # a broken update: the actor climbs its loss
        rollout = agent._rollout

        def flipped(*args):
            w = rollout(*args)
            w.actor_loss = -w.actor_loss
            return w

        agent._rollout = flipped
    return [agent.train_iteration()["reward"] for _ in range(iterations)]


def test_shac_update_climbs_where_its_flipped_sign_falls() -> None:
    """8 envs x 16 steps, 25 iterations of SHAC with the paper's settings but action noise of std 0.3, from a random
    policy, against the same run with the actor's loss ascended. Since an episode's end cuts only its own row's
    gradient (before, any reset cut every row's, so the windows' gradients were a few steps long), a policy of std 1
    falls within a few steps in most environments and its 16-step gradients through the falls are too noisy for a
    short sign check. Over 10 iterations at std 0.3 the two runs had not parted yet on every machine (right - flipped
    over iterations 8-10: +0.051 on one machine, -0.022 / +0.015 / +0.018 / +0.042 for seeds 0-3 on another), so the
    check runs 25: iterations 21-25, seeds 0 / 1 / 2, right 0.164 / 0.157 / 0.165 against flipped 0.101 / 0.126 /
    0.052 (both start at 0.21-0.23)."""
    right = np.mean(_learn(25, 8, 16, init_action_std=0.3)[-5:])
    flipped = np.mean(_learn(25, 8, 16, flip_sign=True, init_action_std=0.3)[-5:])
    assert right > flipped + 0.025, (right, flipped)  # measured gaps 0.031-0.113


# ------------------------------------------------------------------------------------------------ export, config


def test_export_policy_reproduces_the_mean_action(tmp_path) -> None:
    from bcg.agents.base import METRIC_NAMES, Agent
    from bcg.agents.export import load_policy, save_policy

    cfg = SHACConfig(num_envs=2, horizon=2, actor_hidden=(16, 8), critic_hidden=(8,), critic_iterations=1)
    agent = SHAC(cfg, EnvConfig(motion_file=standing_motion(0.5)))
    metrics = agent.train_iteration()
    assert isinstance(agent, Agent) and set(METRIC_NAMES) <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    policy = load_policy(save_policy(tmp_path / "policy.pt", agent.export_policy()))
    obs = agent._obs
    with torch.no_grad():
        want = agent.actor(agent.obs_rms.normalize(obs))  # the deterministic policy (no noise)
        got = policy(obs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same float32 arithmetic
    assert policy.agent == "shac" and policy.obs_clip == agent.config.obs_clip


@pytest.mark.parametrize("field, value, match", [
    ("num_envs", 0, "num_envs must be an integer >= 1"),
    ("horizon", 2.5, "horizon must be an integer"),
    ("gamma", 1.5, r"gamma must be a finite number in \[0.0, 1.0\]"),
    ("lam", -0.1, "lam"),
    ("actor_lr", -1e-3, "actor_lr"),
    ("target_critic_alpha", 1.0, "target_critic_alpha"),
    ("actor_grad_norm", 0.0, "actor_grad_norm"),
    ("skip_grad_norm", float("nan"), "skip_grad_norm"),
    ("betas", (0.9, 1.0), "betas must be two numbers in"),
    ("actor_hidden", (64, 0), "actor_hidden must be a tuple of integers >= 1"),
    ("activation", "gelu", "activation must be one of"),
    ("lr_schedule", "cosine", "lr_schedule must be 'linear' or 'constant'"),
    ("obs_clip", -1.0, "obs_clip"),
    ("critic_minibatches", 10_000, "critic_minibatches"),
])
def test_bad_config_values_are_refused(field: str, value, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SHACConfig(**{field: value})


def test_bad_constructor_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="config must be a SHACConfig"):
        SHAC({"num_envs": 2}, EnvConfig())
    with pytest.raises(TypeError, match="env_config must be a bcg.envs.EnvConfig"):
        SHAC(SHACConfig(num_envs=2), {"motion_file": "jump"})
    with pytest.raises(ValueError, match="seed must be an integer"):
        SHAC(SHACConfig(num_envs=2), EnvConfig(), seed=-1)
    with pytest.raises(TypeError, match="estimator must be a bcg.estimators.Estimator"):
        SHAC(SHACConfig(num_envs=2), EnvConfig(), estimator="bcg")
    with pytest.raises(ValueError, match="autoreset"):
        SHAC(SHACConfig(num_envs=2), EnvConfig(autoreset=False))


def test_presets() -> None:
    assert set(PRESETS) >= {"paper", "cpu-small"}
    p = PRESETS["paper"]
    assert (p.num_envs, p.horizon, p.gamma, p.lam, p.actor_lr, p.critic_lr, p.betas, p.num_critics) == (
        64, 32, 0.99, 0.95, 5e-3, 2e-3, (0.7, 0.95), 3)
    assert (p.critic_iterations, p.critic_minibatches, p.actor_grad_norm, p.critic_grad_norm) == (16, 4, 1.0, 10.0)
    assert p.actor_hidden == (512, 256, 128) and p.critic_hidden == (256, 256) and p.init_action_std == 1.0


@pytest.mark.parametrize("warmup", [0, 5])
def test_actor_bootstrap_warmup_leaves_the_critics_out(warmup: int) -> None:
    """During the warm-up the actor loss does not depend on the (target) critics at all; afterwards it does."""
    cfg = SHACConfig(num_envs=2, horizon=3, actor_hidden=(8,), critic_hidden=(8,), critic_iterations=1,
                     actor_bootstrap_warmup=warmup)
    agent = SHAC(cfg, EnvConfig(motion_file=standing_motion(0.3)), seed=0)
    start = agent.state_dict()
    loss_a = agent._rollout(*agent._begin_window()).actor_loss.item()
    agent.load_state_dict(start)
    with torch.no_grad():
        for p in agent.target_critics.parameters():
            p.add_(1.0)
    loss_b = agent._rollout(*agent._begin_window()).actor_loss.item()
    assert (loss_a == loss_b) if warmup else (loss_a != loss_b), (loss_a, loss_b)
    with pytest.raises(ValueError, match="actor_bootstrap_warmup must be an integer >= 0"):
        SHACConfig(actor_bootstrap_warmup=-1)


def _jump_eval(iterations: int, **shac_overrides) -> tuple[float, float]:
    """E_track [cm] of the deterministic policy (the trainer's evaluation) after iteration 1 and after ``iterations``
    of bcg train's cpu-small defaults on the jump clip (residual action map, seed 0)."""
    from bcg.agents.train import build_agent, default_config
    from bcg.evaluation.periodic import policy_evaluator

    cfg = default_config("shac", "cpu-small", motion="jump")
    cfg = dataclasses.replace(cfg, shac=dataclasses.replace(cfg.shac, **shac_overrides))
    agent, evaluate = build_agent(cfg), policy_evaluator(cfg)
    agent.train_iteration()
    first = evaluate(agent)["eval_tracking_error_cm"]
    for _ in range(iterations - 1):
        agent.train_iteration()
    return first, evaluate(agent)["eval_tracking_error_cm"]


@pytest.mark.slow
def test_cpu_small_learns_to_track_the_jump() -> None:
    """The cpu-small preset's promise: visible tracking progress within minutes. Measured (seed 0, 60 iterations,
    about 90 s on an idle core, 10 minutes for the pair on the loaded machine): E_track 24.3 -> 16.3 cm; with
    actor_lr = 0 (the policy moves only through the observation normaliser) 24.418 -> 24.425 cm. The bound asks
    for half the measured drop."""
    first, last = _jump_eval(60)
    assert last < first - 4.0, (first, last)
    first0, last0 = _jump_eval(60, actor_lr=0.0, final_lr=0.0)
    assert abs(last0 - first0) < 0.3, (first0, last0)
