"""The Warp paths of the environment step (bcg.envs.warp_*) against the torch code they replace, and their
hand-written adjoints against finite differences.

Values agree to float32 rounding, not bit for bit (the 3 x 3 products and sums run in another order); the bounds
below sit a few times above the differences measured on these inputs (noted beside each). A rollout with the
Warp paths keeps the simulated states bit for bit (the features feed nothing back into the physics) and the same
terminations and resets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from bcg.envs.rewards import StepContext
from bcg.envs.vector_env import G1TrackingVectorEnv
from bcg.motion.features import FeatureFn, Features


@pytest.fixture(scope="module")
def env() -> G1TrackingVectorEnv:
    e = G1TrackingVectorEnv(13, "jump")  # 13 rows: the pooled arrays have 16, the last three unused
    e.reset(seed=0)
    return e


def _state(env: G1TrackingVectorEnv, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of the env moved off the reference: (q, qd, actions, previous actions)."""
    g = torch.Generator().manual_seed(seed)
    n = env.num_envs
    q = env.q.clone()
    q[:, :2] += 3 * torch.randn(n, 2, generator=g)
    q[:, 3:7] += 0.3 * torch.randn(n, 4, generator=g)  # not unit: the kinematics normalise it
    q[:, 7:] += 0.3 * torch.randn(n, 29, generator=g)
    qd = env.qd + torch.randn(n, env.model.nv, generator=g)
    return q, qd, 0.3 * torch.randn(n, 29, generator=g), 0.3 * torch.randn(n, 29, generator=g)


def _fd(fn, x: torch.Tensor, d: torch.Tensor, eps: float) -> float:
    """Central difference of the scalar fn along d, evaluated in float32 (the Warp path's precision)."""
    with torch.no_grad():
        return float((fn(x + eps * d) - fn(x - eps * d)) / (2 * eps))


def _outputs(env: G1TrackingVectorEnv, q: torch.Tensor, qd: torch.Tensor, a: torch.Tensor, pa: torch.Tensor,
             warp: bool) -> tuple[Features, torch.Tensor, torch.Tensor]:
    env._use_warp(warp)
    try:
        f = env.feature_fn(q, qd)
        frame = (torch.arange(env.num_envs) * 61) % env.num_frames  # the last frames clamp the reference part
        obs = env.observer(f, frame)
        fc = (frame + 1).clamp(max=env.num_frames - 1)
        ctx = StepContext(a, pa, None)
        rew = (env.rules.warp_reward(env.reward_fn, f, fc, ctx) if warp
               else env.reward_fn(f, env.ref_features(fc), ctx))
    finally:
        env._use_warp(True)
    return f, obs, rew


@pytest.mark.parametrize("seed", [0, 1])
def test_values_equal_the_torch_path_to_rounding(env: G1TrackingVectorEnv, seed: int) -> None:
    q, qd, a, pa = _state(env, seed)
    fw, ow, rw = _outputs(env, q, qd, a, pa, True)
    ft, ot, rt = _outputs(env, q, qd, a, pa, False)
    for name, x, y in zip(Features._fields, fw, ft, strict=True):
        assert x.shape == y.shape, name
        torch.testing.assert_close(x, y, rtol=0, atol=2e-6, msg=name)  # measured <= 4.8e-7 (positions, rotations)
    torch.testing.assert_close(ow, ot, rtol=0, atol=5e-6)  # measured 1.4e-6 (entries up to ~10)
    torch.testing.assert_close(rw, rt, rtol=0, atol=1e-6)  # measured 1.5e-8
    assert torch.equal(fw.joint_pos, ft.joint_pos) and torch.equal(fw.root_pos_w, ft.root_pos_w)


def test_gradients_equal_torch_autograd(env: G1TrackingVectorEnv) -> None:
    """One backward through features, observation and reward: the adjoints of the three Warp launches against
    torch autograd of the torch path."""
    q, qd, a, pa = _state(env, 2)
    w = torch.randn(env.obs_dim, generator=torch.Generator().manual_seed(3))
    grads = []
    for warp in (True, False):
        xs = [x.clone().requires_grad_(True) for x in (q, qd, a, pa)]
        f, obs, rew = _outputs(env, *xs, warp)
        ((obs * w).sum() + 5 * rew.sum() + f.body_pos_w.sum() + f.body_rot_w.sum()).backward()
        grads.append([x.grad for x in xs])
    for gw, gt in zip(*grads, strict=True):
        scale = float(gt.abs().max())
        torch.testing.assert_close(gw, gt, rtol=0, atol=2e-6 * scale)  # measured 4e-7 x the largest entry


