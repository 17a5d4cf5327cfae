"""Tracking metrics of a G1 policy against its reference clip, under the names used across G1 motion-tracking work
(BeyondMimic's ``MotionCommand`` metrics), plus E_track, falls and foot penetration (docs/method.md §3.10).

Per step and environment, from the simulated and the reference :class:`bcg.motion.Features` of the same time (the
reference frame the step reached), with the *anchor* body ``torso_link`` (:data:`ANCHOR_BODY`):

* ``error_anchor_pos`` [m]: world distance between the robot's and the reference's anchor origins.
* ``error_anchor_rot`` [rad]: geodesic angle between the two anchor orientations, angle(R_ref^T R_sim) in [0, pi].
* ``error_body_pos`` [m]: mean over the 30 bodies of the distance between the robot's body origin and the
  reference's, after the reference is moved onto the robot's anchor: shifted horizontally to the robot's anchor
  (its height kept) and turned about z by the yaw between the two anchors, p_rel = t + R_yaw (p_ref - p_anchor_ref)
  with t = (robot anchor x, robot anchor y, reference anchor z). Local pose error, insensitive to drift and heading.
* ``error_body_rot`` [rad]: mean over the bodies of angle((R_yaw R_ref)^T R_sim), same re-anchoring.
* ``error_joint_pos`` [rad]: Euclidean norm over the 29 hinges of q_ref - q.
* ``error_joint_vel`` [rad/s]: Euclidean norm over the 29 hinges of qd_ref - qd.
* ``e_track_cm`` [cm]: E_track, the mean over the 30 bodies of the *world* distance between simulated and reference
  body origins (no re-anchoring: drift counts), x 100; the same quantity as the env's ``info["tracking_error"]``.

:class:`TrackingMetrics` averages the per-step values over every recorded step of every episode alike (an episode's
steps are those from its first control step up to and including the one that ended it), and adds the fall count and
rate (an episode that ended with the pelvis below the fall height) and the mean foot penetration: the mean over those
steps and the 8 foot spheres of max(penetration, 0) at the end of each control step [mm].
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from bcg.motion.features import Features
from bcg.motion.rotations import heading_inverse

__all__ = ["ANCHOR_BODY", "ERROR_NAMES", "TrackingMetrics", "anchor_index", "rotation_angle", "step_errors",
           "summarize"]

ANCHOR_BODY: str = "torso_link"
"""The anchor body of the anchor and re-anchored body metrics (as in BeyondMimic's G1 tracking)."""

ERROR_NAMES: tuple[str, ...] = ("error_anchor_pos", "error_anchor_rot", "error_body_pos", "error_body_rot",
                                "error_joint_pos", "error_joint_vel", "e_track_cm")
"""The per-step errors of :func:`step_errors`, in this order."""


def rotation_angle(R: torch.Tensor) -> torch.Tensor:
    """Rotation angle [...] in [0, pi] [rad] of rotation matrices [..., 3, 3] (atan2 form: accurate near 0 and pi)."""
    s = torch.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1)
    tr = R[..., 0, 0] + R[..., 1, 1] + R[..., 2, 2]
    return torch.atan2(0.5 * s.norm(dim=-1), 0.5 * (tr - 1.0))


def step_errors(sim: Features, ref: Features, anchor: int) -> dict[str, torch.Tensor]:
    """The per-step errors of the module docstring, each [N], for simulated and reference features of N states.

    Args:
        sim, ref: features of the robot and of the reference at the same time (``[N, nb, ...]`` bodies).
        anchor: index of the anchor body in the features' body order (:func:`anchor_index`).
    """
    with torch.no_grad():
        pa_s, pa_r = sim.body_pos_w[:, anchor], ref.body_pos_w[:, anchor]
        Ra_s, Ra_r = sim.body_rot_w[:, anchor], ref.body_rot_w[:, anchor]
        # yaw of R_sim R_ref^T: the heading rotation that turns the reference anchor's heading onto the robot's
        R_yaw = heading_inverse(Ra_s @ Ra_r.transpose(-1, -2)).transpose(-1, -2)
        t = torch.cat([pa_s[:, :2], pa_r[:, 2:3]], -1)
        p_rel = t[:, None] + torch.einsum("nij,nbj->nbi", R_yaw, ref.body_pos_w - pa_r[:, None])
        R_rel = R_yaw[:, None] @ ref.body_rot_w
        return {
            "error_anchor_pos": (pa_r - pa_s).norm(dim=-1),
            "error_anchor_rot": rotation_angle(Ra_r.transpose(-1, -2) @ Ra_s),
            "error_body_pos": (p_rel - sim.body_pos_w).norm(dim=-1).mean(1),
            "error_body_rot": rotation_angle(R_rel.transpose(-1, -2) @ sim.body_rot_w).mean(1),
            "error_joint_pos": (ref.joint_pos - sim.joint_pos).norm(dim=-1),
            "error_joint_vel": (ref.joint_vel - sim.joint_vel).norm(dim=-1),
            "e_track_cm": 100.0 * (sim.body_pos_w - ref.body_pos_w).norm(dim=-1).mean(1),
        }


