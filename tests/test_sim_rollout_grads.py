"""Gradients of whole 32-step rollouts through contact, at kappa 50, 100 and 300.

Analytic: the Warp tape through the torch bridge (float32). Oracle: central finite differences of the float64
torch reference. Scenario: stand pose targets plus 0.1 rad noise per step and joint, with the left and right feet
lifted in turn (raised-cosine hip/knee/ankle offsets), so spheres switch between touching and not touching.
Loss: final pelvis x + pelvis z + the sum of the final hinge angles.
"""

from __future__ import annotations

import math

import pytest
import torch

from bcg.robots import g1
from bcg.sim import reference, step

T = 32


def _targets(model, generator: torch.Generator) -> torch.Tensor:
    """[1, T, nu] float64 PD targets of the stepping scenario."""
    base = torch.tensor(g1.DEFAULT_JOINT_POS)[None, None].repeat(1, T, 1)
    t = torch.arange(T, dtype=torch.float64) * model.params.control_dt

    def bump(t0: float, t1: float) -> torch.Tensor:
        inside = (t >= t0) & (t <= t1)
        return torch.where(inside, 0.5 * (1 - torch.cos(2 * math.pi * (t - t0) / (t1 - t0))), torch.zeros_like(t))

    names = list(g1.JOINT_NAMES)
    for side in ("left", "right"):
        # knees bent 0.15 rad: the default pose has them straight, 0.087 rad from their hard stop, where the
        # target noise would press them into the joint limit (tests/test_sim_limits.py covers limit gradients)
        base[0, :, names.index(f"{side}_knee_joint")] += 0.15
    for side, (t0, t1) in (("left", (0.16, 0.48)), ("right", (0.40, 0.64))):
        lift = bump(t0, t1)
        base[0, :, names.index(f"{side}_hip_pitch_joint")] += -0.4 * lift
        base[0, :, names.index(f"{side}_knee_joint")] += 0.8 * lift
        base[0, :, names.index(f"{side}_ankle_pitch_joint")] += -0.4 * lift
    return base + 0.1 * torch.randn(1, T, model.nu, generator=generator, dtype=torch.float64)


def _loss(q: torch.Tensor) -> torch.Tensor:
    return q[:, 0] + q[:, 2] + q[:, 7:].sum(1)


def _rollout(step_fn, model, q, qd, targets):
    for t in range(T):
        q, qd, _ = step_fn(model, q, qd, targets[:, t])
    return q


def _warp_gradient(model, targets64: torch.Tensor) -> torch.Tensor:
    q0 = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    tg = targets64.float().requires_grad_(True)
    _loss(_rollout(step, model, q0, torch.zeros(1, model.nv), tg)).sum().backward()
    return tg.grad.double()


def _reference_fd(model, targets64: torch.Tensor, dirs: torch.Tensor, eps: float) -> torch.Tensor:
    """Central differences along each direction [D, 1, T, nu], all in one batched float64 rollout."""
    plus, minus = targets64 + eps * dirs[:, 0], targets64 - eps * dirs[:, 0]
    tg = torch.cat([plus, minus], 0)
    n = tg.shape[0]
    q0 = torch.tensor(g1.default_qpos())[None].repeat(n, 1)
    with torch.no_grad():
        loss = _loss(_rollout(reference.step, model, q0, torch.zeros(n, model.nv, dtype=torch.float64), tg))
    d = dirs.shape[0]
    return (loss[:d] - loss[d:]) / (2 * eps)


def directional_gradient_error(model, seed: int) -> float:
    """Largest error of the Warp rollout gradient along 3 random unit directions of the stepping scenario's targets
    (seed ``seed``), against central differences of the float64 oracle, relative to the largest directional
    derivative (itself asserted non-negligible)."""
    gen = torch.Generator().manual_seed(seed)
    targets = _targets(model, gen)
    dirs = torch.randn(3, 1, T, model.nu, generator=gen, dtype=torch.float64)
    dirs /= dirs.flatten(1).norm(dim=1)[:, None, None, None]
    analytic = (_warp_gradient(model, targets)[None] * dirs).flatten(1).sum(1)
    fd = _reference_fd(model, targets, dirs, eps=1e-5)
    scale = analytic.abs().max()
    assert scale > 1e-3
    return float(((analytic - fd).abs() / scale).max())


@pytest.mark.parametrize("kappa", [50.0, 100.0, 300.0])
def test_rollout_gradient_matches_finite_differences(g1_model, kappa):
    # measured: 4.4e-6 / 2.6e-6 / 1.3e-5 at kappa 50 / 100 / 300
    assert directional_gradient_error(g1_model.with_params(kappa=kappa), int(kappa)) < 5e-5


def test_warp_gradient_equals_float64_reference_gradient(g1_model):
    """The whole 32 x 29 gradient of the Warp tape against torch autograd of the float64 oracle."""
    gen = torch.Generator().manual_seed(7)
    targets = _targets(g1_model, gen)
    grad_wp = _warp_gradient(g1_model, targets)
    tg = targets.clone().requires_grad_(True)
    q0 = torch.tensor(g1.default_qpos())[None]
    _loss(_rollout(reference.step, g1_model, q0, torch.zeros(1, g1_model.nv, dtype=torch.float64), tg)).sum().backward()
    rel = (grad_wp - tg.grad).norm() / tg.grad.norm()
    assert rel < 5e-5, rel  # measured 1.5e-5


def trajectory_errors(model) -> tuple[float, float]:
    """Largest |q| difference [m, rad] and largest per-sphere impulse difference [N s] between the Warp float32
    and the torch float64 rollouts of the stepping scenario (seed 11) over T steps."""
    targets = _targets(model, torch.Generator().manual_seed(11))
    q_w, qd_w = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None], torch.zeros(1, model.nv)
    q_r, qd_r = torch.tensor(g1.default_qpos())[None], torch.zeros(1, model.nv, dtype=torch.float64)
    worst_q = worst_imp = 0.0
    with torch.no_grad():
        for t in range(T):
            q_w, qd_w, rep_w = step(model, q_w, qd_w, targets[:, t].float())
            q_r, qd_r, rep_r = reference.step(model, q_r, qd_r, targets[:, t])
            worst_q = max(worst_q, float((q_w.double() - q_r).abs().max()))
            worst_imp = max(worst_imp, float((rep_w.impulse.double() - rep_r.impulse).abs().max()))
    return worst_q, worst_imp


@pytest.mark.parametrize("kappa", [50.0, 300.0])
def test_warp_trajectory_equals_float64_reference(g1_model, kappa):
    """Forward agreement over the same 32 steps: states and per-sphere impulses, Warp float32 vs torch float64."""
    model = g1_model.with_params(kappa=kappa)
    worst_q, worst_imp = trajectory_errors(model)
    weight_impulse = model.total_mass * 9.81 * model.params.control_dt
    # measured: q 2.9e-6 / 5.7e-6 at kappa 50 / 300 (9.0e-7 / 1.4e-6 before the per-foot contact compliance,
    # 2.9e-6 / 4.6e-6 before the torque-speed envelope); impulses 1.2e-5 / 2.3e-5 of m g dt
    assert worst_q < 8e-6, worst_q
    assert worst_imp < 7e-5 * weight_impulse, worst_imp
