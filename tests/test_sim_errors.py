"""Bad input gets a clear error."""

from __future__ import annotations

import pytest
import torch

from bcg.robots import g1
from bcg.sim import ContactParams, UnsupportedModelError, load_model, model_from_mujoco, step


def _inputs(model, n=2):
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    return q, torch.zeros(n, model.nv), torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(n, 1)


def test_wrong_shapes_dtypes_and_values(g1_model):
    q, qd, tg = _inputs(g1_model)
    with pytest.raises(ValueError, match=r"q must have shape \[N, 36\]"):
        step(g1_model, q[:, :35], qd, tg)
    with pytest.raises(ValueError, match=r"targets must have shape \[2, 29\]"):
        step(g1_model, q, qd, tg[:1])
    with pytest.raises(TypeError, match="float32"):
        step(g1_model, q.double(), qd, tg)
    with pytest.raises(TypeError, match="torch.Tensor"):
        step(g1_model, q.numpy(), qd, tg)
    bad = tg.clone()
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"targets contains NaN or inf \(environments \[1\]\)"):
        step(g1_model, q, qd, bad)
    zero_quat = q.clone()
    zero_quat[:, 3:7] = 0
    with pytest.raises(ValueError, match="quaternion"):
        step(g1_model, zero_quat, qd, tg)


def test_bad_parameters_and_devices():
    with pytest.raises(ValueError, match="kappa must be a finite value > 0"):
        ContactParams(kappa=0.0)
    with pytest.raises(ValueError, match="kappa"):
        load_model(kappa=-5.0)
    with pytest.raises(TypeError, match="unknown simulator parameter"):
        load_model(stiffness=3.0)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        load_model(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            load_model(device="cuda")
    with pytest.raises(FileNotFoundError):
        load_model("/nonexistent/robot.xml")


@pytest.mark.parametrize("joint, message", [
    ('<joint name="j" type="ball"/>', "has \\['ball'\\]"),
    ('<joint name="j" type="slide" axis="1 0 0"/>', "has \\['slide'\\]"),
    ("", "has none \\(welded\\)"),
])
def test_unsupported_joint_types_are_named(joint, message):
    import mujoco

    xml = f"""<mujoco><worldbody><body name="base"><freejoint/><geom size="0.1" mass="1"/>
      <body name="arm" pos="0 0 0.2">{joint}<geom size="0.05" mass="0.5" contype="0" conaffinity="0"/></body>
    </body></worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    with pytest.raises(UnsupportedModelError, match=f"body 'arm' must have exactly one hinge joint, {message}"):
        model_from_mujoco(m)


def test_non_sphere_collision_geom_is_rejected():
    import mujoco

    xml = """<mujoco><worldbody><body name="base"><freejoint/><geom type="box" size="0.1 0.1 0.1" mass="1"/>
      </body></worldbody></mujoco>"""
    with pytest.raises(UnsupportedModelError, match="only spheres collide"):
        model_from_mujoco(mujoco.MjModel.from_xml_string(xml))