def anchor_index(body_names: tuple[str, ...] | list[str], name: str = ANCHOR_BODY) -> int:
    """Index of body ``name`` in ``body_names`` (e.g. ``env.model.body_names``), with an error listing them."""
    names = list(body_names)
    if name not in names:
        raise ValueError(f"anchor body {name!r} is not one of the model's bodies {names}")
    return names.index(name)


@dataclass(frozen=True)
class TrackingMetrics:
    """Tracking metrics of a set of episodes (definitions: module docstring). Means over all recorded steps."""

    error_anchor_pos: float
    """Anchor (torso) position error, world frame [m]."""
    error_anchor_rot: float
    """Anchor orientation error (geodesic angle) [rad]."""
    error_body_pos: float
    """Mean body position error after re-anchoring the reference on the robot's anchor [m]."""
    error_body_rot: float
    """Mean body orientation error after re-anchoring [rad]."""
    error_joint_pos: float
    """Norm of the hinge angle error [rad]."""
    error_joint_vel: float
    """Norm of the hinge rate error [rad/s]."""
    e_track_cm: float
    """E_track: mean world body position error [cm]."""
    falls: int
    """Episodes that ended with the pelvis below the fall height."""
    fall_rate: float
    """falls / episodes."""
    unstable: int
    """Episodes that ended because the state left the env's bounds (non-finite, a speed above
    ``bcg.sim.MAX_SPEED`` = 200 m/s or rad/s, ...): the env's instability guard, applied to either simulator."""
    episodes: int
    """Number of episodes."""
    steps: int
    """Recorded control steps, all episodes together."""
    mean_penetration_mm: float
    """Mean over the recorded steps and the 8 foot spheres of max(penetration, 0) [mm]."""
    mean_episode_seconds: float
    """Mean episode duration [s] (to the fall or the end)."""

    def to_dict(self) -> dict[str, float | int]:
        """Plain dict (JSON-able; NaN stays NaN)."""
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent)

    @staticmethod
    def markdown_table(rows: dict[str, TrackingMetrics]) -> str:
        """A Markdown table, one row per labelled result (e.g. ``{"MuJoCo": m1, "bcg": m2}``), one column per
        metric, with units in the header."""
        units = {"error_anchor_pos": "m", "error_anchor_rot": "rad", "error_body_pos": "m", "error_body_rot": "rad",
                 "error_joint_pos": "rad", "error_joint_vel": "rad/s", "e_track_cm": "cm",
                 "mean_penetration_mm": "mm", "mean_episode_seconds": "s"}
        names = [f.name for f in fields(TrackingMetrics)]
        head = "| simulator | " + " | ".join(f"{n} [{units[n]}]" if n in units else n for n in names) + " |"
        lines = [head, "|" + " --- |" * (len(names) + 1)]
        for label, m in rows.items():
            vals = [getattr(m, n) for n in names]
            lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in vals) + " |")
        return "\n".join(lines)


def _fmt(v: float | int) -> str:
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.4g}"


def summarize(errors: dict[str, np.ndarray], mask: np.ndarray, penetration: np.ndarray, fell: np.ndarray,
              control_dt: float, unstable: np.ndarray | None = None) -> TrackingMetrics:
    """:class:`TrackingMetrics` of recorded rollouts.

    Args:
        errors: the per-step errors of :func:`step_errors` stacked over time, each [T, E] (E episodes).
        mask: [T, E] bool, the recorded steps of every episode (up to and including its last).
        penetration: [T, E, nc] foot-sphere penetration at the end of every step [m].
        fell: [E] bool, the episodes that ended in a fall.
        control_dt: control period [s].
        unstable: [E] bool, the episodes the env's instability guard ended (default: none).
    """
    mask = np.asarray(mask, dtype=bool)
    steps = int(mask.sum())
    if steps == 0:
        raise ValueError("summarize: no recorded step (every episode is empty)")
    mean = {k: float(np.asarray(v, dtype=np.float64)[mask].mean()) for k, v in errors.items()}
    missing = set(ERROR_NAMES) - set(mean)
    if missing:
        raise ValueError(f"summarize: errors lack {sorted(missing)}")
    pen = np.clip(np.asarray(penetration, dtype=np.float64)[mask], 0.0, None).mean()
    episodes = int(mask.shape[1])
    falls = int(np.asarray(fell, dtype=bool).sum())
    return TrackingMetrics(
        **{k: mean[k] for k in ERROR_NAMES}, falls=falls, fall_rate=falls / episodes,
        unstable=0 if unstable is None else int(np.asarray(unstable, dtype=bool).sum()), episodes=episodes,
        steps=steps, mean_penetration_mm=1e3 * float(pen),
        mean_episode_seconds=float(mask.sum(0).mean()) * float(control_dt),
    )
