"""Every rotation helper of bcg above the simulator, in one place: quaternion products and conversions (torch and
numpy), Euler angles, the 6-D tangent-normal form and the heading frame.

Quaternions are **w, x, y, z** everywhere (names say ``_wxyz``); rotation matrices act on column vectors. The torch
functions are batched over any leading dimensions and differentiable; the numpy ones (suffix ``_np``) work in
float64 and serve the file loaders. The two torch primitives the integrator also uses,
:func:`quat_mul_wxyz` and :func:`quat_to_matrix_wxyz`, are defined once in :mod:`bcg.sim.reference` and re-exported.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from bcg.sim import quat_mul_wxyz, quat_to_matrix_wxyz

__all__ = [
    "axis_angle_quat_wxyz",
    "euler_to_quat_wxyz",
    "heading_inverse",
    "hemisphere_continuous_np",
    "matrix_to_quat_wxyz",
    "matrix_to_quat_wxyz_np",
    "normalized_np",
    "quat_conj_np",
    "quat_mul_np",
    "quat_mul_wxyz",
    "quat_to_matrix_wxyz",
    "quat_to_tan_norm",
    "slerp_np",
    "tan_norm",
    "yaw_np",
    "yaw_quat_np",
]

# ---------------------------------------------------------------------------------------------------------- torch


def tan_norm(R: torch.Tensor) -> torch.Tensor:
    """6-D tangent-normal encoding [..., 6] of rotation matrices [..., 3, 3]: (R e_x, R e_z) (docs/method.md §6.3)."""
    return torch.cat([R[..., :, 0], R[..., :, 2]], -1)


def quat_to_tan_norm(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """6-D tangent-normal encoding [..., 6] of quaternions [..., 4] (MimicKit ``quat_to_tan_norm``)."""
    return tan_norm(quat_to_matrix_wxyz(quat_wxyz))


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


def euler_to_quat_wxyz(rpy: torch.Tensor) -> torch.Tensor:
    """Quaternions [..., 4] of roll, pitch, yaw angles [..., 3] [rad] (z-y-x intrinsic: R = Rz(y) Ry(p) Rx(r))."""
    r, p, y = (rpy * 0.5).unbind(-1)
    cr, sr, cp, sp, cy, sy = r.cos(), r.sin(), p.cos(), p.sin(), y.cos(), y.sin()
    return torch.stack([
        cr * cp * cy + sr * sp * sy,
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
    ], -1)


def axis_angle_quat_wxyz(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Quaternions [..., 4] of rotations by ``angle`` [...] [rad] about unit ``axis`` [..., 3] (broadcast)."""
    half = 0.5 * angle[..., None]
    return torch.cat([torch.cos(half), torch.sin(half) * axis], -1)


def matrix_to_quat_wxyz(R: torch.Tensor) -> torch.Tensor:
    """Unit quaternions [..., 4] with w >= 0 of rotation matrices [..., 3, 3].

    Batched Shepperd method: of the four candidate formulas the one with the largest pivot is taken per matrix, so
    no division by a small number occurs. Differentiable away from the switches between candidates.
    """
    m = R
    t = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    d = torch.stack([t, m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]], -1)
    best = d.argmax(-1, keepdim=True)
    # each candidate's 4 components times 4 * pivot, pivot = sqrt(1 + 2 d_i - t) / 2 (i = 0: sqrt(1 + t) / 2)
    s = torch.sqrt(torch.clamp(1.0 + 2.0 * d - t[..., None], min=1e-12))  # = 2 * pivot
    r21, r12 = m[..., 2, 1], m[..., 1, 2]
    r02, r20 = m[..., 0, 2], m[..., 2, 0]
    r10, r01 = m[..., 1, 0], m[..., 0, 1]
    cand = torch.stack([
        torch.stack([s[..., 0] ** 2, r21 - r12, r02 - r20, r10 - r01], -1) / (2 * s[..., 0:1]),
        torch.stack([r21 - r12, s[..., 1] ** 2, r01 + r10, r02 + r20], -1) / (2 * s[..., 1:2]),
        torch.stack([r02 - r20, r01 + r10, s[..., 2] ** 2, r12 + r21], -1) / (2 * s[..., 2:3]),
        torch.stack([r10 - r01, r02 + r20, r12 + r21, s[..., 3] ** 2], -1) / (2 * s[..., 3:4]),
    ], -2)  # [..., 4 candidates, 4]
    q = torch.gather(cand, -2, best[..., None].expand(best.shape[:-1] + (1, 4)))[..., 0, :]
    q = q / torch.linalg.norm(q, dim=-1, keepdim=True)
    return torch.where(q[..., :1] < 0, -q, q)


# ---------------------------------------------------------------------------------------------------------- numpy


def quat_mul_np(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a (x) b of quaternions [..., 4] (numpy)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], -1)


def quat_conj_np(q: np.ndarray) -> np.ndarray:
    """Conjugate (inverse of a unit quaternion) [..., 4]."""
    return q * np.array([1.0, -1.0, -1.0, -1.0])


def normalized_np(q: np.ndarray) -> np.ndarray:
    """Unit quaternions [F, 4]; rows already unit to 1e-12 are returned bit for bit (so loading is idempotent)."""
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    return np.where(np.abs(n - 1.0) > 1e-12, q / n, q)


def hemisphere_continuous_np(q: np.ndarray) -> np.ndarray:
    """Flip signs so that consecutive quaternions [F, 4] have a non-negative dot product."""
    q = q.copy()
    if len(q) < 2:
        return q
    dots = np.sum(q[1:] * q[:-1], -1)
    flips = np.concatenate([[1.0], np.cumprod(np.where(dots < 0, -1.0, 1.0))])
    return q * flips[:, None]


def slerp_np(q0: np.ndarray, q1: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Slerp between unit quaternions [K, 4] with fractions ``a`` [K] (shortest arc)."""
    dot = np.sum(q0 * q1, -1)
    q1 = np.where(dot[:, None] < 0, -q1, q1)
    dot = np.abs(dot)
    theta = np.arccos(np.clip(dot, -1.0, 1.0))
    small = theta < 1e-6
    s = np.sin(np.where(small, 1.0, theta))
    w0 = np.where(small, 1.0 - a, np.sin((1.0 - a) * theta) / s)
    w1 = np.where(small, a, np.sin(a * theta) / s)
    out = w0[:, None] * q0 + w1[:, None] * q1
    return out / np.linalg.norm(out, axis=-1, keepdims=True)


def yaw_quat_np(yaw: float) -> np.ndarray:
    """Quaternion [4] of a rotation about z by ``yaw`` [rad]."""
    return np.array([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)])


def yaw_np(q: np.ndarray) -> np.ndarray:
    """Heading angle [...] [rad] (z-y-x yaw) of quaternions [..., 4]."""
    w, x, y, z = np.moveaxis(q, -1, 0)
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def matrix_to_quat_wxyz_np(R: np.ndarray) -> np.ndarray:
    """Unit quaternions [..., 4] (w >= 0) of rotation matrices [..., 3, 3] (float64)."""
    q = matrix_to_quat_wxyz(torch.as_tensor(np.asarray(R, dtype=np.float64)))
    return q.numpy()
