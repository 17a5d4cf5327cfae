"""Tests of the G1 robot model package ``bcg.robots.g1``: MJCF structure, inertias, gains, contact
geometry, standing under PD in MuJoCo and agreement with the Menagerie reference kinematics."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import mujoco
import numpy as np
import pytest

import bcg.robots.g1 as g1
from bcg.robots.g1 import make_mjcf

SHARED_G1 = Path(__file__).resolve().parents[2] / "shared" / "robots" / "g1"

# docs/method.md §9.1 joint order (hinges after the free joint), written out independently of the package.
METHOD_JOINT_ORDER = [
    f"{n}_joint"
    for n in (
        "left_hip_pitch left_hip_roll left_hip_yaw left_knee left_ankle_pitch left_ankle_roll "
        "right_hip_pitch right_hip_roll right_hip_yaw right_knee right_ankle_pitch right_ankle_roll "
        "waist_yaw waist_roll waist_pitch "
        "left_shoulder_pitch left_shoulder_roll left_shoulder_yaw left_elbow left_wrist_roll "
        "left_wrist_pitch left_wrist_yaw "
        "right_shoulder_pitch right_shoulder_roll right_shoulder_yaw right_elbow right_wrist_roll "
        "right_wrist_pitch right_wrist_yaw"
    ).split()
]

_ARM = ("shoulder_pitch", "shoulder_roll", "shoulder_yaw", "elbow", "wrist_roll", "wrist_pitch", "wrist_yaw")
# MuJoCo's depth-first body order.
BODY_ORDER = (
    ["world", "pelvis"]
    + [f"left_{n}_link" for n in ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll")]
    + [f"right_{n}_link" for n in ("hip_pitch", "hip_roll", "hip_yaw", "knee", "ankle_pitch", "ankle_roll")]
    + ["waist_yaw_link", "waist_roll_link", "torso_link"]
    + [f"left_{n}_link" for n in _ARM]
    + [f"right_{n}_link" for n in _ARM]
)

# Reference rows of g1_kinematics.md section 3 / 4: mass [kg], COM [m], principal inertia [kg m^2], iquat.
REFERENCE_BODIES = {
    "pelvis": (3.813, (0, 0, -0.07605), (0.010549, 0.0093089, 0.0079184), (1, 0, -0.000399148, 0)),
    "torso_link": (
        7.818,
        (0.00203158, 0.000339683, 0.184568),
        (0.121847, 0.109825, 0.0273735),
        (0.999803, -6.03319e-05, 0.0198256, 0.00131986),
    ),
    "left_ankle_pitch_link": (
        0.074,
        (-0.007269, 0, 0.011137),
        (1.89e-05, 1.40805e-05, 6.9195e-06),
        (0.603053, 0.369225, 0.369225, 0.603053),
    ),
    "right_knee_link": (
        1.932,
        (0.005457, -0.003964, -0.12074),
        (0.011374, 0.0112843, 0.00146452),
        (0.923439, 0.0345276, 0.0116333, -0.382012),
    ),
    "left_wrist_yaw_link": (
        0.254576,
        (0.0708244, 0.000191745, 0.00161742),
        (0.000646113, 0.000559993, 0.000147566),
        (0.510571, 0.526295, 0.468078, 0.493188),
    ),
    "waist_roll_link": (0.086, (0, 2.3e-05, 0), (8.245e-06, 7.079e-06, 6.339e-06), (0.5, 0.5, -0.5, 0.5)),
}

# Reference body placements (pos in parent, quat w x y z).
REFERENCE_PLACEMENTS = {
    "left_hip_roll_link": ((0, 0.052, -0.030465), (0.996179, 0, -0.0873386, 0)),
    "left_ankle_pitch_link": ((0, -9.4445e-05, -0.30001), (1, 0, 0, 0)),
    "right_shoulder_pitch_link": (
        (0.0039563, -0.10021, 0.24778),
        (0.990264, -0.139201, 1.38722e-05, 9.86868e-05),
    ),
    "left_wrist_roll_link": ((0.1, 0.00188791, -0.01), (1, 0, 0, 0)),
}

# joint: (axis, range [rad], torque limit [N m], armature [kg m^2])
REFERENCE_JOINTS = {
    "left_hip_pitch_joint": ((0, 1, 0), (-2.5307, 2.8798), 88, 0.01017752),
    "right_hip_roll_joint": ((1, 0, 0), (-2.9671, 0.5236), 139, 0.025101925),
    "left_knee_joint": ((0, 1, 0), (-0.087267, 2.8798), 139, 0.025101925),
    "right_ankle_roll_joint": ((1, 0, 0), (-0.2618, 0.2618), 50, 0.00721945),
    "waist_yaw_joint": ((0, 0, 1), (-2.618, 2.618), 88, 0.01017752),
    "waist_pitch_joint": ((0, 1, 0), (-0.52, 0.52), 50, 0.00721945),
    "left_shoulder_roll_joint": ((1, 0, 0), (-1.5882, 2.2515), 25, 0.003609725),
    "right_shoulder_roll_joint": ((1, 0, 0), (-2.2515, 1.5882), 25, 0.003609725),
    "left_elbow_joint": ((0, 1, 0), (-1.0472, 2.0944), 25, 0.003609725),
    "right_wrist_pitch_joint": ((0, 1, 0), (-1.61443, 1.61443), 5, 0.00425),
    "left_wrist_yaw_joint": ((0, 0, 1), (-1.61443, 1.61443), 5, 0.00425),
}

TORQUE_LIMITS_METHOD_9_1 = [88, 139, 88, 139, 50, 50] * 2 + [88, 50, 50] + [25, 25, 25, 25, 25, 5, 5] * 2


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return g1.load_mujoco_model()


@pytest.fixture(scope="module")
def scene() -> mujoco.MjModel:
    return g1.load_mujoco_model(scene=True)


def _name(m: mujoco.MjModel, obj: mujoco.mjtObj, i: int) -> str:
    return mujoco.mj_id2name(m, obj, i)


def _sphere_ids(m: mujoco.MjModel) -> list[int]:
    names = [f"{side}_foot_sphere_{k}" for side in ("left", "right") for k in range(4)]
    return [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n) for n in names]


def test_paths_and_import_is_cheap() -> None:
    assert g1.MJCF_PATH.is_absolute() and g1.MJCF_PATH.is_file()
    assert g1.SCENE_PATH.is_absolute() and g1.SCENE_PATH.is_file()
    assert (g1.MJCF_PATH.parent / "LICENSE").is_file()
    code = "import sys, bcg.robots.g1; assert 'mujoco' not in sys.modules and 'warp' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_constant_shapes() -> None:
    for arr in (g1.DEFAULT_JOINT_POS, g1.KP, g1.KD, g1.TORQUE_LIMITS, g1.ARMATURE):
        assert arr.shape == (29,) and arr.dtype == np.float64
        assert not arr.flags.writeable
    assert len(g1.JOINT_NAMES) == 29 and len(set(g1.JOINT_NAMES)) == 29
    q = g1.default_qpos()
    assert q.shape == (36,) and q.dtype == np.float64
    np.testing.assert_array_equal(q[:7], [0, 0, g1.DEFAULT_BASE_HEIGHT, 1, 0, 0, 0])
    np.testing.assert_array_equal(q[7:], g1.DEFAULT_JOINT_POS)
    q[0] = 5.0  # a fresh array every call
    assert g1.default_qpos()[0] == 0.0


def test_compiles_with_expected_sizes(model: mujoco.MjModel, scene: mujoco.MjModel) -> None:
    for m in (model, scene):
        assert (m.nq, m.nv, m.nu) == (36, 35, 29)
        assert m.nbody == 31  # world + 30 moving bodies
        assert m.njnt == 30
        assert m.opt.timestep == pytest.approx(0.005)
        assert m.opt.integrator == mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    assert [_name(model, mujoco.mjtObj.mjOBJ_BODY, i) for i in range(model.nbody)] == BODY_ORDER
    assert model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    assert _name(model, mujoco.mjtObj.mjOBJ_JOINT, 0) == "floating_base_joint"
    assert model.nmesh == 0


def test_joint_order(model: mujoco.MjModel) -> None:
    names = [_name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(1, model.njnt)]
    assert names == list(g1.JOINT_NAMES) == METHOD_JOINT_ORDER
    np.testing.assert_array_equal(model.jnt_qposadr[1:], np.arange(7, 36))
    np.testing.assert_array_equal(model.jnt_dofadr[1:], np.arange(6, 35))
    for j in range(1, model.njnt):  # X_joint moves X_link (waist pitch moves the torso)
        body = _name(model, mujoco.mjtObj.mjOBJ_BODY, model.jnt_bodyid[j])
        expected = names[j - 1].replace("_joint", "_link")
        assert body == ("torso_link" if expected == "waist_pitch_link" else expected)
    actuated = [_name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[a, 0]) for a in range(model.nu)]
    assert actuated == list(g1.JOINT_NAMES)


def test_total_mass(model: mujoco.MjModel) -> None:
    assert model.body_mass.sum() == pytest.approx(33.3411, abs=1e-3)
    assert g1.TOTAL_MASS == pytest.approx(model.body_mass.sum(), abs=1e-3)
    assert mujoco.mj_getTotalmass(model) == pytest.approx(33.3411, abs=1e-3)


@pytest.mark.parametrize("body", sorted(REFERENCE_BODIES))
def test_body_inertials(model: mujoco.MjModel, body: str) -> None:
    mass, com, inertia, iquat = REFERENCE_BODIES[body]
    b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
    assert model.body_mass[b] == pytest.approx(mass, rel=1e-9)
    np.testing.assert_allclose(model.body_ipos[b], com, atol=1e-12)

    # compare the full body-frame inertia R diag(I) R^T (independent of principal-axis ordering)
    def full(diag, quat) -> np.ndarray:
        r = np.zeros(9)
        q = np.asarray(quat, float)
        mujoco.mju_quat2Mat(r, q / np.linalg.norm(q))
        r = r.reshape(3, 3)
        return r @ np.diag(diag) @ r.T

    np.testing.assert_allclose(
        full(model.body_inertia[b], model.body_iquat[b]), full(inertia, iquat), atol=1e-12, rtol=1e-7
    )


@pytest.mark.parametrize("body", sorted(REFERENCE_PLACEMENTS))
def test_body_placements(model: mujoco.MjModel, body: str) -> None:
    pos, quat = REFERENCE_PLACEMENTS[body]
    b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body)
    np.testing.assert_allclose(model.body_pos[b], pos, atol=1e-12)
    q = np.asarray(quat, float)
    np.testing.assert_allclose(model.body_quat[b], q / np.linalg.norm(q), atol=1e-12)


def test_joint_axes_ranges_limits_armature(model: mujoco.MjModel) -> None:
    for name, (axis, rng, tau, armature) in REFERENCE_JOINTS.items():
        j = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        np.testing.assert_array_equal(model.jnt_axis[j], axis)
        np.testing.assert_allclose(model.jnt_range[j], rng, atol=1e-12)
        assert model.jnt_limited[j]
        np.testing.assert_allclose(model.jnt_actfrcrange[j], (-tau, tau))
        assert model.dof_armature[model.jnt_dofadr[j]] == pytest.approx(armature, rel=1e-9)
    np.testing.assert_array_equal(g1.TORQUE_LIMITS, TORQUE_LIMITS_METHOD_9_1)
    np.testing.assert_array_equal(model.jnt_actfrcrange[1:, 1], g1.TORQUE_LIMITS)
    np.testing.assert_array_equal(model.jnt_actfrcrange[1:, 0], -g1.TORQUE_LIMITS)
    assert model.jnt_actfrclimited[1:].all()
    np.testing.assert_array_equal(model.dof_armature[6:], g1.ARMATURE)
    np.testing.assert_array_equal(model.dof_armature[:6], 0.0)
    np.testing.assert_array_equal(model.dof_damping[6:], g1.JOINT_DAMPING)
    np.testing.assert_array_equal(model.dof_frictionloss, 0.0)
    # the default pose lies inside the joint ranges
    assert np.all(g1.DEFAULT_JOINT_POS >= model.jnt_range[1:, 0])
    assert np.all(g1.DEFAULT_JOINT_POS <= model.jnt_range[1:, 1])


def test_actuators_are_the_default_pd(model: mujoco.MjModel) -> None:
    assert np.all(model.actuator_trntype == mujoco.mjtTrn.mjTRN_JOINT)
    np.testing.assert_array_equal(model.actuator_gear[:, 0], 1.0)
    np.testing.assert_array_equal(model.actuator_gainprm[:, 0], g1.KP)
    np.testing.assert_array_equal(model.actuator_biasprm[:, 0], 0.0)
    np.testing.assert_array_equal(model.actuator_biasprm[:, 1], -g1.KP)
    np.testing.assert_array_equal(model.actuator_biasprm[:, 2], -g1.KD)
    assert model.actuator_forcelimited.all()
    np.testing.assert_array_equal(model.actuator_forcerange[:, 1], g1.TORQUE_LIMITS)
    np.testing.assert_array_equal(model.actuator_forcerange[:, 0], -g1.TORQUE_LIMITS)
    assert not model.actuator_ctrllimited.any()  # targets are not clipped, torques are
    assert np.all(g1.KP > 0) and np.all(g1.KD > 0)
    legs_and_waist = slice(0, 15)
    np.testing.assert_array_equal(g1.KP[legs_and_waist], 200.0)
    np.testing.assert_array_equal(g1.KD[legs_and_waist], 5.0)


def test_only_foot_spheres_collide(model: mujoco.MjModel, scene: mujoco.MjModel) -> None:
    ids = _sphere_ids(model)
    assert -1 not in ids
    colliding = [i for i in range(model.ngeom) if model.geom_contype[i] or model.geom_conaffinity[i]]
    assert sorted(colliding) == sorted(ids)
    for i in ids:
        assert model.geom_type[i] == mujoco.mjtGeom.mjGEOM_SPHERE
        assert model.geom_condim[i] == 3
        assert model.geom_friction[i, 0] == pytest.approx(0.8)
    # the visual geoms are massless decoration: every body has visual geometry of its own
    visual_bodies = {int(model.geom_bodyid[i]) for i in range(model.ngeom) if i not in ids}
    assert visual_bodies == set(range(1, model.nbody))
    # in the scene: the floor plus the 8 spheres, no robot self-contacts
    floor = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_GEOM, "floor")
    assert scene.geom_type[floor] == mujoco.mjtGeom.mjGEOM_PLANE
    assert scene.geom_friction[floor, 0] == pytest.approx(0.8)
    assert scene.geom_pos[floor, 2] == 0.0


def test_foot_spheres_match_constants(model: mujoco.MjModel) -> None:
    assert len(g1.FOOT_SPHERES) == 8
    assert [s.body for s in g1.FOOT_SPHERES] == ["left_ankle_roll_link"] * 4 + ["right_ankle_roll_link"] * 4
    expected_xy = [(-0.05, 0.025), (-0.05, -0.025), (0.12, 0.03), (0.12, -0.03)] * 2
    for i, s, xy in zip(_sphere_ids(model), g1.FOOT_SPHERES, expected_xy, strict=True):
        assert _name(model, mujoco.mjtObj.mjOBJ_BODY, model.geom_bodyid[i]) == s.body
        np.testing.assert_allclose(model.geom_pos[i], s.pos, atol=1e-12)
        np.testing.assert_allclose(s.pos, (*xy, -0.03))
        assert model.geom_size[i, 0] == s.radius == 0.005
    with pytest.raises(AttributeError):
        g1.FOOT_SPHERES[0].radius = 1.0  # frozen


def test_key_bodies(model: mujoco.MjModel) -> None:
    names = ["left_ankle", "right_ankle", "head", "left_wrist", "right_wrist"]
    assert [k.name for k in g1.KEY_BODIES] == names
    for k in g1.KEY_BODIES:
        assert mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, k.body) >= 0
    head = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "head")
    assert _name(model, mujoco.mjtObj.mjOBJ_BODY, model.site_bodyid[head]) == "torso_link"
    np.testing.assert_allclose(model.site_pos[head], (0, 0, 0.43))


def test_default_qpos_feet_touch_ground(scene: mujoco.MjModel) -> None:
    data = mujoco.MjData(scene)
    data.qpos[:] = g1.default_qpos()
    mujoco.mj_kinematics(scene, data)
    ids = _sphere_ids(scene)
    bottoms = data.geom_xpos[ids, 2] - scene.geom_size[ids, 0]
    assert abs(bottoms.min()) < 1e-3
    assert abs(bottoms.min()) < 1e-5  # DEFAULT_BASE_HEIGHT is computed to 1e-6
    # the "stand" keyframe is the default pose
    key = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_KEY, "stand")
    np.testing.assert_allclose(scene.key_qpos[key], g1.default_qpos(), atol=1e-12)
    np.testing.assert_allclose(scene.key_ctrl[key], g1.DEFAULT_JOINT_POS, atol=1e-12)


def test_generated_mjcf_is_up_to_date() -> None:
    """g1.xml is exactly what make_mjcf.py writes from the package constants."""
    assert make_mjcf.build_xml() == g1.MJCF_PATH.read_text()
    height = make_mjcf.touching_base_height(make_mjcf.build_xml())
    assert height == pytest.approx(g1.DEFAULT_BASE_HEIGHT, abs=1e-6)


def test_mujoco_stands_for_10_s(scene: mujoco.MjModel) -> None:
    data = mujoco.MjData(scene)
    data.qpos[:] = g1.default_qpos()
    data.ctrl[:] = g1.DEFAULT_JOINT_POS
    mujoco.mj_forward(scene, data)
    torso = mujoco.mj_name2id(scene, mujoco.mjtObj.mjOBJ_BODY, "torso_link")
    z0 = data.qpos[2]
    steps = round(10.0 / scene.opt.timestep)
    zs = np.empty(steps)
    for k in range(steps):
        mujoco.mj_step(scene, data)
        zs[k] = data.qpos[2]
    assert np.all(np.isfinite(data.qpos))
    assert zs.min() > 0.7
    assert np.abs(zs - z0).max() < 0.02
    assert data.xmat[torso].reshape(3, 3)[2, 2] > 0.99  # torso z axis still vertical
    assert np.linalg.norm(data.qpos[:2]) < 0.02
    # the arms are held: every joint within 0.05 rad of its target
    assert np.abs(data.qpos[7:] - g1.DEFAULT_JOINT_POS).max() < 0.05


def _load_reference() -> mujoco.MjModel:
    """Menagerie g1_mjx.xml with its mesh assets and mesh geoms stripped (they carry no mass)."""
    path = SHARED_G1 / "g1_mjx.xml"
    if not path.is_file():
        pytest.skip(f"reference model not found at {path}")
    root = ET.parse(path).getroot()
    for parent in root.iter():
        for child in list(parent):
            if child.tag == "mesh" or (child.tag == "geom" and "mesh" in child.attrib):
                parent.remove(child)
    for comp in root.iter("compiler"):
        comp.attrib.pop("meshdir", None)
    return mujoco.MjModel.from_xml_string(ET.tostring(root, encoding="unicode"))


def _full_mass_matrix(m: mujoco.MjModel, d: mujoco.MjData, out: np.ndarray) -> None:
    """Dense (nv, nv) mass matrix with armature into ``out`` (MuJoCo 4: (m, d, dst); 3.x: (m, dst, qM))."""
    if hasattr(d, "qM"):
        mujoco.mj_fullM(m, out, d.qM)
    else:
        mujoco.mj_fullM(m, d, out)


def test_agrees_with_menagerie_reference(model: mujoco.MjModel) -> None:
    ref = _load_reference()
    assert (ref.nq, ref.nv, ref.nbody) == (model.nq, model.nv, model.nbody)
    ref_ids = [mujoco.mj_name2id(ref, mujoco.mjtObj.mjOBJ_BODY, n) for n in BODY_ORDER]
    assert ref_ids == list(range(model.nbody))
    np.testing.assert_allclose(model.body_mass, ref.body_mass, rtol=1e-12)
    np.testing.assert_allclose(model.dof_armature, ref.dof_armature, rtol=1e-6)
    np.testing.assert_allclose(model.jnt_range, ref.jnt_range, atol=1e-12)
    np.testing.assert_allclose(model.jnt_actfrcrange, ref.jnt_actfrcrange, atol=1e-12)

    rng = np.random.default_rng(0)
    d, dr = mujoco.MjData(model), mujoco.MjData(ref)
    m_ours = np.zeros((model.nv, model.nv))
    m_ref = np.zeros((model.nv, model.nv))
    lo, hi = model.jnt_range[1:, 0], model.jnt_range[1:, 1]
    for _ in range(20):
        q = np.empty(model.nq)
        q[:3] = rng.uniform(-1.0, 1.0, 3)
        quat = rng.normal(size=4)
        q[3:7] = quat / np.linalg.norm(quat)
        q[7:] = rng.uniform(lo, hi)
        d.qpos[:] = q
        dr.qpos[:] = q
        mujoco.mj_forward(model, d)
        mujoco.mj_forward(ref, dr)
        np.testing.assert_allclose(d.xpos, dr.xpos, atol=1e-6)
        np.testing.assert_allclose(d.xquat, dr.xquat, atol=1e-6)
        np.testing.assert_allclose(d.xmat, dr.xmat, atol=1e-6)
        np.testing.assert_allclose(d.xipos, dr.xipos, atol=1e-6)
        _full_mass_matrix(model, d, m_ours)
        _full_mass_matrix(ref, dr, m_ref)
        np.testing.assert_allclose(m_ours, m_ref, rtol=1e-6, atol=1e-6 * np.abs(m_ref).max())
