"""Rewards of the G1 tracking environments: the default tracking reward, and the callable protocol for others.

A reward is any callable ``reward(sim, ref, ctx) -> [N]`` of the simulated :class:`~bcg.envs.observations.Features`,
the phase-matched reference ``Features`` and a :class:`StepContext` (actions, previous actions, contact report).
It must be written in torch so that, in a differentiable environment, it carries gradients to the state and
the actions. The adversarial ADD reward (docs/method.md §6) plugs in through this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from bcg.motion.features import Features
from bcg.motion.rotations import tan_norm

__all__ = ["RewardFn", "StepContext", "TrackingReward"]


class StepContext(NamedTuple):
    """What a reward may use besides the features."""

    actions: torch.Tensor
    """[N, nu] this step's policy actions (before the tanh)."""
    prev_actions: torch.Tensor
    """[N, nu] the previous step's policy actions (after a reset: the action that reproduces the reference pose)."""
    contact: Any
    """The simulator's :class:`bcg.sim.ContactReport` of this step."""


class RewardFn(Protocol):
    def __call__(self, sim: Features, ref: Features, ctx: StepContext) -> torch.Tensor: ...


@dataclass(frozen=True)
class TrackingReward:
    """DeepMimic-style tracking reward: a weighted sum of exponentiated tracking errors and an action-smoothness term.

    r = w_pose exp(-k_pose sum_j (q_j - q^_j)^2)
      + w_vel exp(-k_vel sum_j (qd_j - qd^_j)^2)
      + w_key exp(-k_key sum_k |(p_k - p_root) - (p^_k - p^_root)|^2)
      + w_root exp(-k_root_pos |p_root - p^_root|^2 - k_root_rot |tn(R_root) - tn(R^_root)|^2)
      + w_root_vel exp(-k_root_lin |v - v^|^2 - k_root_ang |w_b - w^_b|^2)
      + w_smooth exp(-k_smooth mean_j (a_t - a_{t-1})^2)

    Every term is non-negative, so the reward lies in [0, 1] (1 on the reference with an unchanged action): ending an
    episode early never pays, whatever the policy does. (A penalty -0.8 |a_t - a_{t-1}|^2, docs/method.md §6.4, made an
    exploring policy earn about -0.45 per step, which taught it to fall.) Smooth in the state and the actions.
    """

    w_pose: float = 0.4
    """Weight of the joint-position term."""
    k_pose: float = 2.0
    """Scale of the joint-position error [1/rad^2]."""
    w_vel: float = 0.04
    """Weight of the joint-velocity term."""
    k_vel: float = 0.1
    """Scale of the joint-velocity error [s^2/rad^2]."""
    w_key: float = 0.16
    """Weight of the key-body term (positions relative to the root)."""
    k_key: float = 10.0
    """Scale of the key-body error [1/m^2]."""
    w_root: float = 0.12
    """Weight of the root pose term."""
    k_root_pos: float = 10.0
    """Scale of the root position error [1/m^2]."""
    k_root_rot: float = 2.0
    """Scale of the root orientation error (6-D tangent-normal difference, squared)."""
    w_root_vel: float = 0.08
    """Weight of the root velocity term."""
    k_root_lin: float = 1.0
    """Scale of the root linear velocity error [s^2/m^2]."""
    k_root_ang: float = 0.1
    """Scale of the root angular velocity error [s^2/rad^2]."""
    w_smooth: float = 0.2
    """Weight of the action-smoothness term."""
    k_smooth: float = 1.0
    """Scale of the mean over joints of the squared change of the raw action (before the tanh) in the smoothness
    term. On the raw action, not on tanh(a): in tanh space an action driven into saturation is 'smooth' whatever
    the exploration noise, and SHAC learned exactly that (mean |a| 0.46 -> 1.56 in 12 iterations, docs/shac.md)."""

    def __post_init__(self) -> None:
        for f in ("w_pose", "w_vel", "w_key", "w_root", "w_root_vel", "w_smooth"):
            if not getattr(self, f) >= 0:
                raise ValueError(f"TrackingReward.{f} must be >= 0 (the reward stays non-negative), got "
                                 f"{getattr(self, f)!r}")

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
        rate = (ctx.actions - ctx.prev_actions).pow(2).mean(1)
        return (self.w_pose * torch.exp(-self.k_pose * pose)
                + self.w_vel * torch.exp(-self.k_vel * vel)
                + self.w_key * torch.exp(-self.k_key * key)
                + self.w_root * torch.exp(-self.k_root_pos * root_p - self.k_root_rot * root_r)
                + self.w_root_vel * torch.exp(-self.k_root_lin * lin - self.k_root_ang * ang)
                + self.w_smooth * torch.exp(-self.k_smooth * rate))
