"""Rewards of the G1 tracking environments: the default tracking reward, and the callable protocol for others.

A reward is any callable ``reward(sim, ref, ctx) -> [N]`` of the simulated :class:`~bcg.envs.observations.Features`,
the phase-matched reference ``Features`` and a :class:`StepContext` (actions, previous actions, contact report).
It must be written in torch so that, in a differentiable environment, it carries gradients to the state and
the actions. The adversarial ADD reward (METHOD.md section 6) plugs in through this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from bcg.envs.observations import Features, tan_norm

__all__ = ["RewardFn", "StepContext", "TrackingReward"]


class StepContext(NamedTuple):
    """What a reward may use besides the features."""

    actions: torch.Tensor
    """[N, nu] this step's policy actions (before the tanh)."""
    prev_actions: torch.Tensor
    """[N, nu] the previous step's policy actions (zeros after a reset)."""
    contact: Any
    """The simulator's :class:`bcg.sim.ContactReport` of this step."""


class RewardFn(Protocol):
    def __call__(self, sim: Features, ref: Features, ctx: StepContext) -> torch.Tensor: ...


@dataclass(frozen=True)
class TrackingReward:
    """DeepMimic-style tracking reward: a weighted sum of exponentiated tracking errors minus an action-rate term.

    r = w_pose exp(-k_pose sum_j (q_j - q^_j)^2)
      + w_vel exp(-k_vel sum_j (qd_j - qd^_j)^2)
      + w_key exp(-k_key sum_k |(p_k - p_root) - (p^_k - p^_root)|^2)
      + w_root exp(-k_root_pos |p_root - p^_root|^2 - k_root_rot |tn(R_root) - tn(R^_root)|^2)
      + w_root_vel exp(-k_root_lin |v - v^|^2 - k_root_ang |w_b - w^_b|^2)
      - action_rate * mean_j (tanh a_t - tanh a_{t-1})^2

    In [-2 action_rate, 1]; every term is smooth in the state, so the reward is differentiable.
    """

    w_pose: float = 0.5
    """Weight of the joint-position term."""
    k_pose: float = 2.0
    """Scale of the joint-position error [1/rad^2]."""
    w_vel: float = 0.05
    """Weight of the joint-velocity term."""
    k_vel: float = 0.1
    """Scale of the joint-velocity error [s^2/rad^2]."""
    w_key: float = 0.2
    """Weight of the key-body term (positions relative to the root)."""
    k_key: float = 10.0
    """Scale of the key-body error [1/m^2]."""
    w_root: float = 0.15
    """Weight of the root pose term."""
    k_root_pos: float = 10.0
    """Scale of the root position error [1/m^2]."""
    k_root_rot: float = 2.0
    """Scale of the root orientation error (6-D tangent-normal difference, squared)."""
    w_root_vel: float = 0.1
    """Weight of the root velocity term."""
    k_root_lin: float = 1.0
    """Scale of the root linear velocity error [s^2/m^2]."""
    k_root_ang: float = 0.1
    """Scale of the root angular velocity error [s^2/rad^2]."""
    action_rate: float = 0.8
    """Weight of the action-rate penalty (METHOD.md 6.4 uses 0.8), applied to the mean over joints of the
    squared change of tanh(action)."""

    def __call__(self, sim: Features, ref: Features, ctx: StepContext) -> torch.Tensor:
        def sq(x: torch.Tensor) -> torch.Tensor:
            return (x * x).flatten(1).sum(1)

        pose = sq(sim.joint_pos - ref.joint_pos)
        vel = sq(sim.joint_vel - ref.joint_vel)
        key = sq((sim.key_pos_w - sim.root_pos_w[:, None]) - (ref.key_pos_w - ref.root_pos_w[:, None]))
        root_p = sq(sim.root_pos_w - ref.root_pos_w)
        root_r = sq(tan_norm(sim.root_rot_w) - tan_norm(ref.root_rot_w))
        lin = sq(sim.root_lin_vel_w - ref.root_lin_vel_w)
        ang = sq(sim.root_ang_vel_b - ref.root_ang_vel_b)
        rate = (torch.tanh(ctx.actions) - torch.tanh(ctx.prev_actions)).pow(2).mean(1)
        return (self.w_pose * torch.exp(-self.k_pose * pose)
                + self.w_vel * torch.exp(-self.k_vel * vel)
                + self.w_key * torch.exp(-self.k_key * key)
                + self.w_root * torch.exp(-self.k_root_pos * root_p - self.k_root_rot * root_r)
                + self.w_root_vel * torch.exp(-self.k_root_lin * lin - self.k_root_ang * ang)
                - self.action_rate * rate)
