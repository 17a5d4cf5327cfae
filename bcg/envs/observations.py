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

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from bcg.sim.model import SimModel
from bcg.sim.reference import quat_to_matrix_wxyz as quat_to_matrix

__all__ = [
    "Features",
    "Kinematics",
    "KinematicsFn",
    "heading_inverse",
    "observation_layout",
    "robot_observation",
    "reference_observation",
    "tan_norm",
    "quat_to_matrix",
    "matrix_to_quat",
]


def matrix_to_quat(R: torch.Tensor) -> torch.Tensor:
    """Quaternions [..., 4] (w, x, y, z, w >= 0) of rotation matrices [..., 3, 3] (not differentiable-safe at
    all branches; used for rendering and reference data only)."""
    m = R.detach().cpu().double().numpy().reshape(-1, 3, 3)
    out = np.empty((m.shape[0], 4))
    for i, r in enumerate(m):
        t = np.trace(r)
        if t > 0:
            s = np.sqrt(t + 1.0) * 2
            out[i] = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
        elif r[0, 0] > r[1, 1] and r[0, 0] > r[2, 2]:
            s = np.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2]) * 2
            out[i] = [(r[2, 1] - r[1, 2]) / s, 0.25 * s, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s]
        elif r[1, 1] > r[2, 2]:
            s = np.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2]) * 2
            out[i] = [(r[0, 2] - r[2, 0]) / s, (r[0, 1] + r[1, 0]) / s, 0.25 * s, (r[1, 2] + r[2, 1]) / s]
        else:
            s = np.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1]) * 2
            out[i] = [(r[1, 0] - r[0, 1]) / s, (r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, 0.25 * s]
    out *= np.where(out[:, :1] < 0, -1.0, 1.0)
    return torch.as_tensor(out.reshape(R.shape[:-2] + (4,)), dtype=R.dtype, device=R.device)


def tan_norm(R: torch.Tensor) -> torch.Tensor:
    """6-D tangent-normal encoding [..., 6] of rotation matrices [..., 3, 3]: (R e_x, R e_z)."""
    return torch.cat([R[..., :, 0], R[..., :, 2]], -1)


def heading_inverse(R_root: torch.Tensor) -> torch.Tensor:
    """Inverse heading rotation [..., 3, 3]: the rotation about world z that removes the root's yaw.

    The yaw is that of the root's x axis projected on the ground plane (smooth except when that axis is vertical).
    """
    fx, fy = R_root[..., 0, 0], R_root[..., 1, 0]
    n = torch.sqrt(fx * fx + fy * fy + 1e-12)
    c, s = fx / n, fy / n
    zero, one = torch.zeros_like(c), torch.ones_like(c)
    rows = [c, s, zero, -s, c, zero, zero, zero, one]
    return torch.stack(rows, -1).reshape(c.shape + (3, 3))


class Kinematics(NamedTuple):
    """World placement of all bodies: ``rot`` [N, nb, 3, 3], ``pos`` [N, nb, 3] (body origins) [m]."""

    rot: torch.Tensor
    pos: torch.Tensor


class KinematicsFn:
    """Batched, differentiable forward kinematics of a :class:`SimModel` tree, vectorised by tree depth.

    Same convention as :func:`bcg.sim.reference.forward_kinematics` (and MuJoCo's ``xpos``/``xmat``), but one
    batched matrix product per tree level instead of one per body, which makes it cheap enough to run every step.
    """

    def __init__(self, model: SimModel, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        parent = np.asarray(model.body_parent)
        nb = len(parent)
        depth = np.zeros(nb, np.int64)
        for b in range(1, nb):
            depth[b] = depth[parent[b]] + 1
        self.levels: list[np.ndarray] = [np.flatnonzero(depth == d) for d in range(int(depth.max()) + 1)]
        pos_in_level = np.zeros(nb, np.int64)
        for lv in self.levels:
            pos_in_level[lv] = np.arange(len(lv))
        self.parent_pos = [torch.as_tensor(pos_in_level[parent[lv]], device=device) for lv in self.levels[1:]]
        order = np.concatenate(self.levels)
        self.inverse_order = torch.as_tensor(np.argsort(order), device=device)
        kw = dict(dtype=dtype, device=device)
        axis = torch.as_tensor(model.body_axis, **kw)
        K = torch.zeros(nb, 3, 3, **kw)
        K[:, 0, 1], K[:, 0, 2], K[:, 1, 0] = -axis[:, 2], axis[:, 1], axis[:, 2]
        K[:, 1, 2], K[:, 2, 0], K[:, 2, 1] = -axis[:, 0], -axis[:, 1], axis[:, 0]
        B = quat_to_matrix(torch.as_tensor(model.body_quat_wxyz, **kw))
        self.B = B  # [nb, 3, 3]
        self.BK = B @ K
        self.BK2 = B @ K @ K
        self.body_pos = torch.as_tensor(model.body_pos, **kw)
        self.level_idx = [torch.as_tensor(lv, device=device) for lv in self.levels]
        self.nb = nb

    def __call__(self, q: torch.Tensor) -> Kinematics:
        """Body rotations and positions for qpos ``q`` [N, nq] (root quaternion w, x, y, z)."""
        ang = q[:, 7:]  # hinge of body b >= 1 is qpos[6 + b]
        s, c = torch.sin(ang)[:, :, None, None], torch.cos(ang)[:, :, None, None]
        Rj = self.B[1:] + s * self.BK[1:] + (1 - c) * self.BK2[1:]  # [N, nb-1, 3, 3], joint frame in parent
        R_lv = [quat_to_matrix(q[:, 3:7])[:, None]]
        p_lv = [q[:, None, 0:3]]
        for lv, par in zip(self.level_idx[1:], self.parent_pos):
            Rp, pp = R_lv[-1][:, par], p_lv[-1][:, par]
            R_lv.append(Rp @ Rj[:, lv - 1])
            p_lv.append(pp + (Rp @ self.body_pos[lv][None, :, :, None])[..., 0])
        rot = torch.cat(R_lv, 1)[:, self.inverse_order]
        pos = torch.cat(p_lv, 1)[:, self.inverse_order]
        return Kinematics(rot, pos)


class Features(NamedTuple):
    """Simulated or reference features of one time step (inputs of rewards, terminations and observations).

    All batched over ``N``; world frame unless said otherwise; quaternion-free (rotation matrices).
    """

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


@dataclass(frozen=True)
class KeyPoints:
    """Key points as (body index, offset in the body frame)."""

    body: torch.Tensor  # [nk] long
    offset: torch.Tensor  # [nk, 3]

    def world(self, kin: Kinematics) -> torch.Tensor:
        """Key-point positions [N, nk, 3] in the world frame."""
        R = kin.rot[:, self.body]
        return kin.pos[:, self.body] + (R @ self.offset[None, :, :, None])[..., 0]


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
