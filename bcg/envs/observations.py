"""Observation and feature computation of the G1 tracking environments (METHOD.md section 7.1), in batched torch.

Everything here is differentiable with torch autograd and works in float32 or float64. Frames: ``_w`` world,
``_h`` heading frame (the world frame rotated about z by the root's yaw, origin at the root). Quaternions are
**w, x, y, z** wherever they appear. Rotations enter the observation in the 6-D tangent-normal encoding: the first
and third columns of the rotation matrix (the images of the x and z axes).

Observation layout (``nb`` bodies, ``nk`` key bodies, ``nj`` hinges, ``K`` reference steps), see
:func:`observation_layout`:

robot part (``1 + 6 + 3 + 3 + 6 nb + nj + 3 nk``; 237 for the G1):
    root height [m]; root orientation in the heading frame (6-D); root linear velocity (heading frame) [m/s];
    root angular velocity (heading frame) [rad/s]; every body's orientation in the heading frame (6-D each,
    pelvis included); hinge velocities [rad/s]; key-body positions relative to the root (heading frame) [m].
reference part, for each of the ``K`` next reference frames (``3 + 6 + 6 nb + 3 nk`` each; 3 x 204 for the G1):
    reference root position relative to the robot root (robot heading frame) [m]; reference root orientation in
    the robot heading frame (6-D); every reference body's orientation in the *reference's own* heading frame (6-D
    each); reference key-body positions relative to the robot root (robot heading frame) [m].
"""

from __future__ import annotations

import torch

from bcg.motion.features import Features
from bcg.motion.rotations import heading_inverse, tan_norm

__all__ = ["observation_layout", "reference_observation", "robot_observation"]


def observation_layout(nb: int, nk: int, nj: int, ref_steps: int = 3) -> list[tuple[str, int]]:
    """Ordered ``(name, size)`` of the observation terms; the sizes sum to the observation dimension."""
    robot = [
        ("root_height", 1),
        ("root_rot_h", 6),
        ("root_lin_vel_h", 3),
        ("root_ang_vel_h", 3),
        ("body_rot_h", 6 * nb),
        ("joint_vel", nj),
        ("key_pos_h", 3 * nk),
    ]
    ref = []
    for k in range(1, ref_steps + 1):
        ref += [
            (f"ref{k}_root_pos_h", 3),
            (f"ref{k}_root_rot_h", 6),
            (f"ref{k}_body_rot_ref_h", 6 * nb),
            (f"ref{k}_key_pos_h", 3 * nk),
        ]
    return robot + ref


def robot_observation(f: Features) -> tuple[torch.Tensor, torch.Tensor]:
    """The robot part of the observation [N, 1 + 6 + 3 + 3 + 6 nb + nj + 3 nk] and the inverse heading [N, 3, 3]."""
    n = f.root_pos_w.shape[0]
    Hi = heading_inverse(f.root_rot_w)
    root_rot_h = Hi @ f.root_rot_w
    lin = (Hi @ f.root_lin_vel_w[:, :, None])[..., 0]
    ang = (Hi @ (f.root_rot_w @ f.root_ang_vel_b[:, :, None]))[..., 0]
    body_rot_h = Hi[:, None] @ f.body_rot_w
    key_h = (Hi[:, None] @ (f.key_pos_w - f.root_pos_w[:, None])[..., None])[..., 0]
    obs = torch.cat([
        f.root_pos_w[:, 2:3],
        tan_norm(root_rot_h),
        lin,
        ang,
        tan_norm(body_rot_h).reshape(n, -1),
        f.joint_vel,
        key_h.reshape(n, -1),
    ], -1)
    return obs, Hi


def reference_observation(root_pos_w: torch.Tensor, Hi: torch.Tensor, ref_root_pos_w: torch.Tensor,
                          ref_root_rot_w: torch.Tensor, ref_body_rot6_refh: torch.Tensor,
                          ref_key_pos_w: torch.Tensor) -> torch.Tensor:
    """The reference part of the observation for ``K`` future frames.

    Args:
        root_pos_w: [N, 3] robot root position; Hi: [N, 3, 3] robot inverse heading.
        ref_root_pos_w: [N, K, 3]; ref_root_rot_w: [N, K, 3, 3]; ref_body_rot6_refh: [N, K, nb, 6] (reference body
            orientations in the reference's own heading frame, 6-D); ref_key_pos_w: [N, K, nk, 3].
    Returns:
        [N, K * (3 + 6 + 6 nb + 3 nk)].
    """
    n, k = ref_root_pos_w.shape[:2]
    Hk = Hi[:, None]
    rel = (Hk @ (ref_root_pos_w - root_pos_w[:, None])[..., None])[..., 0]  # [N, K, 3]
    rot = tan_norm(Hk @ ref_root_rot_w)  # [N, K, 6]
    key = (Hk[:, :, None] @ (ref_key_pos_w - root_pos_w[:, None, None])[..., None])[..., 0]  # [N, K, nk, 3]
    per = torch.cat([rel, rot, ref_body_rot6_refh.reshape(n, k, -1), key.reshape(n, k, -1)], -1)
    return per.reshape(n, -1)
