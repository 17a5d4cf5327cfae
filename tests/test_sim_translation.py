"""Translation invariance in float32: the same state far from the world origin has the same dynamics.

The kernels keep every spatial quantity about the root position (bcg.sim.kernels, module docstring), so the
horizontal root position enters nothing but its own Euler update q_xy <- q_xy + h v_xy. Before that change the
mass matrix lost 2.4e-4 of its accuracy at 30 m and the standing robot went NaN at 70 m (issue 7).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bcg.motion import load_motion
from bcg.robots import g1
from bcg.sim import reference, step

SHIFTS = [(0.0, 0.0), (30.0, 0.0), (300.0, 0.0), (3000.0, 0.0), (0.0, -3000.0), (-2121.3, 2121.3)]
HEADINGS = [0.0, 1.1, -2.7]  # yaw of the root [rad]
T = 16


def _state(dx: float, dy: float, yaw: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Default standing pose at (dx, dy), turned by ``yaw``, with a small deterministic velocity."""
    q = torch.tensor(g1.default_qpos(), dtype=torch.float64)
    q[0] += dx
    q[1] += dy
    q[3:7] = torch.tensor([math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)], dtype=torch.float64)
    qd = 0.05 * torch.sin(torch.arange(35, dtype=torch.float64))
    return q[None].to(dtype), qd[None].to(dtype)


def _targets(dtype: torch.dtype) -> torch.Tensor:
    """[1, T, nu] PD targets: the default pose plus a fixed smooth wiggle (feet stay loaded)."""
    t = torch.arange(T, dtype=torch.float64)[:, None]
    j = torch.arange(29, dtype=torch.float64)[None]
    return (torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float64) + 0.08 * torch.sin(0.7 * t + j))[None].to(dtype)


@pytest.mark.parametrize("yaw", HEADINGS)
def test_velocities_do_not_depend_on_where_the_robot_stands(g1_model, yaw):
    """One step and a 16-step rollout at every shift: velocities bit-identical, positions equal to the rounding of
    the shifted coordinates (each of the 4 T position updates rounds to half an ulp of the shift)."""
    tg = _targets(torch.float32)
    runs = []
    for dx, dy in SHIFTS:
        q, qd = _state(dx, dy, yaw, torch.float32)
        with torch.no_grad():
            q1, qd1, _ = step(g1_model, q, qd, tg[:, 0])
            first = qd1.clone()
            for t in range(1, T):
                q1, qd1, rep = step(g1_model, q1, qd1, tg[:, t])
        runs.append((dx, dy, first, q1, qd1, rep.impulse))
    _, _, first0, q0, qd0, imp0 = runs[0]
    assert float(imp0.sum()) > 0.1, "the feet should be loaded"
    for dx, dy, first, q1, qd1, imp in runs[1:]:
        assert torch.equal(first, first0)
        assert torch.equal(qd1, qd0)
        assert torch.equal(imp, imp0)
        assert torch.equal(q1[:, 2:], q0[:, 2:])
        ulp = float(np.spacing(np.float32(max(abs(dx), abs(dy)))))
        shift = torch.tensor([dx, dy], dtype=torch.float64)
        err = (q1[0, :2].double() - shift - q0[0, :2].double()).abs().max()
        assert err <= 4 * T * ulp, (dx, dy, float(err), ulp)


def _loss(q: torch.Tensor, dx: float, dy: float) -> torch.Tensor:
    return (q[:, 0] - dx) + (q[:, 1] - dy) + q[:, 2] + q[:, 7:].sum(1)


def test_rollout_gradient_far_from_origin_matches_float64_reference(g1_model):
    """16-step gradient w.r.t. all PD targets: bit-identical at every shift, and equal to torch autograd of the
    float64 oracle 3 km from the origin to 6.8e-6 relative (measured; it was 0.24 at 30 m before the root-relative
    coordinates)."""

    def warp_gradient(dx: float, dy: float) -> torch.Tensor:
        q, qd = _state(dx, dy, 0.4, torch.float32)
        tg = _targets(torch.float32).requires_grad_(True)
        for t in range(T):
            q, qd, _ = step(g1_model, q, qd, tg[:, t])
        _loss(q, dx, dy).sum().backward()
        return tg.grad

    grads = [warp_gradient(dx, dy) for dx, dy in SHIFTS]
    for g in grads[1:]:
        assert torch.equal(g, grads[0])
    dx, dy = SHIFTS[-1]
    q, qd = _state(dx, dy, 0.4, torch.float64)
    tr = _targets(torch.float64).requires_grad_(True)
    for t in range(T):
        q, qd, _ = reference.step(g1_model, q, qd, tr[:, t])
    _loss(q, dx, dy).sum().backward()
    rel = float((grads[-1].double() - tr.grad).norm() / tr.grad.norm())
    assert rel < 2e-5, rel


def test_run_clip_replays_for_fifteen_seconds_without_nan(g1_model):
    """The packaged run clip (it reaches x = 33 m) under PD towards its own joint angles from its first frame:
    the robot may fall, but every state of the 15 s stays finite and inside the speed bound."""
    from bcg.sim import MAX_SPEED

    motion = load_motion("run")
    times = torch.arange(int(round(motion.duration / g1_model.params.control_dt))) * g1_model.params.control_dt
    qpos = motion.qpos_at(times).float()
    q = qpos[:1].clone()
    qd = motion.qvel_at(times[:1]).float()
    worst = 0.0
    with torch.no_grad():
        for t in range(1, len(times)):
            q, qd, _ = step(g1_model, q, qd, qpos[t:t + 1, 7:])
            assert torch.isfinite(q).all() and torch.isfinite(qd).all(), t
            worst = max(worst, float(qd.abs().max()))
    assert worst < MAX_SPEED
