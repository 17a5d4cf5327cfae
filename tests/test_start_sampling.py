"""Adaptive start sampling (bcg.envs.start_sampling): the per-bin failure average, the floor, the draws, its state,
and the env's use of it (start frames from the sampler, failures recorded from the env's own terminations)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.envs.start_sampling import AdaptiveStartSampler
from bcg.envs.vector_env import G1TrackingVectorEnv


def sampler(**kw) -> AdaptiveStartSampler:
    """A 5.0 s clip at 50 Hz: 251 frames, start frames 0..249, five bins of 50."""
    base = dict(num_frames=251, control_dt=0.02, bin_seconds=1.0, alpha=0.25, uniform_floor=0.1)
    base.update(kw)
    return AdaptiveStartSampler(**base)


def test_bins_cover_the_start_frames() -> None:
    s = sampler(num_frames=232)  # 231 start frames: four bins of 50 and one of 31
    assert (s.num_bins, s.bin_frames) == (5, 50)
    assert s.bin_of(torch.tensor([0, 49, 50, 230, 231, 500])).tolist() == [0, 0, 1, 4, 4, 4]
    # no failure yet: uniform over the start frames, so the short last bin gets its share only
    p = s.probabilities()
    assert torch.allclose(p, torch.tensor([50, 50, 50, 50, 31], dtype=torch.float64) / 231, rtol=0, atol=1e-15)


def test_scores_are_an_exponential_average_of_failures_per_step() -> None:
    s = sampler(alpha=0.25)
    failed = torch.tensor([True, True, False, True])
    frames = torch.tensor([60, 99, 10, 240])  # bins 1, 1, (0: not failed), 4
    s.record(failed, frames)
    assert s.scores.tolist() == [0.0, 0.5, 0.0, 0.0, 0.25]
    s.record(torch.zeros(4, dtype=torch.bool), frames)  # a step without failures decays the average
    assert s.scores.tolist() == [0.0, 0.375, 0.0, 0.0, 0.1875]
    s.record(torch.tensor([True, False, False, False]), torch.tensor([250, 0, 0, 0]))  # the clip's last frame
    assert s.scores.tolist() == [0.0, 0.28125, 0.0, 0.0, 0.140625 + 0.25]


def test_start_credit_counts_failures_where_their_episodes_began() -> None:
    """credit="start": a failure counts to the bin of its episode's start frame, not of the frame it ended at."""
    s = sampler(alpha=0.25, credit="start")
    failed = torch.tensor([True, True, False, True])
    frames = torch.tensor([140, 99, 10, 240])  # ended in bins 2, 1, -, 4
    starts = torch.tensor([0, 60, 5, 210])  # began in bins 0, 1, -, 4
    s.record(failed, frames, starts)
    assert s.scores.tolist() == [0.25, 0.25, 0.0, 0.0, 0.25]
    with pytest.raises(ValueError, match="needs the episodes' start frames"):
        s.record(failed, frames)
    end = sampler(alpha=0.25)
    end.record(failed, frames, starts)  # the default ignores the starts
    assert end.scores.tolist() == [0.0, 0.25, 0.25, 0.0, 0.25]


def test_probabilities_follow_failures_and_keep_the_floor() -> None:
    s = sampler(uniform_floor=0.1)
    s.record(torch.tensor([True, True, True, False]), torch.tensor([120, 130, 210, 0]))  # bin 2 twice, bin 4 once
    p = s.probabilities()
    floor = 0.1 / 5  # equal bins of 50 of the 250 start frames
    want = torch.tensor([floor, floor, 0.9 * 2 / 3 + floor, floor, 0.9 / 3 + floor], dtype=torch.float64)
    assert torch.allclose(p, want, rtol=0, atol=1e-15) and abs(float(p.sum()) - 1.0) < 1e-15
    # the empirical frequencies of 200 000 draws match, and every bin keeps its floor
    frames = s.sample(200_000, torch.Generator().manual_seed(0))
    freq = torch.bincount(s.bin_of(frames), minlength=5).double() / frames.numel()
    assert (freq - want).abs().max() < 3e-3  # measured 1.5e-3 (binomial std <= 1.1e-3)
    assert (freq > 0.9 * floor).all()
    # inside a bin the frame is uniform: each of bin 2's 50 frames gets about 1/50 of the bin's draws
    inside = torch.bincount(frames[s.bin_of(frames) == 2] - 100, minlength=50).double()
    assert inside.numel() == 50 and (inside / inside.sum() - 0.02).abs().max() < 2e-3  # measured 0.9e-3
    assert int(frames.min()) >= 0 and int(frames.max()) <= 249


def test_zero_floor_draws_only_failed_bins() -> None:
    s = sampler(uniform_floor=0.0)
    s.record(torch.tensor([True]), torch.tensor([170]))
    frames = s.sample(5000, torch.Generator().manual_seed(1))
    assert s.bin_of(frames).unique().tolist() == [3]
    # uniform numbers at the edges: the smallest and the largest 24-bit draws stay inside the bin and the clip
    u = torch.tensor([[0.0, 0.0], [1 - 2**-24, 1 - 2**-24]])
    assert s.frames_from_uniform(u).tolist() == [150, 199]


