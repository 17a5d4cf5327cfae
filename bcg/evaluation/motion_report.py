"""Kinematic validation report of a reference motion: joint limits, stance sliding, penetration, joint speeds and
the contact schedule (``bcg motions inspect`` / ``validate-all``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bcg.motion.clip import Motion
from bcg.motion.formats import joint_ranges
from bcg.motion.resample import finite_difference_qvel
from bcg.motion.rotations import yaw_np
from bcg.robots.g1 import NOMINAL_SPEEDS

__all__ = ["AT_STOP", "JOINT_SPEED_LIMITS", "MotionReport", "validate_motion"]

AT_STOP = 0.01
"""A joint this close [rad] to an end of its range counts as at its stop (:attr:`MotionReport.at_stop_fraction`)."""

JOINT_SPEED_LIMITS: np.ndarray = NOMINAL_SPEEDS
"""(29,) [rad/s]: nominal joint speeds of the G1 actuators (:data:`bcg.robots.g1.NOMINAL_SPEEDS`), against which a
reference motion's joint rates are reported."""


@dataclass(frozen=True)
class MotionReport:
    """Kinematic validation numbers of a motion (see :func:`validate_motion`)."""

    name: str
    num_frames: int
    duration: float
    dt: float
    joint_limit_violations: int
    """Number of (frame, joint) values outside the MJCF range by more than 1e-6 rad (none allowed)."""
    max_joint_limit_excess: float
    """Largest excess over a joint range [rad] (0 when inside)."""
    at_stop_fraction: float
    """Fraction of frames in which some joint is within :data:`AT_STOP` of an end of its range (a clip held at a stop;
    ``bcg train --reference-joint-margin`` keeps the reference off it)."""
    at_stop_joint: str
    """The joint most often at a stop, and :attr:`at_stop_joint_fraction` the fraction of frames it is."""
    at_stop_joint_fraction: float
    max_stance_slide: float
    """Largest horizontal drift of a contact sphere over one contiguous contact interval [m] (allowed < 0.02)."""
    num_stances: int
    """Number of contact intervals (per foot: contiguous frames with at least one sphere in contact)."""
    max_penetration: float
    """Largest depth of a sphere's bottom below z = 0 [m] (allowed < 0.005)."""
    peak_joint_speed: float
    """Largest |joint rate| [rad/s] over the clip."""
    peak_joint_speed_name: str
    peak_speed_ratio: float
    """Largest |joint rate| / nominal actuator speed (:data:`JOINT_SPEED_LIMITS`)."""
    joints_over_speed: tuple[str, ...]
    """Joints whose peak rate exceeds the nominal actuator speed."""
    pelvis_height_min: float
    pelvis_height_max: float
    mean_horizontal_speed: float
    """Mean horizontal pelvis speed [m/s]."""
    peak_horizontal_speed: float
    yaw_travel: float
    """Total absolute change of the pelvis heading over the clip [rad]."""
    flight_fraction: float
    """Fraction of frames with neither foot in contact."""
    single_support_fraction: float
    double_support_fraction: float
    num_flight_phases: int
    contact_height: float
    """Sphere-bottom height [m] under which a sphere counts as in contact."""
    passed: bool = field(default=False)
    """No joint-limit violation, sliding < 2 cm, penetration < 5 mm."""

    def __str__(self) -> str:
        ok = "PASS" if self.passed else "FAIL"
        lines = [
            f"motion {self.name}: {self.num_frames} frames, {self.duration:.2f} s at {1 / self.dt:.0f} Hz  [{ok}]",
            f"  {'joint-limit violations':34s} {self.joint_limit_violations:d} (max excess "
            f"{self.max_joint_limit_excess:.2e} rad; none allowed)",
            f"  {'frames at a joint stop':34s} {100 * self.at_stop_fraction:.1f}% (within {AT_STOP} rad; most: "
            f"{self.at_stop_joint} {100 * self.at_stop_joint_fraction:.1f}%)",
            f"  {'stance-foot sliding, max':34s} {100 * self.max_stance_slide:.2f} cm over {self.num_stances} "
            "stances (limit 2 cm)",
            f"  {'ground penetration, max':34s} {1000 * self.max_penetration:.2f} mm (limit 5 mm)",
            f"  {'peak joint speed':34s} {self.peak_joint_speed:.2f} rad/s ({self.peak_joint_speed_name}; "
            f"{100 * self.peak_speed_ratio:.0f}% of nominal)",
            f"  {'joints over nominal speed':34s} {', '.join(self.joints_over_speed) or 'none'}",
            f"  {'pelvis height':34s} {self.pelvis_height_min:.3f} .. {self.pelvis_height_max:.3f} m",
            f"  {'horizontal pelvis speed':34s} mean {self.mean_horizontal_speed:.2f}, peak "
            f"{self.peak_horizontal_speed:.2f} m/s",
            f"  {'heading travel':34s} {math.degrees(self.yaw_travel):.0f} deg",
            f"  {'contact schedule':34s} flight {100 * self.flight_fraction:.1f}% ({self.num_flight_phases} "
            f"phases), single {100 * self.single_support_fraction:.1f}%, double "
            f"{100 * self.double_support_fraction:.1f}%",
        ]
        return "\n".join(lines)


