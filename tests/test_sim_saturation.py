"""Gradients through saturated actuators (issue 7, item 2).

The actuator law is tau = u / (1 + (u / L)^4)^(1/4) of the PD command u, with its exact slope in the implicit
term, so the step is smooth in the targets and the state. With the earlier clamp (implicit stiffness switched off
when saturated) the velocity jumped when a target crossed saturation, and the 5-step reward gradient disagreed
with finite differences by up to 180 %.

Scenario: the robot in the air (root 3 m up, no contact), PD targets swinging 1.2 rad around the default pose on
every joint, so that many actuators saturate; loss: a fixed linear functional of the final state.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bcg.robots import g1
from bcg.sim import reference, step


def _targets(steps: int) -> torch.Tensor:
    """[1, steps, nu] float64."""
    t = torch.arange(steps, dtype=torch.float64)[:, None]
    j = torch.arange(29, dtype=torch.float64)[None]
    return (torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float64) + 1.2 * torch.sin(0.9 * t + 1.7 * j))[None]


def _start(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.tensor(g1.default_qpos(), dtype=torch.float64)
    q[2] += 3.0
    return q[None].repeat(n, 1).to(dtype), torch.zeros(n, 35, dtype=dtype)


def _loss(q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    w = torch.cos(torch.arange(q.shape[1] + qd.shape[1], dtype=q.dtype))
    return (torch.cat([q[:, 2:], qd], 1) * w[2:]).sum(1)


def _saturated_fraction(model, targets: torch.Tensor) -> float:
    """Share of (substep, actuator) pairs whose PD command exceeds the torque limit along the reference rollout."""
    q, qd = _start(1, torch.float64)
    dofs = torch.as_tensor(model.actuator_dof)
    kp, kd, lim = (torch.as_tensor(x) for x in (model.kp, model.kd, model.torque_limit))
    count = []
    with torch.no_grad():
        for t in range(targets.shape[1]):
            for _ in range(model.params.substeps):
                u = kp * (targets[:, t] - q[:, dofs + 1] - model.params.dt * qd[:, dofs]) - kd * qd[:, dofs]
                count.append((u.abs() > lim).double().mean())
                q, qd, _, _ = reference.substep(model, q, qd, targets[:, t])
    return float(torch.stack(count).mean())


def _check(model, steps: int, tol: float) -> None:
    targets = _targets(steps)
    gen = torch.Generator().manual_seed(steps)
    dirs = torch.randn(3, 1, steps, model.nu, generator=gen, dtype=torch.float64)
    dirs /= dirs.flatten(1).norm(dim=1)[:, None, None, None]

    q, qd = _start(1, torch.float32)
    tg = targets.float().requires_grad_(True)
    for t in range(steps):
        q, qd, _ = step(model, q, qd, tg[:, t])
    _loss(q, qd).sum().backward()
    analytic = (tg.grad.double()[None] * dirs).flatten(1).sum(1)

    eps = 1e-5
    tgs = torch.cat([targets + eps * dirs[:, 0], targets - eps * dirs[:, 0]], 0)
    q, qd = _start(tgs.shape[0], torch.float64)
    with torch.no_grad():
        for t in range(steps):
            q, qd, _ = reference.step(model, q, qd, tgs[:, t])
    loss = _loss(q, qd)
    fd = (loss[:3] - loss[3:]) / (2 * eps)
    rel = float(((analytic - fd).abs() / fd.abs().max()).max())
    assert fd.abs().max() > 1e-2
    assert rel < tol, (analytic, fd, rel)


# measured: 4.3e-5 (8 steps), 5.6e-4 and 3.3e-3 (32 steps, two float32 orderings of the joint-limit guard's solve),
# with 53 % / 55 % of (substep, actuator) pairs saturated; without the guard 8.7e-6 / 2.3e-4. The swinging targets
# press joints into their limits, where the guard's rows start binding at a kink (lambda = max(., 0), as the contact
# normal rows): a float32 trajectory that puts a row's onset on the other side of the kink than the float64 one
# changes the gradient by a finite amount. The float64 reference's own gradient agrees with the differences to
# 6e-9 / 2e-8 either way; issue 7 asks for 1 %.
@pytest.mark.parametrize("steps, tol", [(8, 8e-5), (32, 5e-3)])
def test_gradient_through_saturated_actuators_matches_finite_differences(g1_model, steps, tol):
    assert _saturated_fraction(g1_model, _targets(steps)) > 0.5
    _check(g1_model, steps, tol)


@pytest.mark.parametrize("steps, tol", [(8, 2e-5), (32, 1e-4)])  # measured 4.5e-6, 3.5e-5
def test_control_without_torque_limits(g1_model, steps, tol):
    unlimited = g1_model.with_gains(torque_limit=np.full(g1_model.nu, math.inf))
    assert _saturated_fraction(unlimited, _targets(steps)) == 0.0
    _check(unlimited, steps, tol)


def test_step_is_continuous_across_saturation(g1_model):
    """The issue's probe: robot in the air, one knee target swept across the point where its PD command reaches
    the limit. The knee velocity after one step must change smoothly (the clamp jumped 0.28 rad/s per mrad where
    the slope elsewhere was 0.02)."""
    knee = list(g1.JOINT_NAMES).index("left_knee_joint")
    q, qd = _start(41, torch.float32)
    base = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(41, 1)
    lim = float(g1_model.torque_limit[knee])
    crossing = lim / float(g1_model.kp[knee]) + float(q[0, 7 + knee])
    base[:, knee] = crossing + torch.linspace(-0.02, 0.02, 41)
    with torch.no_grad():
        _, qd1, _ = step(g1_model, q, qd, base)
    v = qd1[:, 6 + knee].double()
    slopes = (v[1:] - v[:-1]) / 1e-3
    assert float(slopes.abs().max()) < 1.05 * float(slopes.abs().median()), slopes  # measured 1.001
