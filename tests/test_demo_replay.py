"""Demonstration replay (bcg.envs.demo_replay): it fires exactly for the rows beyond the threshold, puts them on the
reference state of their frame, leaves the other rows bit for bit as they were, and cuts the gradient of a replayed
row's later rewards to its earlier actions."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.envs.demo_replay import DemonstrationReplay
from bcg.envs.vector_env import G1TrackingVectorEnv

THRESHOLD = 0.2


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory):
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=1.0)


def start_state(env: G1TrackingVectorEnv, fall: bool = True):
    """Four rows on the reference at frames 5, 10, 15, 20; rows 2 and 3 shifted 0.5 m sideways (their tracking
    error is about 0.5 m), with ``fall`` row 3 also lowered below the fall height (it terminates)."""
    env.reset(seed=0)
    s = env.state
    q = s.q.clone()
    frame = torch.tensor([5, 10, 15, 20])
    q[:] = env.starts.table()[0][frame]
    q[2:, 1] += 0.5
    if fall:
        q[3, 2] = 0.1
    return dataclasses.replace(s, q=q, qd=env.starts.table()[1][frame], frame=frame)


def make(motion_path, threshold: float | None, differentiable: bool = False) -> G1TrackingVectorEnv:
    return G1TrackingVectorEnv(4, str(motion_path), replay_threshold=threshold, differentiable=differentiable,
                               action_offset="reference")


def test_replay_fires_above_the_threshold_and_leaves_the_other_rows_alone(motion_path) -> None:
    env, plain = make(motion_path, THRESHOLD), make(motion_path, None)
    start = start_state(env)
    for e in (env, plain):
        e.load_state(start)
    a = 0.1 * torch.randn(4, 29, generator=torch.Generator().manual_seed(0))
    obs, rew, term, trunc, info = env.step(a)
    obs_p, rew_p, term_p, trunc_p, info_p = plain.step(a)
    err = info["tracking_error"]
    assert err[:2].max() < 0.05 and err[2:].min() > 0.45  # the constructed errors
    assert term.tolist() == [False, False, False, True]  # row 3 fell: it is reset, not replayed
    assert info["replayed"].tolist() == [False, False, True, False]
    assert "replayed" not in info_p
    # the replayed row is the reference state of its frame, episode going on; its observation is that state's
    q_t, qd_t, obs_t = env.starts.table()
    assert torch.equal(env.q[2], q_t[16]) and torch.equal(env.qd[2], qd_t[16]) and torch.equal(obs[2], obs_t[16])
    assert env.frame[2] == 16 and env.episode_steps[2] == 1 and torch.equal(env.prev_actions[2], a[2])
    # everything else is what the env without replay gives, bit for bit (the drifted step's reward included)
    assert torch.equal(rew, rew_p) and torch.equal(term, term_p) and torch.equal(trunc, trunc_p)
    keep = torch.tensor([0, 1, 3])
    assert env.state[keep].equal(plain.state[keep]) and torch.equal(obs[keep], obs_p[keep])
    assert torch.equal(info["final_obs"][keep], info_p["final_obs"][keep])
    assert torch.equal(info["final_obs"][2], obs[2])  # not done: the final observation is the new one


def test_threshold_is_strict() -> None:
    replay = DemonstrationReplay(0.2)
    assert replay.threshold_m == 0.2
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="threshold_m"):
            DemonstrationReplay(bad)


def later_reward_grads(env: G1TrackingVectorEnv, start) -> tuple[torch.Tensor, torch.Tensor]:
    """(d(sum of the rewards of steps 2 and 3) / d(actions of step 1) [4, 29], replayed flags of step 1). No row
    ends an episode in these steps (a reset row's gradient would be cut as well)."""
    env.load_state(start)
    g = torch.Generator().manual_seed(1)
    a0 = (0.1 * torch.randn(4, 29, generator=g)).requires_grad_(True)
    _, _, _, _, info = env.step(a0)
    total = torch.zeros(())
    for _ in range(2):
        _, rew, term, trunc, _ = env.step(0.1 * torch.randn(4, 29, generator=g))
        assert not (term | trunc).any()
        total = total + rew.sum()
    (grad,) = torch.autograd.grad(total, a0)
    env.detach()
    return grad, info.get("replayed")


def test_replay_cuts_the_gradient_to_earlier_steps_of_its_row_only(motion_path) -> None:
    start = start_state(make(motion_path, None), fall=False)
    grad, replayed = later_reward_grads(make(motion_path, THRESHOLD, differentiable=True), start)
    assert replayed.tolist() == [False, False, True, True]
    assert torch.equal(grad[2:], torch.zeros(2, 29))  # exactly zero: the replayed states are constants
    assert (grad[:2].abs().amax(1) > 0.1).all()  # the others learn through the state (measured 0.60, 0.33)
    # without replay the same rows' later rewards do reach their earlier actions (so the zeros above are the cut)
    grad_p, _ = later_reward_grads(make(motion_path, None, differentiable=True), start)
    assert (grad_p[2:].abs().amax(1) > 0.1).all()  # measured 0.42, 0.38
    assert torch.equal(grad_p[:2], grad[:2])
