"""The actuator law with its torque-speed envelope (issue 7, item 2: saturated random actions).

tau = L (sat(u / L + e) - e), sat(y) = y / (1 + y^4)^(1/4), e = (qd / v0)^7, with v0 the actuator's no-load speed
(1.5x Unitree's nominal joint speed for the G1). Without the envelope, saturated random actions spun the light arm
and wrist joints to 3-6x their nominal speed, where a 5 ms step diverges (NaN-guard resets).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import warp as wp

from bcg.robots import g1
from bcg.sim import kernels as K
from bcg.sim import load_model, reference, step
from bcg.sim.model import NO_LOAD_SPEED_NUMERIC, UnsupportedModelError, model_from_mujoco

D = dict(dtype=torch.float64)


def _sat(u: torch.Tensor, lim: float) -> torch.Tensor:
    return u / (1 + (u / lim) ** 4) ** 0.25


def test_law_at_rest_is_the_smooth_saturation():
    u = torch.linspace(-400, 400, 801, **D)
    lim, v0 = torch.tensor(139.0, **D), torch.tensor(30.0, **D)
    tau, slope_u, slope_v = reference.actuator_torque(u, torch.zeros_like(u), lim, v0)
    assert torch.allclose(tau, _sat(u, 139.0), rtol=1e-15, atol=0)
    assert torch.allclose(slope_u, (1 + (u / 139.0) ** 4) ** -1.25, rtol=1e-14, atol=0)
    assert torch.equal(slope_v, torch.zeros_like(u))


def test_envelope_takes_the_driving_torque_away_near_the_no_load_speed():
    lim, v0 = torch.tensor(139.0, **D), torch.tensor(30.0, **D)
    w = torch.tensor([0.0, 0.3, 0.52, 0.72, 0.9, 1.0, 1.2], **D)
    drive, _, _ = reference.actuator_torque(torch.full_like(w, 1e4), w * v0, lim, v0)  # saturated, along qd
    brake, _, _ = reference.actuator_torque(torch.full_like(w, -1e4), w * v0, lim, v0)  # saturated, against qd
    frac = drive / lim
    # 1 - w^7 up to the saturation's own 1e-8 shortfall at u = 72 L
    assert torch.allclose(frac, 1 - w ** 7, atol=1e-6), frac
    assert 0.985 < frac[2] < 0.995 and 0.895 < frac[3] < 0.905 and abs(float(frac[5])) < 1e-6 and frac[6] < -2.5
    assert torch.all(brake / lim <= -1 + 1e-6)  # braking never loses torque
    # below saturation the PD torque passes unchanged up to 2e-4 of L at 0.52 v0
    u = torch.full_like(w, 20.0)
    small, _, _ = reference.actuator_torque(u, w * v0, lim, v0)
    assert float((small[:3] - _sat(u[:3], 139.0)).abs().max()) < 2e-4 * 139.0


def test_slopes_are_the_derivatives_of_the_law():
    gen = torch.Generator().manual_seed(0)
    u = (300 * torch.randn(200, generator=gen, **D)).requires_grad_(True)
    qd = (40 * torch.randn(200, generator=gen, **D)).requires_grad_(True)
    lim, v0 = torch.tensor(88.0, **D), torch.tensor(48.0, **D)
    tau, slope_u, slope_v = reference.actuator_torque(u, qd, lim, v0)
    du, dv = torch.autograd.grad(tau.sum(), (u, qd))
    assert torch.allclose(du, slope_u, rtol=1e-12, atol=1e-14)
    assert torch.allclose(dv, slope_v, rtol=1e-10, atol=1e-12)
    assert bool((slope_v <= 0).all())  # a damping: the implicit term -h slope_v is non-negative


@wp.kernel
def _law_kernel(u: wp.array(dtype=float), qd: wp.array(dtype=float), lim: float, v0: float,
                out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = K.actuator_torque(u[i], qd[i], lim, v0)


@wp.kernel
def _tau_kernel(u: wp.array(dtype=float), qd: wp.array(dtype=float), lim: float, v0: float,
                tau: wp.array(dtype=float)):
    i = wp.tid()
    tau[i] = K.actuator_torque(u[i], qd[i], lim, v0)[0]


def test_warp_law_and_its_adjoint_match_float64():
    """The Warp function against the float64 law, and Warp's adjoint of tau against the law's own slopes."""
    gen = np.random.default_rng(1)
    # the oracle reads the same float32-rounded inputs
    u64 = (200 * gen.standard_normal(512)).astype(np.float32).astype(np.float64)
    qd64 = (50 * gen.standard_normal(512)).astype(np.float32).astype(np.float64)
    lim, v0 = 139.0, 30.0
    tau64, su64, sv64 = (x.numpy() for x in reference.actuator_torque(
        torch.tensor(u64), torch.tensor(qd64), torch.tensor(lim, **D), torch.tensor(v0, **D)))
    u = wp.array(u64.astype(np.float32), dtype=float, requires_grad=True)
    qd = wp.array(qd64.astype(np.float32), dtype=float, requires_grad=True)
    out = wp.zeros(512, dtype=wp.vec3)
    wp.launch(_law_kernel, dim=512, inputs=[u, qd, lim, v0, out])
    got = out.numpy().astype(np.float64)
    scale = lim * (1 + np.abs(qd64 / v0) ** 7)  # tau grows like L e beyond v0
    assert np.max(np.abs(got[:, 0] - tau64) / scale) < 2e-6  # measured 5.8e-7
    assert np.max(np.abs(got[:, 1] - su64)) < 1e-6
    assert np.max(np.abs(got[:, 2] - sv64) / (scale / v0)) < 1e-5  # measured 3.4e-6
    tau = wp.zeros(512, dtype=float, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(_tau_kernel, dim=512, inputs=[u, qd, lim, v0, tau])
    tape.backward(grads={tau: wp.ones(512, dtype=float)})
    assert np.max(np.abs(u.grad.numpy() - su64)) < 2e-6  # measured 5.2e-7
    assert np.max(np.abs(qd.grad.numpy() - sv64) / (scale / v0)) < 1e-5  # measured 3.4e-6


def _spinning_start(n: int, dtype: torch.dtype, model) -> tuple[torch.Tensor, torch.Tensor]:
    """In the air, every hinge moving at 0.5-1.1 of its no-load speed (alternating signs)."""
    q = torch.tensor(g1.default_qpos(), dtype=torch.float64)
    q[2] += 3.0
    w = 0.5 + 0.6 * torch.linspace(0, 1, model.nu, dtype=torch.float64)
    sign = torch.tensor([(-1.0) ** j for j in range(model.nu)], dtype=torch.float64)
    qd = torch.zeros(model.nv, dtype=torch.float64)
    qd[6:] = sign * w * torch.as_tensor(model.actuator_speed)
    return q[None].repeat(n, 1).to(dtype), qd[None].repeat(n, 1).to(dtype)


def _loss(q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    w = torch.cos(torch.arange(q.shape[1] + qd.shape[1], dtype=q.dtype))
    return (torch.cat([q[:, 2:], 0.01 * qd], 1) * w[2:]).sum(1)


def test_gradient_through_the_envelope_matches_finite_differences(g1_model):
    """Two steps from joints at 0.5-1.1 v0 with saturating targets (the envelope's slope is largest there): the
    Warp gradient w.r.t. the targets against central differences of the float64 oracle."""
    steps = 2
    t = torch.arange(steps, dtype=torch.float64)[:, None]
    j = torch.arange(g1_model.nu, dtype=torch.float64)[None]
    targets = (torch.tensor(g1.DEFAULT_JOINT_POS, **D) + 1.5 * torch.sin(0.9 * t + 1.7 * j))[None]
    q, qd = _spinning_start(1, torch.float32, g1_model)
    w0 = float((qd[0, 6:].double().abs() / torch.as_tensor(g1_model.actuator_speed)).max())
    assert w0 > 1.0
    tg = targets.float().requires_grad_(True)
    for k in range(steps):
        q, qd, _ = step(g1_model, q, qd, tg[:, k])
    _loss(q, qd).sum().backward()
    gen = torch.Generator().manual_seed(3)
    dirs = torch.randn(3, 1, steps, g1_model.nu, generator=gen, **D)
    dirs /= dirs.flatten(1).norm(dim=1)[:, None, None, None]
    analytic = (tg.grad.double()[None] * dirs).flatten(1).sum(1)
    eps = 1e-5
    tgs = torch.cat([targets + eps * dirs[:, 0], targets - eps * dirs[:, 0]], 0)
    q, qd = _spinning_start(tgs.shape[0], torch.float64, g1_model)
    with torch.no_grad():
        for k in range(steps):
            q, qd, _ = reference.step(g1_model, q, qd, tgs[:, k])
    loss = _loss(q, qd)
    fd = (loss[:3] - loss[3:]) / (2 * eps)
    rel = float(((analytic - fd).abs() / fd.abs().max()).max())
    assert fd.abs().max() > 1e-3
    assert rel < 2e-4, (analytic, fd, rel)  # measured 9.5e-5


def test_envelope_bounds_the_speed_a_saturated_joint_reaches(g1_model):
    """In the air, the left wrist yaw (v0 33 rad/s) driven with its target 100 rad ahead for 0.4 s: with the
    envelope it levels off just below v0; without it, it keeps accelerating."""
    wrist = list(g1.JOINT_NAMES).index("left_wrist_yaw_joint")
    v0 = float(g1_model.actuator_speed[wrist])
    free = g1_model.without_joint_limits()
    plain = free.with_gains(actuator_speed=np.full(free.nu, math.inf))
    peak = {}
    for name, model in (("envelope", free), ("plain", plain)):
        q, qd = _spinning_start(1, torch.float32, model)
        qd.zero_()
        targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].clone()
        with torch.no_grad():
            for _ in range(20):
                targets[0, wrist] = q[0, 7 + wrist] + 100.0
                q, qd, _ = step(model, q, qd, targets)
        peak[name] = float(qd[0, 6 + wrist].abs())
    assert 0.9 * v0 < peak["envelope"] < 1.0 * v0, peak
    assert peak["plain"] > 2.5 * v0, peak  # measured 31.3 and 91.6 rad/s


def test_g1_model_reads_the_no_load_speeds(g1_model):
    np.testing.assert_array_equal(g1_model.actuator_speed, g1.NO_LOAD_SPEEDS)
    np.testing.assert_array_equal(g1.NO_LOAD_SPEEDS, 1.5 * g1.NOMINAL_SPEEDS)


def test_mjcf_without_or_with_a_bad_speed_numeric():
    import mujoco

    text = g1.MJCF_PATH.read_text()
    start = text.index("  <custom>")
    end = text.index("</custom>") + len("</custom>")
    plain = mujoco.MjModel.from_xml_string(text[:start] + text[end:], {})
    assert np.all(np.isinf(model_from_mujoco(plain).actuator_speed))
    bad = text[:start] + f'<custom><numeric name="{NO_LOAD_SPEED_NUMERIC}" data="1 2 3"/></custom>' + text[end:]
    with pytest.raises(UnsupportedModelError, match="one positive speed"):
        model_from_mujoco(mujoco.MjModel.from_xml_string(bad, {}))
    with pytest.raises(ValueError, match="actuator_speed must be > 0"):
        load_model().with_gains(actuator_speed=np.zeros(29))
