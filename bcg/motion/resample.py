"""Resampling of qpos frames to the control rate and finite-difference velocities (numpy, docs/method.md §9.4)."""

from __future__ import annotations

import math

import numpy as np

from bcg.motion.rotations import hemisphere_continuous_np, quat_conj_np, quat_mul_np, slerp_np

__all__ = ["finite_difference_qvel", "resample_qpos"]


def resample_qpos(qpos: np.ndarray, src_fps: float, dst_dt: float) -> np.ndarray:
    """Resample qpos frames [F, 36] at ``src_fps`` [Hz] to the period ``dst_dt`` [s] by time.

    Output frame k is at time k * dst_dt, for every k with k * dst_dt <= (F - 1) / src_fps (to 1e-9 s). Root position
    and joints are interpolated linearly, the root quaternion by slerp (inputs made hemisphere-continuous first).
    Resampling at the file's own rate returns the input unchanged.
    """
    n_src = len(qpos)
    if abs(src_fps * dst_dt - 1.0) < 1e-12:
        return qpos.copy()
    dur = (n_src - 1) / src_fps
    n_dst = int(math.floor(dur / dst_dt + 1e-9)) + 1
    u = np.arange(n_dst) * dst_dt * src_fps
    i0 = np.clip(np.floor(u + 1e-9).astype(np.int64), 0, max(n_src - 2, 0))
    a = np.clip(u - i0, 0.0, 1.0)
    a = np.where(a < 1e-9, 0.0, a)
    i1 = np.minimum(i0 + 1, n_src - 1)
    out = qpos[i0] + a[:, None] * (qpos[i1] - qpos[i0])
    quat = hemisphere_continuous_np(qpos[:, 3:7])
    out[:, 3:7] = hemisphere_continuous_np(slerp_np(quat[i0], quat[i1], a))
    return out


def finite_difference_qvel(qpos: np.ndarray, dt: float) -> np.ndarray:
    """qvel [F, 35] of qpos frames [F, 36] (period ``dt`` [s]): central differences inside, one-sided at the ends.

    Root linear velocity in the world frame; root angular velocity in the body frame from the quaternion derivative,
    omega_b = 2 q^-1 (x) dq/dt (vector part); joint rates.
    """
    if len(qpos) < 2:
        raise ValueError(f"finite differences need at least 2 frames, got {len(qpos)}")
    quat = hemisphere_continuous_np(qpos[:, 3:7])
    q = np.concatenate([qpos[:, :3], quat, qpos[:, 7:]], 1)
    d = np.gradient(q, dt, axis=0, edge_order=1)
    omega_b = 2.0 * quat_mul_np(quat_conj_np(quat), d[:, 3:7])[:, 1:]
    return np.concatenate([d[:, :3], omega_b, d[:, 7:]], 1)