def test_draws_are_deterministic_given_a_generator() -> None:
    s = sampler()
    s.record(torch.tensor([True, True]), torch.tensor([30, 200]))
    a = s.sample(100, torch.Generator().manual_seed(7))
    b = s.sample(100, torch.Generator().manual_seed(7))
    c = s.sample(100, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_state_dict_round_trip_and_mismatch() -> None:
    s = sampler()
    s.record(torch.tensor([True, True]), torch.tensor([30, 200]))
    t = sampler()
    t.load_state_dict(s.state_dict())
    assert torch.equal(s.scores, t.scores) and torch.equal(s.probabilities(), t.probabilities())
    with pytest.raises(ValueError, match="bins of 50 frames over 250"):
        sampler(bin_seconds=0.5).load_state_dict(s.state_dict())


@pytest.mark.parametrize("kw, match", [(dict(alpha=0.0), "alpha"), (dict(uniform_floor=1.5), "uniform_floor"),
                                       (dict(bin_seconds=-1.0), "bin_seconds"), (dict(num_frames=1), "num_frames"),
                                       (dict(credit="middle"), "credit")])
def test_bad_options_are_refused(kw, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sampler(**kw)


# ------------------------------------------------------------------------------------------------ in the env


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory):
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=4.0)  # 201 frames


def test_env_records_its_failures_and_restarts_them_in_the_failed_bin(motion_path) -> None:
    """Rows that fall at known frames: the sampler's scores count them in those frames' bins, and (floor 0) the
    autoreset starts the new episodes in the bin where the failures happened."""
    env = G1TrackingVectorEnv(4, str(motion_path), adaptive_start=True, adaptive_start_floor=0.0,
                              adaptive_start_alpha=0.5)
    assert env.start_sampler is not None and env.start_sampler.num_bins == 4
    env.reset(seed=0)
    s = env.state
    low = s.q.clone()
    low[:2, 2] = 0.1  # rows 0 and 1: the pelvis below termination_height, a fall on the next step
    env.load_state(dataclasses.replace(s, q=low, frame=torch.tensor([120, 130, 10, 20])))
    _, _, term, _, info = env.step(torch.zeros(4, 29))
    assert term.tolist() == [True, True, False, False] and info["fell"][:2].all()
    # the failures happened at frames 121 and 131: bin 2 (frames 100-149)
    assert env.start_sampler.scores.tolist() == [0.0, 0.0, 1.0, 0.0]
    new = env.frame[:2]
    assert ((new >= 100) & (new < 150)).all() and env.frame[2:].tolist() == [11, 21]


def test_env_start_credit_counts_the_episode_start(motion_path) -> None:
    """With adaptive_start_credit="start" the env hands the sampler each row's start frame (frame - episode steps):
    rows that began at frames 20 and 30 and fall 101 steps later count to bin 0, not to bin 2 where they fell."""
    env = G1TrackingVectorEnv(4, str(motion_path), adaptive_start=True, adaptive_start_floor=0.0,
                              adaptive_start_alpha=0.5, adaptive_start_credit="start")
    env.reset(seed=0)
    s = env.state
    low = s.q.clone()
    low[:2, 2] = 0.1
    env.load_state(dataclasses.replace(s, q=low, frame=torch.tensor([120, 130, 10, 20]),
                                       episode_steps=torch.tensor([100, 100, 0, 0])))
    _, _, term, _, _ = env.step(torch.zeros(4, 29))
    assert term.tolist() == [True, True, False, False]
    assert env.start_sampler.scores.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert (env.frame[:2] < 50).all()  # floor 0: the new episodes start in bin 0
    with pytest.raises(ValueError, match="adaptive_start_credit"):
        G1TrackingVectorEnv(1, str(motion_path), adaptive_start=True, adaptive_start_credit="end-ish")


def test_env_start_frames_follow_the_sampler(motion_path) -> None:
    env = G1TrackingVectorEnv(64, str(motion_path), adaptive_start=True, adaptive_start_floor=0.0)
    env.start_sampler.record(torch.tensor([True]), torch.tensor([60]))  # bin 1 only
    env.reset(seed=3)
    assert ((env.frame >= 50) & (env.frame < 100)).all()
    first = env.frame.clone()
    env.reset(seed=3)  # a function of the seed
    assert torch.equal(env.frame, first)
    off = G1TrackingVectorEnv(64, str(motion_path))
    off.reset(seed=3)
    assert off.start_sampler is None and not ((off.frame >= 50) & (off.frame < 100)).all()


def test_env_layer_state_round_trip(motion_path) -> None:
    env = G1TrackingVectorEnv(2, str(motion_path), adaptive_start=True)
    env.start_sampler.record(torch.tensor([True, False]), torch.tensor([60, 0]))
    other = G1TrackingVectorEnv(2, str(motion_path), adaptive_start=True)
    other.load_layers_state_dict(env.layers_state_dict())
    assert torch.equal(other.start_sampler.scores, env.start_sampler.scores)
    plain = G1TrackingVectorEnv(2, str(motion_path))
    assert plain.layers_state_dict() == {}
    with pytest.raises(ValueError, match="adaptive start"):
        plain.load_layers_state_dict(env.layers_state_dict())
