"""The action mapping of the G1 tracking environments: actions to PD joint targets and back.

q_des = q_default + offset + s_a tanh(a)  (docs/method.md §7.2) with the per-joint scale s_a chosen so that every target
inside the joint range is reached by an action with |a| <= ``reach``: s_a = max(hi - q_default, q_default - lo) /
tanh(reach). The inverse is a = atanh((q_des - q_default - offset) / s_a), with targets beyond the reach of the
tanh clamped to |a| <= :data:`MAX_INVERSE_ACTION`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["ActionMap", "ClipActionMap", "DEFAULT_REACH", "MAX_INVERSE_ACTION", "check_actions", "default_action_scale",
           "torque_action_scale"]

DEFAULT_REACH: float = 0.9
"""|a| that reaches the farther joint limit with the default action scale."""

MAX_INVERSE_ACTION: float = 4.0
"""Largest |a| :meth:`ActionMap.to_action` returns (targets beyond s_a tanh(4) from the default are clamped)."""


def check_actions(actions: object, num_envs: int, nu: int, device: torch.device) -> torch.Tensor:
    """``actions`` as a float32 tensor [num_envs, nu] on ``device`` (numpy and array-likes converted); raises
    ``ValueError`` / ``TypeError`` naming what is wrong: the shape, a non-float dtype, another device, NaN or inf (with
    the first affected environments)."""
    if isinstance(actions, np.ndarray) or not isinstance(actions, torch.Tensor):
        actions = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=device)
    want = (num_envs, nu)
    if tuple(actions.shape) != want:
        raise ValueError(f"actions must have shape {list(want)}, got {list(actions.shape)}")
    if not actions.is_floating_point():
        raise TypeError(f"actions must be floating point, got {actions.dtype}")
    if actions.device != device:
        raise ValueError(f"actions are on {actions.device}, the environment on {device}")
    # one reduction: a float64 sum of float32 values cannot overflow, so it is finite exactly when every entry is
    # (the rows are found only for the message)
    if not math.isfinite(float(actions.detach().sum(dtype=torch.float64))):
        bad = ~torch.isfinite(actions.detach()).all(1)
        raise ValueError(f"actions contain NaN or inf (environments {bad.nonzero().flatten()[:8].tolist()})")
    return actions.to(torch.float32)


def default_action_scale(default_pos: np.ndarray, ranges: np.ndarray, reach: float = DEFAULT_REACH) -> np.ndarray:
    """Per-joint scale [nu] [rad] that maps |a| <= ``reach`` onto the whole joint range ``ranges`` [nu, 2]."""
    far = np.maximum(ranges[:, 1] - default_pos, default_pos - ranges[:, 0])
    return far / math.tanh(reach)


def torque_action_scale(kp: np.ndarray, torque_limits: np.ndarray, fraction: float) -> np.ndarray:
    """Per-joint scale [nu] [rad] s_j = fraction * L_j / kp_j: a full action (|tanh(a)| = 1) moves joint j's PD target
    by the offset that asks for ``fraction`` of its torque limit L_j [N m] from its gain kp_j [N m / rad].

    One radian means very different torques on a 200 N m/rad knee and a 20 N m/rad wrist; in these units an action
    alone cannot drive an actuator deep into saturation, where simulators part (MuJoCo clamps the torque, ours
    saturates smoothly) and where a policy that bangs joints against their limits does not transfer."""
    kp, lim = np.asarray(kp, dtype=np.float64), np.asarray(torque_limits, dtype=np.float64)
    if not (np.isfinite(fraction) and fraction > 0):
        raise ValueError(f"fraction must be a finite value > 0, got {fraction!r}")
    if kp.shape != lim.shape or np.any(kp <= 0) or np.any(~np.isfinite(lim)) or np.any(lim <= 0):
        raise ValueError("kp and torque_limits must be positive finite arrays of the same shape")
    return fraction * lim / kp


class ActionMap:
    """``to_target(a, offset)`` and its inverse ``to_action(q_des, offset)``, batched [N, nu] (torch)."""

    def __init__(self, default_pos: torch.Tensor, scale: torch.Tensor):
        self.default_pos = default_pos
        self.scale = scale

    def to_target(self, actions: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        """PD targets [N, nu] [rad] of actions [N, nu] (differentiable)."""
        base = self.default_pos if offset is None else self.default_pos + offset
        return base + self.scale * torch.tanh(actions)

    def to_action(self, targets: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
        """Actions [N, nu] whose targets are ``targets`` [N, nu] [rad] (clamped to |a| <= MAX_INVERSE_ACTION)."""
        base = self.default_pos if offset is None else self.default_pos + offset
        lim = math.tanh(MAX_INVERSE_ACTION)
        return torch.atanh(((targets - base) / self.scale).clamp(-lim, lim))


class ClipActionMap:
    """What an action means in a tracking env, where a row is at motion frame ``frame``: PD targets
    q_default + joint offset + s_a tanh(a), and with ``offset="reference"`` the clip's joint positions at the frame
    the step lands on (``frame + 1``) in place of q_default (residual actions). Batched [N, nu] (torch).

    Args:
        action_map: the :class:`ActionMap` (default pose, scale).
        offset: ``"default"`` or ``"reference"`` (``EnvConfig.action_offset``).
        ref_joints: the clip's joint positions [F, nu] [rad].
    """

    def __init__(self, action_map: ActionMap, offset: str, ref_joints: torch.Tensor):
        if offset not in ("default", "reference"):
            raise ValueError(f"action offset must be 'default' or 'reference', got {offset!r}")
        self.map, self.offset, self.ref_joints = action_map, offset, ref_joints

    def base(self, joint_offset: torch.Tensor, frame: torch.Tensor, ahead: int = 0) -> torch.Tensor:
        """Offset [N, nu] [rad] added to q_default: the joint offsets [N, nu], plus with ``offset="reference"`` the
        clip's joint positions at frames ``frame + ahead`` [N] (clamped to the clip) minus q_default."""
        if self.offset == "default":
            return joint_offset
        ref = self.ref_joints[(frame + ahead).clamp(0, self.ref_joints.shape[0] - 1)]
        return joint_offset + (ref - self.map.default_pos)

    def to_target(self, actions: torch.Tensor, joint_offset: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """PD targets [N, nu] [rad] of ``actions`` [N, nu] taken at motion frames ``frame`` [N] (differentiable)."""
        return self.map.to_target(actions, self.base(joint_offset, frame, 1))

    def to_action(self, targets: torch.Tensor, joint_offset: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """Actions [N, nu] whose PD targets at motion frames ``frame`` [N] are ``targets`` [N, nu] [rad]."""
        return self.map.to_action(targets, self.base(joint_offset, frame, 1))
