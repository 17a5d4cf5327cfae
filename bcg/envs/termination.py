"""Termination on unrecoverable deviation from the reference (the rules of BeyondMimic's tracking task).

Besides the env's own fall and distance rules (``termination_height``, ``termination_distance``), an episode ends
when, after a step:

* the pelvis (anchor) height differs from the reference's by more than ``anchor_height`` [m];
* the z component of the gravity direction seen from the pelvis (the projected gravity, ``-R[2, 2]`` of the pelvis
  rotation) differs from the reference's by more than ``gravity_z`` (differences lie in [0, 2]; with an upright
  reference, 0.8 is a pelvis tilted 78 degrees, 1 - cos(78 deg) = 0.8);
* any end effector (the ankle and wrist key points of :data:`bcg.robots.g1.KEY_BODIES`) differs in height from its
  reference by more than ``end_effector_height`` [m].

Each threshold is off when None. A terminated episode bootstraps with a zero value in the agents (SHAC sets the next
value of a terminated row to 0 and cuts its actor segment there), so a window never learns from the time after such
a deviation, which is how these rules keep the gradient of a window from running through a fall.
"""

from __future__ import annotations

import math
import numbers

import torch

from bcg.motion.features import Features

__all__ = ["END_EFFECTORS", "DeviationTermination"]

END_EFFECTORS: tuple[str, ...] = ("left_ankle", "right_ankle", "left_wrist", "right_wrist")
"""Key points (names of :data:`bcg.robots.g1.KEY_BODIES`) whose height error the end-effector rule checks."""


def _threshold(name: str, v: float | None) -> float | None:
    if v is None:
        return None
    if not (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0 or None, got {v!r}")
    return float(v)


def projected_gravity_z(root_rot_w: torch.Tensor) -> torch.Tensor:
    """z component [N] of the unit gravity direction (0, 0, -1) in the pelvis frame, of rotations [N, 3, 3]."""
    return -root_rot_w[:, 2, 2]


class DeviationTermination:
    """``rules(sim, frame) -> [N] bool``: rows whose state after a step deviates beyond a threshold from the
    reference at motion frames ``frame`` [N] (clamped to the clip).

    Args:
        ref: the reference :class:`Features` of every frame of the clip ([F, ...]).
        anchor_height: pelvis height error [m] (BeyondMimic: 0.25), or None.
        gravity_z: projected-gravity z difference (BeyondMimic: 0.8), or None.
        end_effector_height: largest ankle / wrist height error [m] (BeyondMimic: 0.25), or None.
    """

    def __init__(self, ref: Features, anchor_height: float | None = None, gravity_z: float | None = None,
                 end_effector_height: float | None = None):
        from bcg.robots.g1 import KEY_BODIES

        self.anchor_height = _threshold("anchor_height", anchor_height)
        self.gravity_z = _threshold("gravity_z", gravity_z)
        self.end_effector_height = _threshold("end_effector_height", end_effector_height)
        names = [k.name for k in KEY_BODIES]
        self.end_effectors = torch.tensor([names.index(n) for n in END_EFFECTORS], device=ref.key_pos_w.device)
        """Indices [E] of the end effectors among the key points."""
        with torch.no_grad():
            self._root_z = ref.root_pos_w[:, 2].detach().clone()  # [F]
            self._gravity_z = projected_gravity_z(ref.root_rot_w).detach().clone()  # [F]
            self._ee_z = ref.key_pos_w[:, self.end_effectors, 2].detach().clone()  # [F, E]

    @property
    def active(self) -> bool:
        """Whether any rule is on."""
        return not (self.anchor_height is None and self.gravity_z is None and self.end_effector_height is None)

    @torch.no_grad()
    def __call__(self, sim: Features, frame: torch.Tensor) -> torch.Tensor:
        f = frame.clamp(0, self._root_z.shape[0] - 1)
        out = torch.zeros(f.shape[0], dtype=torch.bool, device=f.device)
        if self.anchor_height is not None:
            out |= (sim.root_pos_w[:, 2].detach() - self._root_z[f]).abs() > self.anchor_height
        if self.gravity_z is not None:
            out |= (projected_gravity_z(sim.root_rot_w.detach()) - self._gravity_z[f]).abs() > self.gravity_z
        if self.end_effector_height is not None:
            ee = sim.key_pos_w[:, self.end_effectors, 2].detach()
            out |= ((ee - self._ee_z[f]).abs() > self.end_effector_height).any(1)
        return out
