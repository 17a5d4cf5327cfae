"""Batched, differentiable forward kinematics of a :class:`bcg.sim.SimModel` tree, and key points on its bodies.

:class:`Kinematics` is the simulator's own result type (:mod:`bcg.sim.reference`); :class:`KinematicsFn` computes
it with one batched matrix product per tree level instead of one per body, which makes it cheap enough for every
environment step. Same convention as :func:`bcg.sim.reference.forward_kinematics` and MuJoCo's ``xpos`` / ``xmat``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bcg.motion.rotations import quat_to_matrix_wxyz
from bcg.sim import Kinematics, SimModel

__all__ = ["Kinematics", "KinematicsFn", "KeyPoints", "body_ancestry"]


def body_ancestry(parent: np.ndarray) -> np.ndarray:
    """[nb, nb] bool: ``[b, a]`` is True when body a's hinge moves body b (a on b's path to the root, b included; the
    root's row and column stay False) for the tree ``parent`` [nb] (parent[0] of the root unused)."""
    nb = len(parent)
    out = np.zeros((nb, nb), bool)
    for b in range(1, nb):
        a = b
        while a > 0:
            out[b, a] = True
            a = parent[a]
    return out


class KinematicsFn:
    """Forward kinematics ``q [N, nq] -> Kinematics(rot [N, nb, 3, 3], pos [N, nb, 3])`` vectorised by tree depth."""

    def __init__(self, model: SimModel, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        parent = np.asarray(model.body_parent)
        nb = len(parent)
        depth = np.zeros(nb, np.int64)
        for b in range(1, nb):
            depth[b] = depth[parent[b]] + 1
        levels = [np.flatnonzero(depth == d) for d in range(int(depth.max()) + 1)]
        pos_in_level = np.zeros(nb, np.int64)
        for lv in levels:
            pos_in_level[lv] = np.arange(len(lv))
        self.parent_pos = [torch.as_tensor(pos_in_level[parent[lv]], device=device) for lv in levels[1:]]
        self.inverse_order = torch.as_tensor(np.argsort(np.concatenate(levels)), device=device)
        kw = dict(dtype=dtype, device=device)
        axis = torch.as_tensor(model.body_axis, **kw)
        K = torch.zeros(nb, 3, 3, **kw)  # cross-product matrix of each hinge axis (Rodrigues' formula)
        K[:, 0, 1], K[:, 0, 2], K[:, 1, 0] = -axis[:, 2], axis[:, 1], axis[:, 2]
        K[:, 1, 2], K[:, 2, 0], K[:, 2, 1] = -axis[:, 0], -axis[:, 1], axis[:, 0]
        B = quat_to_matrix_wxyz(torch.as_tensor(model.body_quat_wxyz, **kw))
        self.B, self.BK, self.BK2 = B, B @ K, B @ K @ K  # [nb, 3, 3]
        self.body_pos = torch.as_tensor(model.body_pos, **kw)
        self.axis = axis  # [nb, 3] hinge axis in its body's frame (root row unused)
        self.ancestor = torch.as_tensor(body_ancestry(parent), device=device)  # [nb, nb], see body_ancestry
        self.level_idx = [torch.as_tensor(lv, device=device) for lv in levels]
        self.nb = nb
        self.dtype = dtype
        self.device = torch.device(device)

    def __call__(self, q: torch.Tensor) -> Kinematics:
        """Body rotations and positions for qpos ``q`` [N, nq] (root quaternion w, x, y, z)."""
        ang = q[:, 7:]  # the hinge of body b >= 1 is qpos[6 + b]
        s, c = torch.sin(ang)[:, :, None, None], torch.cos(ang)[:, :, None, None]
        Rj = self.B[1:] + s * self.BK[1:] + (1 - c) * self.BK2[1:]  # [N, nb-1, 3, 3], joint frame in parent
        R_lv = [quat_to_matrix_wxyz(q[:, 3:7])[:, None]]
        p_lv = [q[:, None, 0:3]]
        for lv, par in zip(self.level_idx[1:], self.parent_pos, strict=True):
            Rp, pp = R_lv[-1][:, par], p_lv[-1][:, par]
            R_lv.append(Rp @ Rj[:, lv - 1])
            p_lv.append(pp + (Rp @ self.body_pos[lv][None, :, :, None])[..., 0])
        rot = torch.cat(R_lv, 1)[:, self.inverse_order]
        pos = torch.cat(p_lv, 1)[:, self.inverse_order]
        return Kinematics(rot, pos)


@dataclass(frozen=True)
class KeyPoints:
    """Key points as (body index [nk] long, offset in the body frame [nk, 3] [m])."""

    body: torch.Tensor
    offset: torch.Tensor

    @staticmethod
    def of_g1(model: SimModel, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> KeyPoints:
        """The five key points of :data:`bcg.robots.g1.KEY_BODIES` (ankles, head point, wrists) on ``model``."""
        from bcg.robots.g1 import KEY_BODIES

        body = [model.body_names.index(k.body) for k in KEY_BODIES]
        return KeyPoints(torch.as_tensor(body, device=device),
                         torch.tensor([k.offset for k in KEY_BODIES], dtype=dtype, device=device))

    def world(self, kin: Kinematics) -> torch.Tensor:
        """Key-point positions [N, nk, 3] in the world frame."""
        R = kin.rot[:, self.body]
        return kin.pos[:, self.body] + (R @ self.offset[None, :, :, None])[..., 0]
