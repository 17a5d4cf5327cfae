"""Bad input gets a clear error."""

from __future__ import annotations

import pytest
import torch

from bcg.robots import g1
from bcg.sim import ContactParams, UnsupportedModelError, load_model, model_from_mujoco, step
from bcg.sim import bias_forces as bcg_bias_forces
from bcg.sim import mass_matrix as bcg_mass_matrix


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
    with pytest.raises(ValueError, match="limit_guard_window must be a finite value >= 0"):
        ContactParams(limit_guard_window=-1.0)
    with pytest.raises(ValueError, match="limit_guard_width must be a finite value > 0"):
        ContactParams(limit_guard_width=0.0)
    with pytest.raises(ValueError, match="limit_guard_iterations must be an integer >= 1"):
        ContactParams(limit_guard_iterations=2.5)
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


def test_speeds_beyond_max_speed_are_refused_at_the_call(g1_model):
    from bcg.sim import MAX_SPEED

    q, qd, tg = _inputs(g1_model)
    fast = qd.clone()
    fast[1, 6 + 3] = 1.5 * MAX_SPEED  # one knee
    with pytest.raises(ValueError, match=r"qd has entries beyond bcg.sim.MAX_SPEED = .* environments \[1\]\): at such "
                                         r"speeds the explicitly integrated Coriolis"):
        step(g1_model, q, fast, tg)
    with pytest.raises(ValueError, match=r"largest \|qd\| = 10000"):
        step(g1_model, q, torch.full_like(qd, 1e4), tg)
    with pytest.raises(ValueError, match="MAX_SPEED"):
        step(g1_model, q, fast, tg.clone().requires_grad_(True))  # the gradient path checks the same
    at_bound = qd.clone()
    at_bound[:, 0] = MAX_SPEED  # |qd| = MAX_SPEED itself is accepted (root moving sideways in the air)
    at_bound[:, 1] = -MAX_SPEED
    step(g1_model, q, at_bound, tg)


def test_root_positions_beyond_the_float32_range_are_refused(g1_model):
    from bcg.sim.bridge import MAX_ROOT_POSITION

    q, qd, tg = _inputs(g1_model)
    for axis, value in ((0, 1e10), (1, -2 * MAX_ROOT_POSITION), (2, 1.01 * MAX_ROOT_POSITION)):
        far = q.clone()
        far[0, axis] = value
        with pytest.raises(ValueError, match=r"q has a root position beyond bcg.sim.MAX_ROOT_POSITION = 10000 m "
                                             r"\(largest \|x\|, \|y\|, \|z\| = .* environments \[0\]\)"):
            step(g1_model, far, qd, tg)
        with pytest.raises(ValueError, match="root position beyond"):
            bcg_mass_matrix(g1_model, far)
        with pytest.raises(ValueError, match="root position beyond"):
            bcg_bias_forces(g1_model, far, qd)
    inside = q.clone()
    inside[:, 0] = MAX_ROOT_POSITION
    inside[:, 1] = -MAX_ROOT_POSITION
    step(g1_model, inside, qd, tg)  # the bound itself is accepted


def test_dynamics_terms_check_their_inputs(g1_model):
    q, qd, _ = _inputs(g1_model)
    zero_quat = q.clone()
    zero_quat[1, 3:7] = 0
    with pytest.raises(ValueError, match=r"q has a root quaternion of \(near\) zero norm \(environments \[1\]\)"):
        bcg_mass_matrix(g1_model, zero_quat)
    with pytest.raises(ValueError, match="quaternion"):
        bcg_bias_forces(g1_model, zero_quat, qd)
    bad = qd.clone()
    bad[0, 2] = float("inf")
    with pytest.raises(ValueError, match=r"qd contains NaN or inf \(environments \[0\]\)"):
        bcg_bias_forces(g1_model, q, bad)
    with pytest.raises(ValueError, match=r"qd must have shape \[2, 35\]"):
        bcg_bias_forces(g1_model, q, qd[:1])
    with pytest.raises(TypeError, match="float32"):
        bcg_mass_matrix(g1_model, q.double())
    # bias_forces is one evaluation of c(q, qd), not an integration: MAX_SPEED does not apply and the result is the
    # exact quadratic growth of the velocity-product terms (only the hinges move, so gravity is unchanged)
    slow = torch.zeros_like(qd)
    slow[:, 6:] = 10.0
    grav = bcg_bias_forces(g1_model, q, torch.zeros_like(qd))
    c_slow = bcg_bias_forces(g1_model, q, slow) - grav
    c_fast = bcg_bias_forces(g1_model, q, 100.0 * slow) - grav
    assert torch.allclose(c_fast, 1e4 * c_slow, rtol=1e-3, atol=1e-5 * float(c_fast.abs().max()))


def test_empty_batch_gives_empty_results(g1_model):
    q, qd, tg = _inputs(g1_model, n=0)
    nc = g1_model.nc
    with torch.no_grad():
        q1, qd1, rep = step(g1_model, q, qd, tg)
    assert q1.shape == (0, g1_model.nq) and qd1.shape == (0, g1_model.nv)
    assert rep.impulse.shape == rep.peak_force.shape == rep.penetration.shape == (0, nc)
    assert q1.dtype == qd1.dtype == rep.impulse.dtype == torch.float32
    tg = tg.clone().requires_grad_(True)
    q1, qd1, rep = step(g1_model, q, qd, tg)
    assert q1.shape == (0, g1_model.nq) and rep.impulse.shape == (0, nc) and rep.impulse.requires_grad
    (q1.sum() + qd1.sum() + rep.impulse.sum()).backward()
    assert tg.grad is not None and tg.grad.shape == (0, g1_model.nu)
    assert bcg_mass_matrix(g1_model, q).shape == (0, g1_model.nv, g1_model.nv)
    assert bcg_bias_forces(g1_model, q, qd).shape == (0, g1_model.nv)
    with pytest.raises(ValueError, match=r"qd must have shape \[0, 35\]"):
        step(g1_model, q, torch.zeros(1, g1_model.nv), tg)
