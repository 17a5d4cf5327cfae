"""Per-environment physical parameters (bcg.sim.Physics): same results as the shared model when equal, agreement
with the float64 oracle when they differ, each environment carrying its own weight, and clear errors."""

from __future__ import annotations

import pytest
import torch

from bcg.robots import g1
from bcg.sim import Physics, default_physics, reference, step


def _state(model, n):
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    qd = torch.zeros(n, model.nv)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(n, 1)
    return q, qd, targets


def _randomised(model, n, seed=0) -> Physics:
    g = torch.Generator().manual_seed(seed)
    ph = default_physics(model, n)

    def u(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=g)

    scale = u((n, model.nb), 0.8, 1.2)
    mass = ph.body_mass * scale
    mass[:, 0] += u((n,), -3.0, 3.0)
    return Physics(
        body_mass=mass,
        body_com=ph.body_com + u((n, model.nb, 3), -0.03, 0.03),
        body_inertia=ph.body_inertia * scale[:, :, None, None],
        dof_armature=ph.dof_armature * u((n, model.nv), 0.75, 1.25),
        dof_damping=ph.dof_damping * u((n, model.nv), 0.5, 1.5),
        kp=ph.kp * u((n, 1), 0.8, 1.2),
        kd=ph.kd * u((n, 1), 0.8, 1.2),
        mu=u((n,), 0.3, 1.2),
        contact_bias=_contact_gains(model, n, g),
        torque_limit=ph.torque_limit * u((n, 1), 0.5, 1.0),  # half the limits: the saturation is reached
        contact_dropout=ph.contact_dropout,
    )


def _contact_gains(model, n, g) -> torch.Tensor:
    """[n, 3] normal-row bias gains: every other environment a soft ground (time constant 10-30 ms), the others
    Baumgarte contact, with the Baumgarte factor drawn in [0.1, 0.5]."""
    import dataclasses

    rows = []
    for i in range(n):
        beta = 0.1 + 0.4 * float(torch.rand((), generator=g))
        soft = 0.01 + 0.02 * float(torch.rand((), generator=g)) if i % 2 else 0.0
        rows.append(dataclasses.replace(model.params, beta=beta, soft_timeconst=soft).normal_bias_gains())
    return torch.tensor(rows, dtype=torch.float32)


