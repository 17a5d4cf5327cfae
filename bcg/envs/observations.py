"""Observation and feature computation of the G1 tracking environments (docs/method.md §7.1), in batched torch.

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

from typing import TYPE_CHECKING, NamedTuple

import torch

from bcg.motion.features import FeatureFn, Features
from bcg.motion.rotations import heading_inverse, tan_norm

if TYPE_CHECKING:  # pragma: no cover
    from bcg.motion import Motion

__all__ = ["ReferenceTable", "TrackingObservation", "observation", "observation_layout", "reference_observation",
           "robot_observation"]


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


class ReferenceTable(NamedTuple):
    """The per-frame reference quantities the observation reads, laid out so that a step gathers them with three
    index operations (F frames, ``nb`` bodies, ``nk`` key points)."""

    points_w: torch.Tensor
    """[F, 1 + nk, 3] reference root position, then the key points, world frame [m]."""
    root_rot_w: torch.Tensor
    """[F, 3, 3] reference root orientation."""
    body_rot6: torch.Tensor
    """[F, 6 nb] reference body orientations in the reference's own heading frame (6-D each, flattened)."""

    @staticmethod
    def of(ref: Features) -> ReferenceTable:
        """The table of reference features ``ref`` (one row per frame)."""
        f = ref.root_pos_w.shape[0]
        rot6 = tan_norm(heading_inverse(ref.root_rot_w)[:, None] @ ref.body_rot_w)
        return ReferenceTable(torch.cat([ref.root_pos_w[:, None], ref.key_pos_w], 1), ref.root_rot_w,
                              rot6.reshape(f, -1))


def observation(f: Features, table: ReferenceTable, fut: torch.Tensor) -> torch.Tensor:
    """The whole observation [N, D] (robot part, then the reference part of frames ``fut`` [N, K] long) in about
    25 torch operations instead of the 45 of :func:`robot_observation` + :func:`reference_observation`, with the
    same values bit for bit (the same products, batched: per-op overhead dominates an env step at small N).

    The root's orientation is body 0's, the two root velocities go through one product with the heading, and the
    robot's key points share one product with the reference root and key points.
    """
    n, k = fut.shape
    nk = f.key_pos_w.shape[1]
    Hi = heading_inverse(f.root_rot_w)
    rot6 = tan_norm(Hi[:, None] @ f.body_rot_w)  # [N, nb, 6]; body 0 is the root
    ang_w = (f.root_rot_w @ f.root_ang_vel_b[:, :, None])[..., 0]
    vel = Hi @ torch.stack([f.root_lin_vel_w, ang_w], -1)  # [N, 3, 2]: linear, angular (heading frame)
    pts = torch.cat([f.key_pos_w, table.points_w[fut].reshape(n, k * (1 + nk), 3)], 1)
    rel = (Hi[:, None] @ (pts - f.root_pos_w[:, None])[..., None])[..., 0]  # [N, nk + K (1 + nk), 3]
    ref_rel = rel[:, nk:].reshape(n, k, 1 + nk, 3)
    ref_rot = tan_norm(Hi[:, None] @ table.root_rot_w[fut])  # [N, K, 6]
    per = torch.cat([ref_rel[:, :, 0], ref_rot, table.body_rot6[fut], ref_rel[:, :, 1:].reshape(n, k, -1)], -1)
    return torch.cat([f.root_pos_w[:, 2:3], rot6[:, 0], vel[..., 0], vel[..., 1], rot6.reshape(n, -1), f.joint_vel,
                      rel[:, :nk].reshape(n, -1), per.reshape(n, -1)], -1)


class TrackingObservation:
    """The tracking environments' noise-free observation of robot states against a clip, outside an environment:
    ``obs_fn(qpos [N, 36], qvel [N, 35], frame [N]) -> obs [N, D]`` (float32 torch; 849 for the G1).

    ``qpos`` / ``qvel`` are in MuJoCo's layout (base position, quaternion w, x, y, z, hinges; base linear velocity in
    the world frame, base angular velocity in the body frame, hinge rates), so an ``MjData``'s ``qpos`` and ``qvel``
    go in as they are; ``frame`` [N] is the clip frame the robot is at (the reference part shows frames
    ``frame + 1 .. frame + ref_steps``, clamped to the clip). The same formulas as the environments' observation
    (tested against ``env.observe()``), for running an exported policy on another simulator or a robot.

    Args:
        motion: the clip (:func:`bcg.motion.load_motion`); its model gives the kinematics.
        ref_steps: reference frames shown ahead (the envs' ``ref_steps``, 3 by default).
    """

    def __init__(self, motion: Motion, ref_steps: int = 3):
        if int(ref_steps) < 1:
            raise ValueError(f"ref_steps must be >= 1, got {ref_steps!r}")
        model = motion.model
        self.features = FeatureFn(model, torch.float32, "cpu")
        self.table = ReferenceTable.of(motion.features.cast(torch.float32, "cpu"))
        self.num_frames = int(motion.num_frames)
        self.future = torch.arange(1, int(ref_steps) + 1)
        self.layout: list[tuple[str, int]] = observation_layout(model.nb, self.features.keys.body.numel(),
                                                                model.nv - 6, int(ref_steps))
        """Ordered ``(term, size)`` of the observation (:func:`observation_layout`)."""
        self.dim = sum(s for _, s in self.layout)
        """Observation size D."""

    def __call__(self, qpos: torch.Tensor, qvel: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        q = torch.as_tensor(qpos, dtype=torch.float32)
        qd = torch.as_tensor(qvel, dtype=torch.float32)
        fr = torch.as_tensor(frame, dtype=torch.long).reshape(-1)
        if q.ndim != 2 or qd.ndim != 2 or q.shape[0] != qd.shape[0] or q.shape[0] != fr.shape[0]:
            raise ValueError(f"qpos [N, nq], qvel [N, nv] and frame [N] must share N, got {list(q.shape)}, "
                             f"{list(qd.shape)} and {list(fr.shape)}")
        fut = (fr[:, None] + self.future).clamp(0, self.num_frames - 1)
        with torch.no_grad():
            return observation(self.features(q, qd), self.table, fut)
