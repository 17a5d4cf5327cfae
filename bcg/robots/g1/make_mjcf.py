"""Deterministic generator of ``g1.xml``, our primitive-geometry MJCF of the 29-DoF Unitree G1.

Usage (from the repository root)::

    python -m bcg.robots.g1.make_mjcf           # (re)write bcg/robots/g1/g1.xml
    python -m bcg.robots.g1.make_mjcf --check   # exit 1 if g1.xml differs from what would be written

The kinematic and inertial numbers below (body placement, joint axes and ranges, masses, centres of mass,
principal inertias and the orientation of the principal frames) are those of Unitree's
``g1_29dof_rev_1_0`` description as packaged in MuJoCo Menagerie ``unitree_g1`` (BSD-3-Clause, see
``LICENSE``), transcribed from the project's reference tables. Joint order, PD gains, torque limits,
armature, damping, default pose and foot spheres are imported from :mod:`bcg.robots.g1`, which is their
single source of truth. Nothing is read from outside the repository.

The generated model has no meshes: the only colliding geoms are the 8 foot spheres; all other geoms are
mass-free visual primitives (the compiler takes masses and inertias from the explicit ``<inertial>``
elements only, ``inertiafromgeom="false"``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bcg.robots.g1 import (
    ARMATURE,
    DEFAULT_BASE_HEIGHT,
    DEFAULT_JOINT_POS,
    FOOT_SPHERES,
    JOINT_DAMPING,
    JOINT_NAMES,
    KD,
    KEY_BODIES,
    KP,
    MJCF_PATH,
    NO_LOAD_SPEEDS,
    TORQUE_LIMITS,
)

Vec3 = tuple[float, float, float]
Quat = tuple[float, float, float, float]


@dataclass(frozen=True)
class _Link:
    """One body of the tree, with the joint that moves it (all lengths in m, masses in kg).

    ``pos``/``quat`` (w, x, y, z) place the body in its parent; ``com`` is the centre of mass in the body
    frame; ``inertia`` the principal moments [kg m^2] in the principal frame whose orientation relative to
    the body frame is ``iquat`` (w, x, y, z). Hinge joints sit at the body origin.
    """

    body: str
    parent: str
    joint: str
    axis: str
    range: tuple[float, float] | None
    pos: Vec3
    quat: Quat
    mass: float
    com: Vec3
    inertia: Vec3
    iquat: Quat


# Depth-first order of MuJoCo's compiled Menagerie model: pelvis, left leg, right leg, waist, left arm,
# right arm. Note the mirrored hip-roll and shoulder-roll ranges, the right shoulder at y = -0.10021 and the
# slightly different right-knee principal inertia: they are in the source description.
# fmt: off
_LINKS: tuple[_Link, ...] = (
    _Link("pelvis", "world", "floating_base_joint", "free", None, (0, 0, 0.793), (1, 0, 0, 0), 3.813, (0, 0, -0.07605), (0.010549, 0.0093089, 0.0079184), (1, 0, -0.000399148, 0)),  # noqa: E501
    _Link("left_hip_pitch_link", "pelvis", "left_hip_pitch_joint", "y", (-2.5307, 2.8798), (0, 0.064452, -0.1027), (1, 0, 0, 0), 1.35, (0.002741, 0.047791, -0.02606), (0.00181517, 0.00153422, 0.00116212), (0.954862, 0.293964, 0.0302556, 0.030122)),  # noqa: E501
    _Link("left_hip_roll_link", "left_hip_pitch_link", "left_hip_roll_joint", "x", (-0.5236, 2.9671), (0, 0.052, -0.030465), (0.996179, 0, -0.0873386, 0), 1.52, (0.029812, -0.001045, -0.087934), (0.00254986, 0.00241169, 0.00148755), (0.977808, -1.97119e-05, 0.205576, -0.0403793)),  # noqa: E501
    _Link("left_hip_yaw_link", "left_hip_roll_link", "left_hip_yaw_joint", "z", (-2.7576, 2.7576), (0.025001, 0, -0.12412), (1, 0, 0, 0), 1.702, (-0.057709, -0.010981, -0.15078), (0.00776166, 0.00717575, 0.00160139), (0.600598, 0.15832, 0.223482, 0.751181)),  # noqa: E501
    _Link("left_knee_link", "left_hip_yaw_link", "left_knee_joint", "y", (-0.087267, 2.8798), (-0.078273, 0.0021489, -0.17734), (0.996179, 0, 0.0873386, 0), 1.932, (0.005457, 0.003964, -0.12074), (0.0113804, 0.0112778, 0.00146458), (0.923418, -0.0327699, 0.0158246, 0.382067)),  # noqa: E501
    _Link("left_ankle_pitch_link", "left_knee_link", "left_ankle_pitch_joint", "y", (-0.87267, 0.5236), (0, -9.4445e-05, -0.30001), (1, 0, 0, 0), 0.074, (-0.007269, 0, 0.011137), (1.89e-05, 1.40805e-05, 6.9195e-06), (0.603053, 0.369225, 0.369225, 0.603053)),  # noqa: E501
    _Link("left_ankle_roll_link", "left_ankle_pitch_link", "left_ankle_roll_joint", "x", (-0.2618, 0.2618), (0, 0, -0.017558), (1, 0, 0, 0), 0.608, (0.026505, 0, -0.016425), (0.00167218, 0.0016161, 0.000217621), (-0.000481092, 0.728482, -0.000618967, 0.685065)),  # noqa: E501
    _Link("right_hip_pitch_link", "pelvis", "right_hip_pitch_joint", "y", (-2.5307, 2.8798), (0, -0.064452, -0.1027), (1, 0, 0, 0), 1.35, (0.002741, -0.047791, -0.02606), (0.00181517, 0.00153422, 0.00116212), (0.954862, -0.293964, 0.0302556, -0.030122)),  # noqa: E501
    _Link("right_hip_roll_link", "right_hip_pitch_link", "right_hip_roll_joint", "x", (-2.9671, 0.5236), (0, -0.052, -0.030465), (0.996179, 0, -0.0873386, 0), 1.52, (0.029812, 0.001045, -0.087934), (0.00254986, 0.00241169, 0.00148755), (0.977808, 1.97119e-05, 0.205576, 0.0403793)),  # noqa: E501
    _Link("right_hip_yaw_link", "right_hip_roll_link", "right_hip_yaw_joint", "z", (-2.7576, 2.7576), (0.025001, 0, -0.12412), (1, 0, 0, 0), 1.702, (-0.057709, 0.010981, -0.15078), (0.00776166, 0.00717575, 0.00160139), (0.751181, 0.223482, 0.15832, 0.600598)),  # noqa: E501
    _Link("right_knee_link", "right_hip_yaw_link", "right_knee_joint", "y", (-0.087267, 2.8798), (-0.078273, -0.0021489, -0.17734), (0.996179, 0, 0.0873386, 0), 1.932, (0.005457, -0.003964, -0.12074), (0.011374, 0.0112843, 0.00146452), (0.923439, 0.0345276, 0.0116333, -0.382012)),  # noqa: E501
    _Link("right_ankle_pitch_link", "right_knee_link", "right_ankle_pitch_joint", "y", (-0.87267, 0.5236), (0, 9.4445e-05, -0.30001), (1, 0, 0, 0), 0.074, (-0.007269, 0, 0.011137), (1.89e-05, 1.40805e-05, 6.9195e-06), (0.603053, 0.369225, 0.369225, 0.603053)),  # noqa: E501
    _Link("right_ankle_roll_link", "right_ankle_pitch_link", "right_ankle_roll_joint", "x", (-0.2618, 0.2618), (0, 0, -0.017558), (1, 0, 0, 0), 0.608, (0.026505, 0, -0.016425), (0.00167218, 0.0016161, 0.000217621), (0.000481092, 0.728482, 0.000618967, 0.685065)),  # noqa: E501
    _Link("waist_yaw_link", "pelvis", "waist_yaw_joint", "z", (-2.618, 2.618), (0, 0, 0), (1, 0, 0, 0), 0.214, (0.003494, 0.000233, 0.018034), (0.000163531, 0.000107714, 0.000102205), (0.289697, 0.591001, -0.337795, 0.672821)),  # noqa: E501
    _Link("waist_roll_link", "waist_yaw_link", "waist_roll_joint", "x", (-0.52, 0.52), (-0.0039635, 0, 0.044), (1, 0, 0, 0), 0.086, (0, 2.3e-05, 0), (8.245e-06, 7.079e-06, 6.339e-06), (0.5, 0.5, -0.5, 0.5)),  # noqa: E501
    _Link("torso_link", "waist_roll_link", "waist_pitch_joint", "y", (-0.52, 0.52), (0, 0, 0), (1, 0, 0, 0), 7.818, (0.00203158, 0.000339683, 0.184568), (0.121847, 0.109825, 0.0273735), (0.999803, -6.03319e-05, 0.0198256, 0.00131986)),  # noqa: E501
    _Link("left_shoulder_pitch_link", "torso_link", "left_shoulder_pitch_joint", "y", (-3.0892, 2.6704), (0.0039563, 0.10022, 0.24778), (0.990264, 0.139201, 1.38722e-05, -9.86868e-05), 0.718, (0, 0.035892, -0.011628), (0.000465864, 0.000432842, 0.000406394), (0.654152, 0.0130458, -0.326267, 0.68225)),  # noqa: E501
    _Link("left_shoulder_roll_link", "left_shoulder_pitch_link", "left_shoulder_roll_joint", "x", (-1.5882, 2.2515), (0, 0.038, -0.013831), (0.990268, -0.139172, 0, 0), 0.643, (-0.000227, 0.00727, -0.063243), (0.000691311, 0.000618011, 0.000388977), (0.701256, -0.0196223, -0.00710317, 0.712604)),  # noqa: E501
    _Link("left_shoulder_yaw_link", "left_shoulder_roll_link", "left_shoulder_yaw_joint", "z", (-2.618, 2.618), (0, 0.00624, -0.1032), (1, 0, 0, 0), 0.734, (0.010773, -0.002949, -0.072009), (0.00106187, 0.00103217, 0.000400661), (0.716879, -0.0964829, -0.0679942, 0.687134)),  # noqa: E501
    _Link("left_elbow_link", "left_shoulder_yaw_link", "left_elbow_joint", "y", (-1.0472, 2.0944), (0.015783, 0, -0.080518), (1, 0, 0, 0), 0.6, (0.064956, 0.004454, -0.010062), (0.000443035, 0.000421612, 0.000259353), (0.541765, 0.636132, 0.388821, 0.388129)),  # noqa: E501
    _Link("left_wrist_roll_link", "left_elbow_link", "left_wrist_roll_joint", "x", (-1.97222, 1.97222), (0.1, 0.00188791, -0.01), (1, 0, 0, 0), 0.085445, (0.0171394, 0.000537591, 4.8864e-07), (5.48211e-05, 4.96646e-05, 3.57798e-05), (0.575338, 0.411667, -0.574906, 0.411094)),  # noqa: E501
    _Link("left_wrist_pitch_link", "left_wrist_roll_link", "left_wrist_pitch_joint", "y", (-1.61443, 1.61443), (0.038, 0, 0), (1, 0, 0, 0), 0.48405, (0.0229999, -0.00111685, -0.00111658), (0.000430353, 0.000429873, 0.000164648), (0.249998, 0.661363, 0.293036, 0.643608)),  # noqa: E501
    _Link("left_wrist_yaw_link", "left_wrist_pitch_link", "left_wrist_yaw_joint", "z", (-1.61443, 1.61443), (0.046, 0, 0), (1, 0, 0, 0), 0.254576, (0.0708244, 0.000191745, 0.00161742), (0.000646113, 0.000559993, 0.000147566), (0.510571, 0.526295, 0.468078, 0.493188)),  # noqa: E501
    _Link("right_shoulder_pitch_link", "torso_link", "right_shoulder_pitch_joint", "y", (-3.0892, 2.6704), (0.0039563, -0.10021, 0.24778), (0.990264, -0.139201, 1.38722e-05, 9.86868e-05), 0.718, (0, -0.035892, -0.011628), (0.000465864, 0.000432842, 0.000406394), (0.68225, -0.326267, 0.0130458, 0.654152)),  # noqa: E501
    _Link("right_shoulder_roll_link", "right_shoulder_pitch_link", "right_shoulder_roll_joint", "x", (-2.2515, 1.5882), (0, -0.038, -0.013831), (0.990268, 0.139172, 0, 0), 0.643, (-0.000227, -0.00727, -0.063243), (0.000691311, 0.000618011, 0.000388977), (0.712604, -0.00710317, -0.0196223, 0.701256)),  # noqa: E501
    _Link("right_shoulder_yaw_link", "right_shoulder_roll_link", "right_shoulder_yaw_joint", "z", (-2.618, 2.618), (0, -0.00624, -0.1032), (1, 0, 0, 0), 0.734, (0.010773, 0.002949, -0.072009), (0.00106187, 0.00103217, 0.000400661), (0.687134, -0.0679942, -0.0964829, 0.716879)),  # noqa: E501
    _Link("right_elbow_link", "right_shoulder_yaw_link", "right_elbow_joint", "y", (-1.0472, 2.0944), (0.015783, 0, -0.080518), (1, 0, 0, 0), 0.6, (0.064956, -0.004454, -0.010062), (0.000443035, 0.000421612, 0.000259353), (0.388129, 0.388821, 0.636132, 0.541765)),  # noqa: E501
    _Link("right_wrist_roll_link", "right_elbow_link", "right_wrist_roll_joint", "x", (-1.97222, 1.97222), (0.1, -0.00188791, -0.01), (1, 0, 0, 0), 0.085445, (0.0171394, -0.000537591, 4.8864e-07), (5.48211e-05, 4.96646e-05, 3.57798e-05), (0.411667, 0.575338, -0.411094, 0.574906)),  # noqa: E501
    _Link("right_wrist_pitch_link", "right_wrist_roll_link", "right_wrist_pitch_joint", "y", (-1.61443, 1.61443), (0.038, 0, 0), (1, 0, 0, 0), 0.48405, (0.0229999, 0.00111685, -0.00111658), (0.000430353, 0.000429873, 0.000164648), (0.643608, 0.293036, 0.661363, 0.249998)),  # noqa: E501
    _Link("right_wrist_yaw_link", "right_wrist_pitch_link", "right_wrist_yaw_joint", "z", (-1.61443, 1.61443), (0.046, 0, 0), (1, 0, 0, 0), 0.254576, (0.0708244, -0.000191745, 0.00161742), (0.000646113, 0.000559993, 0.000147566), (0.493188, 0.468078, 0.526295, 0.510571)),  # noqa: E501
)
# fmt: on

_AXES: dict[str, Vec3] = {"x": (1, 0, 0), "y": (0, 1, 0), "z": (0, 0, 1)}

# Mass-free visual primitives per body, in the body frame: (type, size, placement, material) where
# placement is either ("fromto", (x1, y1, z1, x2, y2, z2)) or ("pos", (x, y, z)). Mirror y for the right
# side with `_mirror`.
_Visual = tuple[str, tuple[float, ...], str, tuple[float, ...], str]

_LEFT_VISUALS: dict[str, tuple[_Visual, ...]] = {
    "hip_pitch_link": (("capsule", (0.045,), "fromto", (0, 0, 0, 0, 0.052, -0.03), "dark"),),
    "hip_roll_link": (("capsule", (0.05,), "fromto", (0, 0, 0, 0.025, 0, -0.124), "light"),),
    "hip_yaw_link": (("capsule", (0.055,), "fromto", (0, 0, -0.03, -0.078, 0.002, -0.177), "light"),),
    "knee_link": (("capsule", (0.042,), "fromto", (0, 0, -0.02, 0, 0, -0.27), "light"),),
    "ankle_pitch_link": (("sphere", (0.022,), "pos", (0, 0, 0), "dark"),),
    "ankle_roll_link": (("box", (0.09, 0.035, 0.011), "pos", (0.035, 0, -0.019), "dark"),),
    "shoulder_pitch_link": (("capsule", (0.035,), "fromto", (0, 0, 0, 0, 0.038, -0.014), "dark"),),
    "shoulder_roll_link": (("capsule", (0.035,), "fromto", (0, 0, 0, 0, 0.006, -0.1), "light"),),
    "shoulder_yaw_link": (("capsule", (0.033,), "fromto", (0, 0, 0, 0.016, 0, -0.08), "light"),),
    "elbow_link": (("capsule", (0.03,), "fromto", (0, 0, 0, 0.1, 0.002, -0.01), "light"),),
    "wrist_roll_link": (("capsule", (0.028,), "fromto", (0, 0, 0, 0.038, 0, 0), "dark"),),
    "wrist_pitch_link": (("capsule", (0.028,), "fromto", (0, 0, 0, 0.046, 0, 0), "dark"),),
    "wrist_yaw_link": (("box", (0.045, 0.018, 0.035), "pos", (0.075, 0, 0), "dark"),),
}

_CENTRE_VISUALS: dict[str, tuple[_Visual, ...]] = {
    "pelvis": (("capsule", (0.06,), "fromto", (0, -0.07, -0.08, 0, 0.07, -0.08), "dark"),),
    "waist_yaw_link": (("cylinder", (0.045, 0.02), "pos", (0, 0, 0.02), "dark"),),
    "waist_roll_link": (("sphere", (0.03,), "pos", (0, 0, 0), "dark"),),
    "torso_link": (
        ("box", (0.065, 0.095, 0.11), "pos", (0, 0, 0.19), "light"),
        ("capsule", (0.03,), "fromto", (0, 0, 0.3, 0, 0, 0.37), "dark"),
        ("sphere", (0.06,), "pos", (0, 0, 0.43), "dark"),
    ),
}


def _mirror(v: _Visual) -> _Visual:
    """Reflect a visual primitive through the sagittal (x-z) plane."""
    kind, size, key, place, material = v
    if key == "fromto":
        place = (place[0], -place[1], place[2], place[3], -place[4], place[5])
    else:
        place = (place[0], -place[1], place[2])
    return kind, size, key, place, material


def _visuals(body: str) -> tuple[_Visual, ...]:
    """Visual primitives of a body (left-side table mirrored for the right side)."""
    if body in _CENTRE_VISUALS:
        return _CENTRE_VISUALS[body]
    side, rest = body.split("_", 1)
    left = _LEFT_VISUALS[rest]
    return left if side == "left" else tuple(_mirror(v) for v in left)


def _f(x: float) -> str:
    """Shortest round-trip decimal representation of a float ('0' for zero, no trailing '.0')."""
    x = float(x)
    if x == 0.0:
        return "0"
    s = repr(x)
    return s[:-2] if s.endswith(".0") else s


def _v(xs) -> str:
    """Space-separated numbers."""
    return " ".join(_f(x) for x in xs)


_HEADER = """\
<!--
  bcg: Unitree G1, 29 DoF (rev 1.0), primitive geometry, 8 foot contact spheres.
  GENERATED by bcg/robots/g1/make_mjcf.py; do not edit by hand (edit the generator and rerun it).

  Kinematic and inertial parameters from Unitree's g1_29dof_rev_1_0 description (via MuJoCo Menagerie
  unitree_g1), Copyright (c) 2016-2023 HangZhou YuShu TECHNOLOGY CO.,LTD. ("Unitree Robotics"),
  BSD-3-Clause licence: see LICENSE in this folder.

  Units SI, angles in radians, quaternions w x y z. Joint order = bcg.robots.g1.JOINT_NAMES.
  Only the foot spheres collide (contype 1, conaffinity 0: with the floor, not with each other).