@pytest.mark.parametrize("part", ["features", "observation", "reward"])
def test_adjoint_matches_finite_differences(env: G1TrackingVectorEnv, part: str) -> None:
    """Directional derivatives of each Warp launch: adjoint against central differences in float32."""
    q, qd, a, pa = _state(env, 4)
    g = torch.Generator().manual_seed(5)
    x0 = torch.cat([q, qd, a, pa], 1)
    nq, nv = q.shape[1], qd.shape[1]
    frame = (torch.arange(env.num_envs) * 37) % env.num_frames
    wo = torch.randn(env.obs_dim, generator=g, dtype=torch.float64)
    wf = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in env.feature_fn(q, qd)]

    def scalar(x: torch.Tensor) -> torch.Tensor:
        qq, vv, aa, pp = x.split([nq, nv, 29, 29], 1)
        f = env.feature_fn(qq, vv)
        # the weighted sums in float64, so that only the launches' own float32 rounding enters the differences
        if part == "features":
            return sum((t.double() * ww).sum() for t, ww in zip(f, wf, strict=True))
        if part == "observation":
            return (env.observer(f, frame).double() * wo).sum()
        return env.rules.warp_reward(env.reward_fn, f, frame, StepContext(aa, pp, None)).double().sum()

    x = x0.clone().requires_grad_(True)
    scalar(x).backward()
    for k in range(3):
        d = 0.05 * torch.randn(x0.shape, generator=g)  # steps of eps * 0.05 per entry: truncation negligible
        if part != "reward":
            d[:, nq + nv:] = 0  # the actions enter only the reward
        ad = float((x.grad.double() * d).sum())
        fd = _fd(scalar, x0, d, 1e-2)
        # measured relative differences 0.5e-5 to 1.5e-4 (the float32 rounding of the differences)
        assert math.isfinite(ad) and abs(ad - fd) <= 1e-3 * abs(fd) + 1e-7, (k, ad, fd)


def test_metrics_and_instability_equal_the_torch_path(env: G1TrackingVectorEnv) -> None:
    q, qd, _, _ = _state(env, 6)
    f = FeatureFn(env.model)(q, qd)
    frame = (torch.arange(env.num_envs) * 53) % env.num_frames
    ref = env.ref_features(frame)
    key_dist, track = env.rules.warp_reward.metrics(f, frame)
    torch.testing.assert_close(key_dist, (f.key_pos_w - ref.key_pos_w).norm(dim=-1).amax(1), rtol=1e-6, atol=0)
    torch.testing.assert_close(track, (f.body_pos_w - ref.body_pos_w).norm(dim=-1).mean(1), rtol=1e-6, atol=0)
    q[0, 10], qd[1, 3], q[2, 0] = float("nan"), 1e6, 5e5
    s = dataclasses.replace(env.state, q=q, qd=qd)
    import bcg.sim
    from bcg.sim.bridge import MAX_ROOT_POSITION

    want = env.guard.torch_rows(s.q, s.qd, float(bcg.sim.MAX_SPEED), float(MAX_ROOT_POSITION))
    assert torch.equal(env._unstable(s), want) and want[:3].all()


def _rollout(motion: str, randomization: bool, warp: bool, differentiable: bool, steps: int = 40) -> dict:
    env = G1TrackingVectorEnv(6, motion, domain_randomization=randomization, differentiable=differentiable,
                              max_episode_steps=15)
    env._use_warp(warp)
    obs, _ = env.reset(seed=7)
    g = torch.Generator().manual_seed(1)
    out: dict = {k: [] for k in ("obs", "reward", "terminated", "truncated", "final_obs", "q", "qd", "grad")}
    out["obs"].append(obs)
    for t in range(steps):
        a = (0.4 * torch.randn(6, 29, generator=g)).requires_grad_(differentiable)
        obs, rew, term, trunc, info = env.step(a)
        if differentiable and t % 4 == 3:  # a window of 4 steps, then the graph is cut
            (rew.sum() + 0.01 * obs.sum()).backward()
            out["grad"].append(a.grad)
            env.detach()
        for k, v in (("obs", obs), ("reward", rew), ("terminated", term), ("truncated", trunc),
                     ("final_obs", info["final_obs"]), ("q", env.q), ("qd", env.qd)):
            out[k].append(v.detach())
    return out


@pytest.mark.parametrize("motion,randomization,differentiable", [
    ("run", False, False), ("jump", True, False), ("run", True, True), ("jump", False, True)])
def test_rollouts_equal_the_torch_path(motion: str, randomization: bool, differentiable: bool) -> None:
    """40 steps, autoresets included: the same states bit for bit, the same terminations, observations and rewards
    to float32 rounding, action gradients to rounding."""
    a = _rollout(motion, randomization, True, differentiable)
    b = _rollout(motion, randomization, False, differentiable)
    assert sum(int(t.sum()) for t in a["terminated"] + a["truncated"]) >= 6  # several episodes end
    for k in ("q", "qd", "terminated", "truncated"):
        assert all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True)), k
    # measured: observations 3.8e-6 to 6.7e-6 (velocities of tens of rad/s rotated into the heading frame), rewards
    # 0.6e-7 to 2.7e-7
    for k, tol in (("obs", 2e-5), ("final_obs", 2e-5), ("reward", 1e-6)):
        err = max(float((x - y).abs().max()) for x, y in zip(a[k], b[k], strict=True))
        assert err <= tol, (k, err)
    for x, y in zip(a["grad"], b["grad"], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5 * float(y.abs().max()))  # measured 1.7e-6 x the largest


