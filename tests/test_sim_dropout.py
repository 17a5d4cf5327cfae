"""The contact dropout (bcg.sim.ContactParams.dropout, Physics.contact_dropout): which spheres it drops, that the
float32 kernels and the float64 oracle drop the same ones, that its draws are independent with the asked probability,
and what it does to a push-off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sim_launch import run_control_step

from bcg.robots import g1
from bcg.sim import Physics, default_physics, reference, step
from bcg.sim.bridge import _load_inputs
from bcg.sim.engine import StepArrays


def _standing(model, n: int, seed: int, sink: float = 0.001):
    """n standing states 1 mm into the ground, joints perturbed by 0.05 rad, moving at 0.2 rad/s or m/s."""
    g = torch.Generator().manual_seed(seed)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    q[:, 2] -= sink
    q[:, 7:] += 0.05 * torch.randn(n, model.nu, generator=g)
    qd = 0.2 * torch.randn(n, model.nv, generator=g)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None] + 0.1 * torch.randn(n, model.nu,
                                                                                               generator=g)
    return q, qd, targets


def test_dropout_one_matches_the_float64_oracle_and_zero_is_the_model(g1_model):
    """One batch, three rows: dropout 0 steps bit for bit as the model without it; dropout 1 (every sphere less than
    2 mm deep loses its contact, no draw involved) agrees with the oracle given the same rows, and sinks the feet."""
    n, steps = 2, 5
    q0, qd0, tg = _standing(g1_model, n, 0)
    ph = default_physics(g1_model, n)
    ph = ph._replace(contact_dropout=torch.tensor([0.0, 1.0]))
    ph64 = Physics(*(t.double() for t in ph))
    q, qd, qr, qdr = q0, qd0, q0.double(), qd0.double()
    with torch.no_grad():
        plain = step(g1_model, q0, qd0, tg)
        for k in range(steps):
            q, qd, rep = step(g1_model, q, qd, tg, ph)
            qr, qdr, rep_r = reference.step(g1_model, qr, qdr, tg.double(), ph64)
            if k == 0:
                assert torch.equal(q[0], plain[0][0]) and torch.equal(qd[0], plain[1][0])
    assert (q.double() - qr).abs().max() < 1e-5  # measured 1.1e-6
    assert (qd.double() - qdr).abs().max() < 1e-3  # measured 4.4e-4
    assert rep.penetration[1].max() > rep.penetration[0].max() + 5e-4  # the dropped feet sank deeper: 3.0 vs 1.8 mm


def _first_substep_activations(model, q, qd, tg, dropout):
    """s_act [N, nc], depth [N, nc] of the first substep with per-row dropout probabilities ``dropout`` [N], and the
    spheres' centres relative to the root [N, nc, 3] from the float64 oracle's kinematics of the same state."""
    n = q.shape[0]
    arrs = StepArrays(model, n, requires_grad=False, per_env_physics=True)
    _load_inputs(arrs, q, qd, tg, default_physics(model, n)._replace(contact_dropout=dropout))
    run_control_step(model, arrs)
    s = arrs.sub[0]
    kin = reference.forward_kinematics(model, q.double())
    body = torch.as_tensor(model.sphere_body, dtype=torch.long)
    centres = kin.pos[:, body] + (kin.rot[:, body] @ torch.as_tensor(model.sphere_pos, dtype=torch.float64)[..., None]
                                  )[..., 0] - q.double()[:, None, 0:3]
    return s["s_act"].numpy().copy(), s["depth"].numpy().copy(), centres.numpy()  # copies: arrs is freed


def test_dropout_draws_are_the_oracles_hash_with_the_asked_probability(g1_model):
    """256 states with dropout 0.5: the eligible spheres (less than 2 mm deep) drop in 50 % of the cases, each exactly
    where the oracle's hash of the same positions draws below 0.5, and the draws of the spheres of one foot are
    uncorrelated."""
    n = 256
    q, qd, tg = _standing(g1_model, n, 1)
    s_act, depth, centres = _first_substep_activations(g1_model, q, qd, tg, torch.full((n,), 0.5))
    eligible = depth < g1_model.params.dropout_depth
    dropped = s_act == 0
    assert not (dropped & ~eligible).any()
    share = dropped[eligible].mean()
    assert abs(share - 0.5) < 0.04, share  # binomial sd 0.014 over the 1324 eligible spheres; measured 0.498
    z_root = q[:, 2].double()
    draws = np.stack([reference.dropout_draw(torch.from_numpy(centres[:, c]), z_root, c, 0).numpy()
                      for c in range(g1_model.nc)], 1)
    agree = ((draws < 0.5) == dropped)[eligible].mean()
    assert agree > 0.99, agree  # a centre within float32 rounding of a 10 um cell boundary can differ; measured 0.995
    foot0 = np.flatnonzero(np.asarray(g1_model.sphere_foot) == 0)
    both = eligible[:, foot0[0]] & eligible[:, foot0[1]]
    r = np.corrcoef(dropped[both, foot0[0]], dropped[both, foot0[1]])[0, 1]
    assert abs(r) < 0.25, r  # 146 pairs (sd 0.08); measured 0.09


def test_dropout_zero_is_bitwise_no_dropout_and_one_drops_every_eligible_sphere(g1_model):
    n = 16
    q, qd, tg = _standing(g1_model, n, 2)
    s0, depth, _ = _first_substep_activations(g1_model, q, qd, tg, torch.zeros(n))
    s1, _, _ = _first_substep_activations(g1_model, q, qd, tg, torch.ones(n))
    eligible = depth < g1_model.params.dropout_depth
    assert eligible.any() and (~eligible).any()
    assert (s1[eligible] == 0).all() and np.array_equal(s1[~eligible], s0[~eligible])
    assert (s0 > 0).all()


def test_contact_dropout_is_checked_in_one_line(g1_model):
    from bcg.sim import ContactParams

    with pytest.raises(ValueError, match=r"ContactParams.dropout must be a probability in \[0, 1\], got 1.5"):
        ContactParams(dropout=1.5)
    ph = default_physics(g1_model, 2)
    q, qd, tg = _standing(g1_model, 2, 0)
    with pytest.raises(ValueError, match=r"physics.contact_dropout must lie in \[0, 1\]"):
        step(g1_model, q, qd, tg, ph._replace(contact_dropout=torch.tensor([0.0, 2.0])))
    with pytest.raises(ValueError, match=r"physics.contact_dropout must have non-negative values"):
        step(g1_model, q, qd, tg, ph._replace(contact_dropout=torch.tensor([0.0, -0.5])))