def _segments(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open [start, end) runs of True in a 1-D boolean array."""
    m = np.concatenate([[False], mask, [False]]).astype(np.int8)
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def validate_motion(motion: Motion, contact_height: float = 0.01) -> MotionReport:
    """Kinematic plausibility report of ``motion``.

    A sphere is in contact while its bottom is below ``contact_height`` [m]; the sliding of one contact interval is
    the largest horizontal distance of the sphere centre from where the interval began.
    """
    from bcg.robots.g1 import JOINT_NAMES

    q = motion._qpos64
    rng = joint_ranges()
    excess = np.maximum(rng[:, 0] - q[:, 7:], q[:, 7:] - rng[:, 1])
    sp = motion.sphere_pos_w.detach().cpu().double().numpy()
    bottom = sp[..., 2] - motion.sphere_radius[None]
    contact = bottom < contact_height
    slide = 0.0
    for c in range(sp.shape[1]):
        for s, e in _segments(contact[:, c]):
            d = np.linalg.norm(sp[s:e, c, :2] - sp[s, c, :2], axis=-1).max()
            slide = max(slide, float(d))
    feet = motion.foot_contact(contact_height)
    stances = sum(len(_segments(feet[:, f])) for f in range(feet.shape[1]))
    n_on = feet.sum(1)
    flight = n_on == 0
    qd = finite_difference_qvel(q, motion.dt)
    speed = np.abs(qd[:, 6:]).max(0)
    ratio = speed / JOINT_SPEED_LIMITS
    j = int(np.argmax(speed))
    vxy = np.linalg.norm(qd[:, :2], axis=-1)
    yaw = np.unwrap(yaw_np(q[:, 3:7]))
    viol = int((excess > 1e-6).sum())
    at_stop = excess > -AT_STOP  # [T, 29]: within AT_STOP of an end of the range (or past it)
    worst = int(np.argmax(at_stop.mean(0)))
    pen = float(max(0.0, -bottom.min()))
    passed = viol == 0 and slide < 0.02 and pen < 0.005
    return MotionReport(
        name=motion.name, num_frames=motion.num_frames, duration=motion.duration, dt=motion.dt,
        joint_limit_violations=viol, max_joint_limit_excess=float(max(0.0, excess.max())),
        at_stop_fraction=float(at_stop.any(1).mean()), at_stop_joint=JOINT_NAMES[worst],
        at_stop_joint_fraction=float(at_stop[:, worst].mean()),
        max_stance_slide=slide, num_stances=stances, max_penetration=pen,
        peak_joint_speed=float(speed[j]), peak_joint_speed_name=JOINT_NAMES[j],
        peak_speed_ratio=float(ratio.max()),
        joints_over_speed=tuple(JOINT_NAMES[i] for i in np.flatnonzero(ratio > 1.0)),
        pelvis_height_min=float(q[:, 2].min()), pelvis_height_max=float(q[:, 2].max()),
        mean_horizontal_speed=float(vxy.mean()), peak_horizontal_speed=float(vxy.max()),
        yaw_travel=float(np.abs(np.diff(yaw)).sum()),
        flight_fraction=float(flight.mean()), single_support_fraction=float((n_on == 1).mean()),
        double_support_fraction=float((n_on >= 2).mean()), num_flight_phases=len(_segments(flight)),
        contact_height=contact_height, passed=passed,
    )