def test_default_physics_is_bitwise_the_shared_model(g1_model):
    q, qd, tg = _state(g1_model, 3)
    tg = tg + 0.1 * torch.randn(3, g1_model.nu, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = step(g1_model, q, qd, tg)
        b = step(g1_model, q, qd, tg, default_physics(g1_model, 3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2].impulse, b[2].impulse)


def test_per_env_physics_matches_reference_and_differs_between_envs(g1_model):
    n, steps = 3, 10
    ph = _randomised(g1_model, n)
    q, qd, tg = _state(g1_model, n)
    tg = tg + 0.1 * torch.randn(n, g1_model.nu, generator=torch.Generator().manual_seed(2))
    ph64 = Physics(*(t.double() for t in ph))
    qr, qdr = q.double(), qd.double()
    tg_w = tg.clone().requires_grad_(True)
    tg_r = tg.double().clone().requires_grad_(True)
    qw, qdw = q, qd
    for _ in range(steps):
        qw, qdw, rep_w = step(g1_model, qw, qdw, tg_w, ph)
        qr, qdr, rep_r = reference.step(g1_model, qr, qdr, tg_r, ph64)
    assert (qw.detach().double() - qr.detach()).abs().max() < 1e-4
    assert (rep_w.impulse.detach().double() - rep_r.impulse.detach()).abs().max() < 1e-3
    (qw[:, 2].sum() + qw[:, 7:].sum()).backward()
    (qr[:, 2].sum() + qr[:, 7:].sum()).backward()
    assert ((tg_w.grad.double() - tg_r.grad).norm() / tg_r.grad.norm()) < 1e-3
    # the environments really got different parameters
    assert (qw[0] - qw[1]).abs().max() > 1e-3


def test_a_row_of_contact_gains_is_the_model_with_that_contact(g1_model):
    """Per-environment contact gains: a row with a soft ground's gains steps bit for bit as a model loaded with that
    soft contact, and a row with the model's own gains as the model, in one batch."""
    from bcg.sim import load_model

    soft_model = load_model(soft_timeconst=0.02, beta=0.2)
    n = 2
    q, qd, tg = _state(g1_model, n)
    q[:, 2] -= 0.004  # feet 4 mm into the ground and moving down: the bias matters
    qd[:, 2] = -0.3
    ph = default_physics(g1_model, n)
    gains = ph.contact_bias.clone()
    gains[1] = torch.tensor(soft_model.params.normal_bias_gains())
    with torch.no_grad():
        mixed = step(g1_model, q, qd, tg, ph._replace(contact_bias=gains))
        hard = step(g1_model, q, qd, tg)
        soft = step(soft_model, q, qd, tg)
    assert torch.equal(mixed[1][0], hard[1][0]) and torch.equal(mixed[1][1], soft[1][1])
    assert torch.equal(mixed[2].impulse[1], soft[2].impulse[1])
    assert (hard[1][1] - soft[1][1]).abs().max() > 1e-3  # the two grounds do differ here


def test_physics_saved_before_the_contact_gains_load_with_the_models_own(g1_model):
    """Checkpoints store the rows as a list in field order (SHAC) or by name (PPO); rows written before
    ``contact_bias`` and ``torque_limit`` existed get the model's, and a complete row set comes back unchanged."""
    from bcg.sim import physics_from_saved

    ph = _randomised(g1_model, 3)
    back = physics_from_saved(list(ph), g1_model, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(back, ph, strict=True))
    old = physics_from_saved(list(ph)[:-3], g1_model, "cpu")  # the 8 fields of the first checkpoints
    own = default_physics(g1_model, 3)
    assert torch.equal(old.contact_bias, own.contact_bias) and torch.equal(old.torque_limit, own.torque_limit)
    assert torch.equal(old.contact_dropout, own.contact_dropout)
    ten = physics_from_saved(list(ph)[:-1], g1_model, "cpu")  # the 10 fields before the contact dropout
    assert torch.equal(ten.torque_limit, ph.torque_limit) and torch.equal(ten.contact_dropout, own.contact_dropout)
    by_name = {k: v for k, v in ph._asdict().items() if k not in ("contact_bias", "torque_limit", "contact_dropout")}
    assert torch.equal(physics_from_saved(by_name, g1_model, "cpu").mu, ph.mu)
    with pytest.raises(ValueError, match=r"lack the field\(s\) \['kp'\]"):
        physics_from_saved({k: v for k, v in by_name.items() if k != "kp"}, g1_model, "cpu")


def test_per_env_torque_limits_saturate_each_row_at_its_own_level(g1_model):
    """Targets 1 rad off saturate the legs: a row with 0.6x the torque limits moves differently (by 8 rad/s on the
    left hip pitch), both rows agree with the float64 oracle given the same limits, and the model's own limits in a
    row step as no rows at all."""
    n = 2
    q, qd, tg = _state(g1_model, n)
    tg = tg + 1.0
    ph = default_physics(g1_model, n)
    lim = ph.torque_limit.clone()
    lim[1] *= 0.6
    ph = ph._replace(torque_limit=lim)
    with torch.no_grad():
        q1, qd1, _ = step(g1_model, q, qd, tg, ph)
        q0, qd0, _ = step(g1_model, q[:1], qd[:1], tg[:1])
        qr, qdr, _ = reference.step(g1_model, q.double(), qd.double(), tg.double(), Physics(*(t.double() for t in ph)))
    assert torch.equal(qd1[0], qd0[0])
    torch.testing.assert_close(qd1.double(), qdr, rtol=3e-4, atol=1e-4)  # float32: 1.0e-4 relative measured
    assert (qd1[1] - qd1[0]).abs().max() > 5.0


def test_each_environment_carries_its_own_weight(g1_model):
    n = 3
    ph = default_physics(g1_model, n)
    mass = ph.body_mass.clone()
    mass[1, 0] += 3.0
    mass[2, 0] -= 3.0
    ph = ph._replace(body_mass=mass)
    q, qd, tg = _state(g1_model, n)
    per_step = []
    with torch.no_grad():
        for _ in range(100):  # 2 s
            q, qd, rep = step(g1_model, q, qd, tg, ph)
            per_step.append(rep.impulse.sum(1))
    last_second = torch.stack(per_step[-50:]).sum(0).double()
    weight = mass.sum(1).double() * 9.81
    torch.testing.assert_close(last_second, weight, rtol=0.02, atol=0.0)
    assert last_second[1] > last_second[0] > last_second[2]


def test_bad_physics_is_named(g1_model):
    q, qd, tg = _state(g1_model, 2)
    ph = default_physics(g1_model, 2)
    with pytest.raises(ValueError, match=r"physics.kp must have shape \[2, 29\]"):
        step(g1_model, q, qd, tg, ph._replace(kp=ph.kp[:, :3]))
    with pytest.raises(TypeError, match="physics.mu must be a float32 tensor"):
        step(g1_model, q, qd, tg, ph._replace(mu=ph.mu.double()))
    with pytest.raises(ValueError, match="physics.body_mass must have non-negative values"):
        step(g1_model, q, qd, tg, ph._replace(body_mass=-ph.body_mass))
    with pytest.raises(ValueError, match=r"physics.contact_bias must have shape \[2, 3\]"):
        step(g1_model, q, qd, tg, ph._replace(contact_bias=ph.contact_bias[:, :2]))
    with pytest.raises(TypeError, match="bcg.sim.Physics"):
        step(g1_model, q, qd, tg, tuple(ph))
