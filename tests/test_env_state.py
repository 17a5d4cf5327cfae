"""The environment's state / transition / config API: gather, scatter and branch a state, bit-exact restore, a pure
transition and its replaceable physics, EnvConfig, the action mapping and its inverse, the start-of-episode action,
a reward that never pays for falling, contact in info, and reference features against simulated ones."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_env_common import synthetic_qpos, write_synthetic_motion

from bcg.envs.config import Dynamics, EnvConfig
from bcg.envs.randomization import DomainRandomization
from bcg.envs.registration import register_envs
from bcg.envs.state import EnvState
from bcg.envs.vector_env import G1TrackingVectorEnv

ID = "BCG-G1-Run-v0"
DR = DomainRandomization(push_interval=(0.04, 0.08))  # everything on, pushes every 2-4 steps


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=1.0)


def make(motion_path: Path, n: int = 3, **kw) -> G1TrackingVectorEnv:
    return G1TrackingVectorEnv(n, str(motion_path), **kw)


# ---------------------------------------------------------------------------------------------------- state


def test_state_gather_scatter_repeat(motion_path: Path) -> None:
    env = make(motion_path, 3, domain_randomization=DR)
    env.reset(seed=0)
    s = env.state
    assert isinstance(s, EnvState) and s.num_envs == 3 and s.physics is not None
    sub = s[torch.tensor([2, 0])]
    assert sub.num_envs == 2 and torch.equal(sub.q, s.q[[2, 0]]) and torch.equal(sub.physics.mu, s.physics.mu[[2, 0]])
    assert torch.equal(sub.env_id, torch.tensor([2, 0]))
    b = s.repeat_interleave(4)
    assert b.num_envs == 12 and torch.equal(b.env_id, torch.tensor([0] * 4 + [1] * 4 + [2] * 4))
    assert torch.equal(b.q[4:8], s.q[1:2].expand(4, -1)) and torch.equal(b.physics.kp[8], s.physics.kp[2])
    swapped = s.scatter(torch.tensor([0, 2]), s[torch.tensor([2, 0])])
    assert torch.equal(swapped.q[0], s.q[2]) and torch.equal(swapped.q[2], s.q[0]) and torch.equal(swapped.q[1], s.q[1])
    assert s.equal(env.state) and not swapped.equal(s)  # scatter is out of place
    with pytest.raises(ValueError, match="repeats"):
        s.repeat_interleave(0)


def test_snapshot_steps_restore_is_bit_exact(motion_path: Path) -> None:
    """With everything randomised (noise, pushes, latency) and an autoreset inside the window."""
    env = make(motion_path, 3, domain_randomization=DR, max_episode_steps=4)
    env.reset(seed=5)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        env.step(torch.randn(3, 29, generator=g))
    snap = env.state
    actions = [torch.randn(3, 29, generator=g) for _ in range(3)]

    def run():
        out = []
        for a in actions:
            obs, rew, term, trunc, info = env.step(a)
            out += [obs, rew, term, trunc, info["final_obs"], info["critic_obs"]]
        return out, env.state

    first, end1 = run()
    env.load_state(snap)
    second, end2 = run()
    assert any(bool(t.any()) for t in first[3::6])  # max_episode_steps=4: an autoreset happened in the window
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert end1.equal(end2)
    assert not env.state.equal(snap)


def test_load_state_checks(motion_path: Path) -> None:
    env = make(motion_path, 2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="2 rows"):
        env.load_state(env.state.repeat_interleave(2))
    with pytest.raises(TypeError, match="EnvState"):
        env.load_state((env.q, env.qd))
    with pytest.raises(ValueError, match="'q' has shape"):
        env.load_state(dataclasses.replace(env.state, q=env.q[:, :30]))


def test_transition_is_pure_and_branches_agree(motion_path: Path) -> None:
    env = make(motion_path, 4, domain_randomization=DR)
    env.reset(seed=1)
    s = env.state
    a = torch.randn(4, 29, generator=torch.Generator().manual_seed(3)) * 0.3
    with torch.no_grad():
        nxt, rew, term, trunc, contact = env.transition(s, a)
        nb, rb, tb, _, cb = env.transition(s.repeat_interleave(10), a.repeat_interleave(10, 0))
    assert env.state is s and s.equal(env.state)  # nothing changed in the environment
    assert nxt.num_envs == 4 and rew.shape == (4,) and contact.impulse.shape == (4, 8)
    assert torch.equal(nxt.episode_steps, s.episode_steps + 1) and torch.equal(nxt.prev_actions, a)
    # ten identical branches of each environment: identical to each other and to the unbranched step
    torch.testing.assert_close(nb.q.reshape(4, 10, -1), nxt.q[:, None].expand(4, 10, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(rb.reshape(4, 10), rew[:, None].expand(4, 10), rtol=0, atol=1e-6)
    assert torch.equal(tb.reshape(4, 10), term[:, None].expand(4, 10))
    with pytest.raises(ValueError, match="one row per state row"):
        env.transition(s, a[:2])


def test_transition_function_seam(motion_path: Path) -> None:
    from bcg.envs.transition import simulator_step

    calls = []

    def recording(model, q, qd, targets, physics=None, *, env_ids, memory):
        calls.append((q.shape[0], env_ids.clone(), memory))
        return simulator_step(model, q, qd, targets, physics)

    env = make(motion_path, 2, transition_fn=recording)
    env.reset(seed=0)
    ref = make(motion_path, 2)
    ref.reset(seed=0)
    a = torch.full((2, 29), 0.05)
    obs, rew, *_ = env.step(a)
    obs_ref, rew_ref, *_ = ref.step(a)
    assert torch.equal(obs, obs_ref) and torch.equal(rew, rew_ref)  # the default seam is bcg.sim.step
    env.transition(env.state.repeat_interleave(3), a.repeat_interleave(3, 0))
    assert [c[0] for c in calls] == [2, 6]
    assert calls[1][1].tolist() == [0, 0, 0, 1, 1, 1] and calls[1][2] == {}  # the simulator alone keeps no memory

    def frozen(model, q, qd, targets, physics=None, *, env_ids, memory):
        q1, qd1, contact, _ = simulator_step(model, q, qd, targets, physics)
        return q.detach(), torch.zeros_like(qd1), contact, {}  # a "physics" that holds the robot still

    env.transition_fn = frozen
    q_before = env.q.clone()
    env.step(a)
    assert torch.equal(env.q, q_before)


def _counting(nan_row: int | None = None):
    """A transition function with a memory: the simulator's step plus a per-row step counter (and a float [N, 2]
    entry that carries the graph of the step's velocity); ``nan_row`` returns NaN for that row's velocity (the guard
    then puts it in its reference pose)."""
    from bcg.envs.transition import simulator_step

    def fn(model, q, qd, targets, physics=None, *, env_ids, memory):
        q1, qd1, contact, _ = simulator_step(model, q, qd, targets, physics)
        n = (memory or {}).get("count.n", torch.zeros(len(q), dtype=torch.long))
        if nan_row is not None:
            qd1 = torch.where((torch.arange(len(q)) == nan_row)[:, None], float("nan"), qd1)
        return q1, qd1, contact, {"count.n": n + 1, "count.v": qd1[:, :2] * 1.0}

    return fn


def test_transition_memory_travels_with_its_rows(motion_path: Path) -> None:
    """The memory a transition function returns is stored with the rows, gathered, repeated, detached, saved and
    restored with them, and zero wherever the env starts or replaces a row (reset, guard, replay, set_state)."""
    env = make(motion_path, 3, transition_fn=_counting(), differentiable=True, max_episode_steps=50)
    env.reset(seed=0)
    assert env.state.memory == {}
    a = torch.zeros(3, 29, requires_grad=True)
    for _ in range(3):
        env.step(a)
    s = env.state
    assert s.memory["count.n"].tolist() == [3, 3, 3] and s.memory["count.v"].requires_grad
    assert s[torch.tensor([2, 0])].memory["count.n"].tolist() == [3, 3]
    assert s.repeat_interleave(2).memory["count.v"].shape == (6, 2)
    env.detach()
    assert env.state.memory["count.n"].tolist() == [3, 3, 3] and not env.state.memory["count.v"].requires_grad
    env.reset(options={"reset_mask": [False, True, False]})
    assert env.state.memory["count.n"].tolist() == [3, 0, 3] and env.state.memory["count.v"][1].eq(0).all()
    env.step(a)
    assert env.state.memory["count.n"].tolist() == [4, 1, 4]
    saved = EnvState.from_saved(env.state.saved(), env.model, "cpu")
    assert saved.equal(env.state) and sorted(saved.memory) == ["count.n", "count.v"]
    env.step(a)
    env.load_state(saved)
    env.step(a)
    assert env.state.memory["count.n"].tolist() == [5, 2, 5]  # the restored rows' memory, not the later one
    # an old checkpoint's state has no memory: it loads with an empty one
    old = {k: v for k, v in env.state.saved().items() if k != "memory"}
    assert EnvState.from_saved(old, env.model, "cpu").memory == {}
    env.set_state(env.q.detach(), env.qd.detach())
    assert env.state.memory == {}
    # a key on one side of a scatter is zero on the other
    mixed = env.state.scatter(torch.tensor([1]), saved[torch.tensor([1])])
    assert mixed.memory["count.n"].tolist() == [0, 1, 0]
    assert s.clear_memory(torch.tensor([True, False, False])).memory["count.n"].tolist() == [0, 3, 3]

    # the guard's safe pose and a demonstration replay replace a row: its memory is cleared
    env = make(motion_path, 2, transition_fn=_counting(nan_row=0), max_episode_steps=50)
    env.reset(seed=0)
    env.step(torch.zeros(2, 29))
    assert env.state.memory["count.n"].tolist() == [0, 1]
    env = make(motion_path, 2, transition_fn=_counting(), replay_threshold=1e-9, max_episode_steps=50)
    env.reset(seed=0)
    env.step(torch.zeros(2, 29))
    assert env.state.memory["count.n"].tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------------- config


def test_config_and_keywords_are_equivalent(motion_path: Path) -> None:
    register_envs()
    cfg = EnvConfig(motion_file=str(motion_path), dynamics=Dynamics(kappa=150.0), max_episode_steps=7, ref_steps=2)
    a = gym.make_vec(ID, num_envs=2, config=cfg)
    b = gym.make_vec(ID, num_envs=2, motion_file=str(motion_path), kappa=150.0, max_episode_steps=7, ref_steps=2)
    assert a.config == b.config and a.model.params.kappa == 150.0 and a.obs_dim == 849 - 204
    c = gym.make_vec(ID, num_envs=2, config=cfg, kappa=90.0)  # a keyword beside the config overrides it
    assert c.config.dynamics.kappa == 90.0 and c.config.max_episode_steps == 7
    assert gym.make_vec("BCG-G1-Jump-v0", num_envs=1).motion.name == "jump"  # the id's own clip by default
    single = gym.make(ID, config=cfg)
    assert single.unwrapped.vec.config.dynamics.kappa == 150.0
    with pytest.raises(TypeError, match="unknown environment option"):
        gym.make_vec(ID, num_envs=1, kapa=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dynamics.kappa = 1.0  # type: ignore[misc]


def test_every_config_field_has_a_docstring() -> None:
    from bcg.envs import config
    from bcg.envs.rewards import TrackingReward

    for cls in (config.EnvConfig, config.Dynamics, config.ObservationNoise, DomainRandomization, TrackingReward):
        body = ast.parse(inspect.getsource(cls)).body[0].body
        documented = {a.target.id for a, d in zip(body, body[1:], strict=False)
                      if isinstance(a, ast.AnnAssign) and isinstance(d, ast.Expr) and isinstance(d.value, ast.Constant)}
        fields = {f.name for f in dataclasses.fields(cls)}
        assert fields <= documented, f"{cls.__name__}: fields without a docstring: {sorted(fields - documented)}"
    assert len(dataclasses.fields(config.EnvConfig)) >= 15


def test_tyro_exposes_the_config() -> None:
    import tyro

    cfg = tyro.cli(EnvConfig, args=["--kappa", "100", "--max-episode-steps", "50", "--motion-file", "jump",
                                    "--no-autoreset"])
    assert cfg == EnvConfig(dynamics=Dynamics(kappa=100.0), max_episode_steps=50, motion_file="jump", autoreset=False)


def test_clear_errors_for_counts_steps_and_seeds(motion_path: Path) -> None:
    env = make(motion_path, np.int64(2))  # numpy integers are counts too
    assert env.num_envs == 2 and type(env.num_envs) is int
    with pytest.raises(TypeError, match=r"num_envs must be an integer >= 1, got 2\.5 of type float"):
        make(motion_path, 2.5)
    with pytest.raises(ValueError, match="num_envs must be an integer >= 1, got 0"):
        make(motion_path, 0)
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"max_episode_steps must be an integer >= 1, got {bad}"):
            make(motion_path, 1, max_episode_steps=bad)
    with pytest.raises(TypeError, match="max_episode_steps must be an integer"):
        make(motion_path, 1, max_episode_steps=2.0)
    assert make(motion_path, 1, max_episode_steps=np.int32(5)).max_episode_steps == 5
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 9223372036854775807\]"):
            env.reset(seed=bad)
    with pytest.raises(TypeError, match="seed must be None or an integer"):
        env.reset(seed="7")
    env.reset(seed=np.int64(2**63 - 1))


# ---------------------------------------------------------------------------------------------------- actions


@pytest.mark.parametrize("clip", ["run", "jump", "fight", "dance"])
def test_every_reference_target_is_reachable(clip: str) -> None:
    env = G1TrackingVectorEnv(1, clip, domain_randomization=DomainRandomization.off())
    targets = env.motion.qpos[:, 7:]
    worst = 0.0
    for offset in (0.0, 0.01, -0.01):  # the default-pose offset of domain randomisation shifts the map
        off = torch.full_like(targets, offset)
        a = env.target_to_action(targets, off)
        worst = max(worst, float(a.abs().max()))
        torch.testing.assert_close(env.action_to_target(a, off), targets, rtol=0, atol=2e-5)
    assert worst < 1.0, f"{clip}: a reference target needs |a| = {worst:.3f}"


def test_real_clip_targets_are_reachable() -> None:
    """The G1 Moves clips of the development workspace (../shared/motions/g1_moves), where present."""
    folder = Path(__file__).resolve().parents[2] / "shared" / "motions" / "g1_moves"
    files = sorted(folder.glob("*.csv"))
    if not files:
        pytest.skip(f"no G1 Moves clips at {folder}")
    for f in files:
        env = G1TrackingVectorEnv(1, str(f))
        a = env.target_to_action(env.motion.qpos[:, 7:], torch.full((env.num_frames, 29), 0.01))
        assert float(a.abs().max()) < 1.0, f.name


def test_joint_limits_reachable_inside_the_action_box() -> None:
    from bcg.motion.formats import joint_ranges

    env = G1TrackingVectorEnv(1, "run")
    rng = torch.as_tensor(joint_ranges(), dtype=torch.float32)
    for side in (0, 1):
        a = env.target_to_action(rng[None, :, side], torch.zeros(1, 29))
        assert a.abs().max() < 0.95
    assert torch.equal(env.action_to_target(torch.zeros(1, 29), torch.zeros(1, 29))[0], env.default_joint_pos)


def test_episode_starts_with_the_action_of_the_reference_pose(motion_path: Path) -> None:
    from bcg.envs.rewards import StepContext, TrackingReward

    env = make(motion_path, 3, domain_randomization=DomainRandomization(push_interval=None))
    env.reset(seed=4)
    s = env.state
    ref_pose = env.motion.qpos[s.frame, 7:]
    torch.testing.assert_close(env.action_to_target(s.prev_actions), ref_pose, rtol=0, atol=2e-5)
    # holding that action costs nothing in the smoothness term on the first step
    rew_env = env.step(s.prev_actions)[1]
    f = TrackingReward()
    ref = env.ref_features(env.frame)
    sim = env.features()
    torch.testing.assert_close(rew_env, f(sim, ref, StepContext(s.prev_actions, s.prev_actions, None)))
    zero = f(sim, ref, StepContext(torch.zeros(3, 29), s.prev_actions, None))
    assert (rew_env > zero).all()


# ---------------------------------------------------------------------------------------------------- reward


def test_random_policy_return_grows_with_episode_length(motion_path: Path) -> None:
    """A learner must never gain by ending the episode: every reward of an exploring policy is >= 0, so the return
    of the same random policy over longer episodes is larger."""
    returns = []
    for length in (3, 6, 12):
        env = make(motion_path, 8, max_episode_steps=length)
        env.reset(seed=0)
        g = torch.Generator().manual_seed(1)
        ret = torch.zeros(8)
        for _ in range(length):
            _, rew, term, trunc, _ = env.step(torch.randn(8, 29, generator=g) * 1.5)
            assert (rew >= 0).all() and (rew <= 1).all()
            ret += rew
        returns.append(float(ret.mean()))
    assert returns[0] < returns[1] < returns[2], returns


def test_tracking_reward_is_one_at_the_reference(motion_path: Path) -> None:
    from bcg.envs.rewards import StepContext, TrackingReward

    env = make(motion_path, 2)
    ref = env.ref_features(torch.tensor([3, 9]))
    z = torch.zeros(2, 29)
    torch.testing.assert_close(TrackingReward()(ref, ref, StepContext(z, z, None)), torch.ones(2))
    other = env.ref_features(torch.tensor([30, 40]))
    r = TrackingReward()(other, ref, StepContext(z, z + 2.0, None))
    assert (r > 0).all() and (r < 0.9).all()
    with pytest.raises(ValueError, match="non-negative"):
        TrackingReward(w_smooth=-0.8)


# ---------------------------------------------------------------------------------------------------- contact, features


def test_contact_peak_force_and_penetration_in_info(motion_path: Path) -> None:
    env = make(motion_path, 2)
    env.reset(seed=0)
    _, _, _, _, info = env.step(torch.zeros(2, 29))
    imp, peak, pen = info["contact_impulse"], info["contact_peak_force"], info["contact_penetration"]
    assert imp.shape == peak.shape == pen.shape == (2, 8)
    assert (imp.sum(1) > 0).all() and (peak >= 0).all()
    # the impulse over the control step is at most the peak force times the control period
    assert (imp <= peak * env.control_dt + 1e-6).all()
    assert ((pen > 0) == (peak > 0)).float().mean() > 0.5  # force where the spheres penetrate


def test_reference_and_simulated_features_come_from_one_function(motion_path: Path) -> None:
    """At a reset (no randomisation) the robot stands in the reference state: its features, through the env's
    feature function, equal the motion's reference features; the 233-D ADD vectors agree too."""
    env = make(motion_path, 4)
    env.reset(seed=2)
    s = env.state
    ref = env.ref_features(s.frame)
    lifted = (s.q[:, 2] - env.motion.qpos[s.frame, 2]).abs().max()
    assert lifted < 1e-6  # the synthetic clip starts on the ground: no lift
    for a, b in zip(env.features(), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    phi_ref = env.motion.disc_features_at(s.frame.double() * env.motion.dt)
    torch.testing.assert_close(env.disc_features(), phi_ref, rtol=0, atol=2e-5)
    # one step later the simulated robot has moved away from its reference by a measurable amount
    env.step(s.prev_actions)
    gap = (env.disc_features() - env.motion.disc_features_at(env.frame.double() * env.motion.dt)).abs().max()
    assert 0 < float(gap) < 5.0


def test_motion_file_errors_and_rates_reach_the_env(motion_path: Path, tmp_path: Path) -> None:
    from bcg.motion import Motion, MotionFormatError

    with pytest.raises(FileNotFoundError, match=r"neither a packaged clip \(run, jump, fight, dance\)"):
        G1TrackingVectorEnv(1, "walk")
    q = synthetic_qpos(1.0, dt=1 / 60)  # 1 s recorded at 60 FPS
    clip = Motion.from_qpos(q, 1 / 60)
    plain = clip.save(tmp_path / "clip.npz")  # NPZ: the rate is in the file
    assert G1TrackingVectorEnv(1, str(plain)).motion.num_frames == 51
    csv = tmp_path / "recorded.csv"
    np.savetxt(csv, np.concatenate([q[:, :3], q[:, [4, 5, 6, 3]], q[:, 7:]], 1), delimiter=",")  # no rate in it
    with pytest.raises(MotionFormatError, match="cannot tell the frame rate"):
        G1TrackingVectorEnv(1, str(csv))
    assert G1TrackingVectorEnv(1, str(csv), motion_fps=60).motion.num_frames == 51  # 1 s at 50 Hz
    assert G1TrackingVectorEnv(1, str(csv), motion_format="g1moves").motion.num_frames == 51
    g1moves_name = tmp_path / "B_Recorded.csv"
    g1moves_name.write_text(csv.read_text())
    assert G1TrackingVectorEnv(1, str(g1moves_name)).motion.num_frames == 51  # G1 Moves name: 60 FPS, not 30


def test_transition_never_passes_an_unstable_row_to_the_simulator(motion_path: Path) -> None:
    import bcg.sim

    env = make(motion_path, 2)
    env.reset(seed=0)
    s = env.state
    qd = s.qd.clone()
    qd[1, 7] = 10 * bcg.sim.MAX_SPEED
    with torch.no_grad():
        nxt, rew, term, trunc, _ = env.transition(dataclasses.replace(s, qd=qd), torch.zeros(2, 29))
    assert term.tolist() == [False, True] and rew[1] == 0 and rew[0] > 0
    assert torch.isfinite(nxt.q).all() and float(nxt.qd[1].abs().max()) == 0.0
