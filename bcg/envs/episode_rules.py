"""What a step's new state means for its episode: the reward, the end of the episode (a fall, a key point too far from
the reference, a deviation rule, an unstable state) and its truncation (the clip's last frame, the step limit).

:class:`EpisodeRules` is one part of the vector env (``env.rules``). The env hands it the simulated features after
the physics and gets :class:`StepSignals` back; on the CPU without autograd, with the default reward and no deviation
rules, :meth:`EpisodeRules.one_launch` computes the same signals, the features and the next observation in a single
Warp launch (:mod:`bcg.envs.warp_step`), whose values are the general path's bits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from bcg.envs.rewards import StepContext, TrackingReward
from bcg.envs.state import EnvState
from bcg.envs.termination import DeviationTermination
from bcg.envs.warp_observation import WarpObservation
from bcg.envs.warp_reward import WarpTrackingReward
from bcg.envs.warp_step import StepOutputs, WarpStepOutputs
from bcg.motion.features import Features

__all__ = ["EpisodeRules", "StepSignals"]


class StepSignals(NamedTuple):
    """The signals of one step for N rows."""

    reward: torch.Tensor
    """[N] (0 for unstable rows), differentiable as the reward function is."""
    terminated: torch.Tensor
    """[N] bool: fell, a key point beyond the termination distance, a deviation rule, or unstable."""
    truncated: torch.Tensor
    """[N] bool: the clip's last frame or the step limit reached, and not terminated."""
    fell: torch.Tensor
    """[N] bool: the pelvis below the termination height."""
    tracking_error: torch.Tensor | None
    """[N] mean over the bodies of the distance between simulated and reference body origins [m] (None when not
    asked for on the torch path)."""


class EpisodeRules:
    """The reward and the termination and truncation rules of the env's steps.

    Args:
        ref: the reference :class:`Features` at every frame of the clip ([F] rows).
        reward_fn: the reward (default :class:`~bcg.envs.rewards.TrackingReward`; replaceable as ``reward_fn``).
        termination_height: pelvis height below which a row has fallen [m].
        termination_distance: largest key-point distance to the reference before a row ends [m].
        max_episode_steps: the step limit (None: the clip's end only).
        deviation: the optional deviation rules (:class:`~bcg.envs.termination.DeviationTermination`), or None.
        warp_reward: the Warp reward and metrics (CPU), or None for the torch code.
        one_launch: the Warp launch of a whole step's outputs (CPU), or None.
    """

    def __init__(self, ref: Features, reward_fn: Any, termination_height: float,
                 termination_distance: float, max_episode_steps: int | None, deviation: DeviationTermination | None,
                 warp_reward: WarpTrackingReward | None, one_launch: WarpStepOutputs | None) -> None:
        self.ref = ref
        self.num_frames = int(ref.root_pos_w.shape[0])
        self.reward_fn = reward_fn
        self.termination_height = float(termination_height)
        self.termination_distance = float(termination_distance)
        self.max_episode_steps = max_episode_steps
        self.deviation = deviation
        self.warp_reward = warp_reward
        self.warp_step = one_launch
        self.use_warp = warp_reward is not None
        """Whether the Warp paths run (CPU only; the env switches them with the other parts')."""

    def ref_features(self, frame: torch.Tensor) -> Features:
        """Reference :class:`Features` at integer motion frames ``frame`` [N] (clamped to the clip)."""
        return self.ref.rows(frame.clamp(0, self.num_frames - 1))

    def one_launch(self, q1: torch.Tensor, qd1: torch.Tensor, actions: torch.Tensor, s: EnvState,
                   guard_bounds: tuple[float, float, float]) -> StepOutputs | None:
        """The whole step's outputs from one launch when it applies (the Warp paths on, no autograd, the plain
        default reward, no deviation rules, float32 CPU tensors); else None. ``s`` is the state before the step,
        ``guard_bounds`` the instability guard's launch bounds."""
        if not (self.use_warp and self.warp_step is not None and not torch.is_grad_enabled()
                and type(self.reward_fn) is TrackingReward and self.deviation is None
                and q1.dtype == torch.float32
                and WarpStepOutputs.accepts(q1, qd1, actions, s.prev_actions, s.frame, s.episode_steps)):
            return None
        return self.warp_step(q1, qd1, actions, s.prev_actions, s.frame, s.episode_steps, self.reward_fn,
                              guard_bounds, self.termination_height, self.termination_distance,
                              self.max_episode_steps)

    def __call__(self, sim: Features, frame: torch.Tensor, steps: torch.Tensor, ctx: StepContext,
                 bad: torch.Tensor, any_bad: bool, tracking: bool = False) -> StepSignals:
        """The signals of a step that landed on motion frames ``frame`` [N] after ``steps`` [N] episode steps, with
        simulated features ``sim``; ``bad`` [N] marks the unstable rows (reward 0, terminated), ``any_bad`` whether
        there are any. ``tracking``: also the tracking error on the torch path (the Warp path always has it)."""
        n = frame.shape[0]
        frame_c = frame.clamp(0, self.num_frames - 1)
        ref = None  # the reference features of frame, gathered only for the torch paths
        if self.use_warp and WarpTrackingReward.accepts(self.reward_fn, sim, ctx):
            reward = self.warp_reward(self.reward_fn, sim, frame_c, ctx)
        else:
            ref = self.ref_features(frame)
            reward = self.reward_fn(sim, ref, ctx)
        if reward.shape != (n,):
            raise ValueError(f"the reward function returned shape {list(reward.shape)}, expected [{n}]")
        if any_bad:
            reward = torch.where(bad, torch.zeros_like(reward), reward)

        with torch.no_grad():
            fell = sim.root_pos_w[:, 2] < self.termination_height
            track = None
            if self.use_warp and WarpObservation.accepts(sim):
                key_dist, track = self.warp_reward.metrics(sim, frame_c)
            else:
                ref = self.ref_features(frame) if ref is None else ref
                key_dist = (sim.key_pos_w - ref.key_pos_w).norm(dim=-1).amax(1)
                if tracking:  # E_track: mean over bodies of the world position error
                    track = (sim.body_pos_w - ref.body_pos_w).norm(dim=-1).mean(1)
            terminated = fell | (key_dist > self.termination_distance) | bad
            if self.deviation is not None:
                terminated |= self.deviation(sim, frame_c)
            truncated = frame >= self.num_frames - 1
            if self.max_episode_steps is not None:
                truncated |= steps >= self.max_episode_steps
            truncated &= ~terminated
        return StepSignals(reward, terminated, truncated, fell, track)