def test_counter_based_draws_are_the_same_bits() -> None:
    """The Warp hash (uint32 arithmetic) gives the int64-masked torch draws bit for bit, keys beyond 32 bits too."""
    from bcg.envs.transition import _hash32, hash_uniform
    from bcg.envs.warp_hash import WarpHash

    h, g = WarpHash(), torch.Generator().manual_seed(0)
    for n in (1, 5, 64, 100):
        key = torch.randint(0, 2**31 - 1, (n,), generator=g)
        counter = torch.randint(0, 10**6, (n,), generator=g)
        for stream in (0, 1, 2, 70000):
            assert torch.equal(h.uniform(key, counter, 849, stream), hash_uniform(key, counter, 849, stream))
            assert torch.equal(h.uniform(key, counter, 7, stream), hash_uniform(key, counter, 7, stream))
        big = key * 4096 + 2**40
        assert torch.equal(h.hash32(key), _hash32(key)) and torch.equal(h.hash32(big), _hash32(big))
        assert torch.equal(h.hash32(key, 0x5BD1E995), _hash32(key + 0x5BD1E995))


def test_only_the_plain_reward_on_float32_takes_the_warp_path(env: G1TrackingVectorEnv) -> None:
    """A TrackingReward subclass (it may change the formula) or float64 actions go to the torch code."""
    from bcg.envs.rewards import TrackingReward
    from bcg.envs.warp_reward import WarpTrackingReward

    class Custom(TrackingReward):
        pass

    f = env.feature_fn(env.q, env.qd)
    a = torch.zeros(env.num_envs, 29)
    assert WarpTrackingReward.accepts(TrackingReward(), f, StepContext(a, a, None))
    assert not WarpTrackingReward.accepts(Custom(), f, StepContext(a, a, None))
    assert not WarpTrackingReward.accepts(TrackingReward(), f, StepContext(a.double(), a, None))
    assert not WarpTrackingReward.accepts(TrackingReward(), f.cast(torch.float64), StepContext(a, a, None))


def test_table_reset_launch_equals_the_torch_reset() -> None:
    """The one-launch autoreset (bcg.envs.warp_reset) gives the torch reset's next state and observation bit for
    bit: new keys, start frames, table rows, and the rows that go on copied unchanged."""
    env = G1TrackingVectorEnv(11, "jump")
    env.reset(seed=3)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        env.step(0.3 * torch.randn(11, 29, generator=g))
    s = env.state
    obs = env.observe()
    done = torch.rand(11, generator=g) < 0.5
    done[0], done[1] = True, False
    assert env.starts.table_reset_applies(s, obs, noise_on=False)
    got, got_obs = env.starts.table_reset()(s, done, obs)
    idx = done.nonzero().flatten()
    want = env.starts.reset_rows(s, idx, env.draws.next_keys(s.rng_key[idx]))
    want_obs = obs.index_put((idx,), env.starts.table()[2][want.frame[idx]])
    assert got.equal(want) and torch.equal(got_obs, want_obs)
    assert torch.equal(got.frame[~done], s.frame[~done]) and not torch.equal(got.rng_key[done], s.rng_key[done])
    assert s.equal(env.state)  # the state it read is untouched


def test_reset_frames_are_uniform_over_the_clip() -> None:
    """Start frames of new episodes: integers in [0, F - 2], every one drawn, none far more often than the others
    (20 000 keys: about 100 draws per frame of the jump clip)."""
    env = G1TrackingVectorEnv(2, "jump")
    f = env.num_frames
    keys = torch.arange(20_000, dtype=torch.long) * 7919
    frames = env.starts.frames(torch.arange(20_000) % 5, keys)
    counts = torch.bincount(frames, minlength=f)
    assert int(frames.min()) == 0 and int(frames.max()) == f - 2 and int(counts[f - 1]) == 0
    mean = 20_000 / (f - 1)
    # a binomial count's standard deviation here is about sqrt(mean): 5 of them bound every frame's count
    assert float((counts[: f - 1] - mean).abs().max()) < 5 * math.sqrt(mean), counts


