"""Features of a G1 state: the one function that both the simulated robot and the reference motion go through.

:class:`FeatureFn` turns MuJoCo-layout states ``(q [N, 36], qd [N, 35])`` into :class:`Features` (world-frame body
poses, key points, velocities). The environments call it on the simulated state every step; :class:`bcg.motion.Motion`
calls it on the reference state, so reference and simulated quantities (rewards, observations, the 233-D ADD
discriminator features of docs/method.md §6.3 from :func:`disc_features`) are computed by the same code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from bcg.motion.kinematics import KeyPoints, KinematicsFn
from bcg.motion.rotations import axis_angle_quat_wxyz, quat_to_tan_norm, tan_norm
from bcg.sim import SimModel

__all__ = ["FeatureFn", "Features", "disc_features", "features"]


class Features(NamedTuple):
    """Simulated or reference features of one time step, batched over ``N``; world frame unless said otherwise."""

    root_pos_w: torch.Tensor
    """[N, 3] pelvis position [m]."""
    root_rot_w: torch.Tensor
    """[N, 3, 3] pelvis orientation."""
    root_lin_vel_w: torch.Tensor
    """[N, 3] pelvis linear velocity (world frame) [m/s] (= qvel[0:3])."""
    root_ang_vel_b: torch.Tensor
    """[N, 3] pelvis angular velocity in the pelvis frame [rad/s] (= qvel[3:6])."""
    joint_pos: torch.Tensor
    """[N, nj] hinge angles [rad]."""
    joint_vel: torch.Tensor
    """[N, nj] hinge rates [rad/s]."""
    body_pos_w: torch.Tensor
    """[N, nb, 3] body origins [m]."""
    body_rot_w: torch.Tensor
    """[N, nb, 3, 3] body orientations."""
    key_pos_w: torch.Tensor
    """[N, nk, 3] key points [m] (``bcg.robots.g1.KEY_BODIES`` order)."""

    def rows(self, idx: torch.Tensor) -> Features:
        """Rows ``idx`` of every field (``idx`` long of any shape: the fields get that leading shape)."""
        return Features(*[x[idx] for x in self])

    def cast(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Features:
        """Every field in ``dtype`` (floating fields) on ``device``."""
        return Features(*[x.to(device=device, dtype=dtype) for x in self])


def features(kin_fn: KinematicsFn, keys: KeyPoints, q: torch.Tensor, qd: torch.Tensor) -> Features:
    """Features of states ``q`` [N, nq], ``qd`` [N, nv] (MuJoCo layout)."""
    kin = kin_fn(q)
    return Features(
        root_pos_w=q[:, 0:3],
        root_rot_w=kin.rot[:, 0],
        root_lin_vel_w=qd[:, 0:3],
        root_ang_vel_b=qd[:, 3:6],
        joint_pos=q[:, 7:],
        joint_vel=qd[:, 6:],
        body_pos_w=kin.pos,
        body_rot_w=kin.rot,
        key_pos_w=keys.world(kin),
    )


def disc_features(f: Features, joint_axes: torch.Tensor) -> torch.Tensor:
    """ADD discriminator features phi [N, 3 + 6 + 6 nj + 3 nk + 3 + 3 + nj] (233 for the G1; docs/method.md §6.3,
    ``global_obs``): root position, root rotation (6-D), local hinge rotations (6-D each, about ``joint_axes``
    [nj, 3]), key points relative to the root (world axes), root linear and angular velocity (world frame), joint
    velocities. Not detached anywhere: in a differentiable environment phi carries the state's gradient."""
    n = f.root_pos_w.shape[0]
    joint_rot = quat_to_tan_norm(axis_angle_quat_wxyz(joint_axes.to(f.joint_pos), f.joint_pos))
    ang_w = (f.root_rot_w @ f.root_ang_vel_b[:, :, None])[..., 0]
    return torch.cat([
        f.root_pos_w, tan_norm(f.root_rot_w), joint_rot.reshape(n, -1),
        (f.key_pos_w - f.root_pos_w[:, None]).reshape(n, -1), f.root_lin_vel_w, ang_w, f.joint_vel,
    ], -1)


class FeatureFn:
    """``(q [N, nq], qd [N, nv]) -> Features`` for a model: its kinematics, the G1 key points and hinge axes."""

    def __init__(self, model: SimModel, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.kin = KinematicsFn(model, dtype, device)
        self.keys = KeyPoints.of_g1(model, dtype, device)
        self.joint_axes = torch.as_tensor(model.body_axis[1:], dtype=dtype, device=device)
        self.dtype = dtype
        self.device = torch.device(device)

    def __call__(self, q: torch.Tensor, qd: torch.Tensor) -> Features:
        return features(self.kin, self.keys, q, qd)

    def disc(self, f: Features) -> torch.Tensor:
        """:func:`disc_features` of ``f`` with this model's hinge axes."""
        return disc_features(f, self.joint_axes)