-->
"""


def build_xml(base_height: float = DEFAULT_BASE_HEIGHT) -> str:
    """Return the MJCF text of the robot.

    Args:
        base_height: pelvis height [m] written into the ``stand`` keyframe.
    """
    hinges = {name: i for i, name in enumerate(JOINT_NAMES)}
    assert [lk.joint for lk in _LINKS[1:]] == list(JOINT_NAMES), "link table out of joint order"
    spheres_by_body: dict[str, list[tuple[int, Vec3, float]]] = {}
    for i, s in enumerate(FOOT_SPHERES):
        spheres_by_body.setdefault(s.body, []).append((i % 4, s.pos, s.radius))
    key_sites = {kb.body: kb for kb in KEY_BODIES if kb.name == "head"}

    out: list[str] = [_HEADER, '<mujoco model="bcg_g1_29dof">']
    out.append('  <compiler angle="radian" autolimits="true" inertiafromgeom="false"/>')
    out.append('  <option timestep="0.005" integrator="implicitfast"/>')
    out.append("")
    out.append("  <default>")
    out.append('    <default class="g1">')
    out.append(f'      <joint damping="{_f(JOINT_DAMPING)}" frictionloss="0"/>')
    out.append('      <geom contype="0" conaffinity="0" group="2" density="0" material="light"/>')
    out.append('      <site group="5" rgba="1 0 0 1" size="0.01"/>')
    out.append('      <default class="foot_sphere">')
    out.append(
        '        <geom type="sphere" contype="1" conaffinity="0" condim="3" friction="0.8 0.005 0.0001"'
        ' group="3" material="contact"/>'
    )
    out.append("      </default>")
    out.append("    </default>")
    out.append("  </default>")
    out.append("")
    out.append("  <asset>")
    out.append('    <material name="light" rgba="0.75 0.75 0.78 1"/>')
    out.append('    <material name="dark" rgba="0.2 0.2 0.22 1"/>')
    out.append('    <material name="contact" rgba="0.9 0.2 0.2 1"/>')
    out.append("  </asset>")
    out.append("")
    out.append("  <worldbody>")

    children: dict[str, list[_Link]] = {}
    for lk in _LINKS:
        children.setdefault(lk.parent, []).append(lk)

    def emit(lk: _Link, depth: int) -> None:
        ind = "  " * depth
        attrs = f'name="{lk.body}" pos="{_v(lk.pos)}"'
        if tuple(lk.quat) != (1, 0, 0, 0):
            attrs += f' quat="{_v(lk.quat)}"'
        if lk.parent == "world":
            attrs += ' childclass="g1"'
        out.append(f"{ind}<body {attrs}>")
        out.append(
            f'{ind}  <inertial pos="{_v(lk.com)}" quat="{_v(lk.iquat)}" mass="{_f(lk.mass)}"'
            f' diaginertia="{_v(lk.inertia)}"/>'
        )
        if lk.axis == "free":
            out.append(f'{ind}  <freejoint name="{lk.joint}"/>')
        else:
            j = hinges[lk.joint]
            tau = TORQUE_LIMITS[j]
            assert lk.range is not None
            out.append(
                f'{ind}  <joint name="{lk.joint}" axis="{_v(_AXES[lk.axis])}" range="{_v(lk.range)}"'
                f' armature="{_f(ARMATURE[j])}" actuatorfrcrange="{_v((-tau, tau))}"/>'
            )
        for kind, size, key, place, material in _visuals(lk.body):
            out.append(
                f'{ind}  <geom type="{kind}" size="{_v(size)}" {key}="{_v(place)}" material="{material}"/>'
            )
        side = lk.body.split("_", 1)[0]
        for k, pos, radius in spheres_by_body.get(lk.body, []):
            out.append(
                f'{ind}  <geom name="{side}_foot_sphere_{k}" class="foot_sphere" size="{_f(radius)}"'
                f' pos="{_v(pos)}"/>'
            )
        if lk.body == "pelvis":
            out.append(f'{ind}  <site name="imu_in_pelvis" pos="0.04525 0 -0.08339"/>')
        if lk.body == "torso_link":
            out.append(f'{ind}  <site name="imu_in_torso" pos="-0.03959 -0.00224 0.14792"/>')
        if lk.body in key_sites:
            out.append(f'{ind}  <site name="head" pos="{_v(key_sites[lk.body].offset)}"/>')
        if lk.body.endswith("ankle_roll_link"):
            out.append(f'{ind}  <site name="{side}_foot" pos="0 0 0"/>')
        for child in children.get(lk.body, []):
            emit(child, depth + 1)
        out.append(f"{ind}</body>")

    for root in children["world"]:
        emit(root, 2)
    out.append("  </worldbody>")
    out.append("")
    out.append("  <actuator>")
    for j, name in enumerate(JOINT_NAMES):
        out.append(
            f'    <position name="{name}" joint="{name}" kp="{_f(KP[j])}" kv="{_f(KD[j])}"'
            f' forcelimited="true" forcerange="{_v((-TORQUE_LIMITS[j], TORQUE_LIMITS[j]))}"/>'
        )
    out.append("  </actuator>")
    out.append("")
    # MuJoCo ignores custom numerics; bcg.sim reads this one as the actuators' torque-speed envelope.
    out.append("  <custom>")
    out.append(f'    <numeric name="bcg_actuator_no_load_speed" data="{_v(NO_LOAD_SPEEDS)}"/>')
    out.append("  </custom>")
    out.append("")
    qpos = np.concatenate([[0.0, 0.0, base_height, 1.0, 0.0, 0.0, 0.0], DEFAULT_JOINT_POS])
    out.append("  <keyframe>")
    out.append(f'    <key name="stand" qpos="{_v(qpos)}"')
    out.append(f'         ctrl="{_v(DEFAULT_JOINT_POS)}"/>')
    out.append("  </keyframe>")
    out.append("</mujoco>")
    return "\n".join(out) + "\n"


def touching_base_height(xml: str) -> float:
    """Pelvis height [m] at which the lowest foot sphere touches z = 0 in DEFAULT_JOINT_POS, upright."""
    import mujoco

    model = mujoco.MjModel.from_xml_string(xml)
    data = mujoco.MjData(model)
    data.qpos[:] = 0.0
    data.qpos[3] = 1.0
    data.qpos[7:] = DEFAULT_JOINT_POS
    mujoco.mj_kinematics(model, data)
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, n) for n in _sphere_names()]
    bottoms = data.geom_xpos[ids, 2] - model.geom_size[ids, 0]
    return float(-bottoms.min())


def _sphere_names() -> list[str]:
    return [f"{s.body.split('_', 1)[0]}_foot_sphere_{i % 4}" for i, s in enumerate(FOOT_SPHERES)]


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` verify) ``g1.xml``; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the file on disk")
    parser.add_argument("--out", type=Path, default=MJCF_PATH, help="output path")
    args = parser.parse_args(argv)

    xml = build_xml()
    h = touching_base_height(xml)
    if abs(h - DEFAULT_BASE_HEIGHT) > 1e-6:
        print(
            f"DEFAULT_BASE_HEIGHT in bcg/robots/g1/__init__.py is {DEFAULT_BASE_HEIGHT}, but the feet touch"
            f" the ground at {h:.6f} m: update it and rerun.",
            file=sys.stderr,
        )
        return 1
    if args.check:
        same = args.out.exists() and args.out.read_text() == xml
        print(f"{args.out}: {'up to date' if same else 'OUT OF DATE'}")
        return 0 if same else 1
    args.out.write_text(xml)
    print(f"wrote {args.out} (stand keyframe pelvis z = {DEFAULT_BASE_HEIGHT} m)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