def test_one_launch_step_outputs_equal_the_separate_launches(env: G1TrackingVectorEnv) -> None:
    """bcg.envs.warp_step gives the separate launches' reward, observation and metrics bit for bit (the same row
    functions), and the termination flags and counts of the torch expressions, on rows that fall, overrun the clip,
    reach the step limit or are unstable."""
    q, qd, a, pa = _state(env, 5)
    n, f = env.num_envs, env.num_frames
    frame0 = torch.randint(0, f - 1, (n,), generator=torch.Generator().manual_seed(3))
    frame0[0], frame0[1] = f - 2, f + 3  # the clip ends with this step; already beyond it
    steps0 = torch.arange(n) * 3
    steps0[2] = 39  # reaches max_steps = 40
    for row in (0, 2):  # on the reference at the step's frame: neither fallen nor far
        q[row] = env._ref_qpos[min(int(frame0[row]) + 1, f - 1)]
    q[3, 2] = 0.05  # fallen
    qd[4, 9] = 1e4  # unstable
    with torch.no_grad():
        out = env.rules.warp_step(q, qd, a, pa, frame0, steps0, env.reward_fn, env.guard.launch_bounds(),
                                env.termination_height, env.termination_distance, 40)
        feats = env._features(q, qd)
        fc = (frame0 + 1).clamp(0, f - 1)
        reward = env.rules.warp_reward(env.reward_fn, feats, fc, StepContext(a, pa, None))
        key_dist, track = env.rules.warp_reward.metrics(feats, fc)
        obs = env.observer(feats, frame0 + 1)
        bad = env.guard(q, qd)
    assert torch.equal(out.reward, reward) and torch.equal(out.obs, obs) and torch.equal(out.track, track)
    fell = q[:, 2] < env.termination_height
    terminated = fell | (key_dist > env.termination_distance) | bad
    truncated = ((frame0 + 1 >= f - 1) | (steps0 + 1 >= 40)) & ~terminated
    for got, want in ((out.bad, bad), (out.fell, fell), (out.terminated, terminated), (out.truncated, truncated),
                      (out.done, terminated | truncated), (out.frame, frame0 + 1), (out.steps, steps0 + 1)):
        assert torch.equal(got, want)
    assert out.num_bad == int(bad.sum()) == 1 and out.num_done == int((terminated | truncated).sum())
    assert bool(out.fell[3]) and bool(out.truncated[0]) and bool(out.truncated[2]) and bool(out.terminated[4])


def test_a_step_with_an_unstable_row_takes_the_general_path() -> None:
    """When the physics return an unstable row, the Warp env replaces it by its reference pose before the features,
    as the torch env does: the same states, flags and rewards (to rounding) as the torch paths."""
    from bcg.envs.transition import simulator_step

    def blow_up(*args, **kw):
        q1, qd1, contact, mem = simulator_step(*args, **kw)
        qd1 = qd1.clone()
        qd1[1, 10] = float("nan")
        return q1, qd1, contact, mem

    outs = []
    for warp in (True, False):
        e = G1TrackingVectorEnv(5, "run", transition_fn=blow_up)
        e._use_warp(warp)
        e.reset(seed=2)
        obs, rew, term, trunc, info = e.step(torch.zeros(5, 29))
        assert bool(info["nonfinite"][1]) and bool(term[1]) and float(rew[1]) == 0.0
        outs.append((obs, rew, term, trunc, e.q, e.qd))
    (o1, r1, t1, u1, q1, d1), (o2, r2, t2, u2, q2, d2) = outs
    assert torch.equal(t1, t2) and torch.equal(u1, u2) and torch.equal(q1, q2) and torch.equal(d1, d2)
    assert float((o1 - o2).abs().max()) < 2e-5 and float((r1 - r2).abs().max()) < 1e-6


@pytest.mark.parametrize("randomization", [False, True])
def test_one_launch_rollouts_equal_the_separate_launches(randomization: bool) -> None:
    """200 steps of saturated random actions (108 and 94 episode ends): the one-launch outputs give the separate
    launches' observations, rewards, flags, states and metrics bit for bit (measured the same over 1500 steps x 16)."""

    def rollout(one_launch: bool) -> list:
        env = G1TrackingVectorEnv(8, "jump", domain_randomization=randomization, max_episode_steps=60)
        if not one_launch:
            env.rules.warp_step = None  # every step takes the separate launches
        env.reset(seed=1)
        g = torch.Generator().manual_seed(1)
        out = []
        for t in range(200):
            a = torch.sign(torch.randn(8, 29, generator=g)) if t % 2 else torch.rand(8, 29, generator=g) * 2 - 1
            obs, rew, term, trunc, info = env.step(3 * a)
            out += [obs, rew, term, trunc, env.q, env.qd, info["tracking_error"], info["final_obs"], info["fell"]]
        return out

    a, b = rollout(True), rollout(False)
    assert sum(int(x.sum()) for x in a[2::9] + a[3::9]) >= 80  # many episodes end (108 and 94 measured)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
