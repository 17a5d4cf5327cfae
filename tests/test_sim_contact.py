"""Standing on the smoothed impulse contact: stability, penetration against MuJoCo, momentum balance."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

from bcg.robots import g1
from bcg.sim import step

SECONDS = 10.0


def _stand(model, seconds: float):
    """Roll out PD standing at the default pose; returns pelvis height [T], mean positive penetration [T],
    total normal impulse per step [T] (N s)."""
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    qd = torch.zeros(1, model.nv)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None]
    z, pen, imp = [], [], []
    with torch.no_grad():
        for _ in range(int(round(seconds / model.params.control_dt))):
            q, qd, rep = step(model, q, qd, targets)
            z.append(float(q[0, 2]))
            pen.append(float(rep.penetration.clamp(min=0).mean()))
            imp.append(float(rep.impulse.sum()))
    return np.array(z), np.array(pen), np.array(imp)


def _mujoco_stand_penetration(seconds: float, dt: float) -> tuple[float, float]:
    """Mean positive sphere penetration over the second half, and final pelvis height, in MuJoCo."""
    m = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))
    m.opt.timestep = dt
    d = mujoco.MjData(m)
    d.qpos[:] = g1.default_qpos()
    d.ctrl[:] = g1.DEFAULT_JOINT_POS
    spheres = [g for g in range(m.ngeom) if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE and m.geom_bodyid[g] > 0
               and m.geom_contype[g] > 0]
    pens = []
    for k in range(int(round(seconds / dt))):
        mujoco.mj_step(m, d)
        if k * dt >= seconds / 2:
            pens.append(np.mean([max(m.geom_size[g, 0] - d.geom_xpos[g, 2], 0.0) for g in spheres]))
    return float(np.mean(pens)), float(d.qpos[2])


@pytest.fixture(scope="module")
def standing(g1_model):
    return _stand(g1_model, SECONDS)


def test_stands_for_ten_seconds(standing):
    z, _, _ = standing
    assert z.min() > 0.75, z.min()
    assert abs(z[-1] - z[0]) < 0.01


def test_penetration_close_to_mujoco(g1_model, standing):
    _, pen, _ = standing
    half = len(pen) // 2
    ours = pen[half:].mean()
    theirs, z_mj = _mujoco_stand_penetration(SECONDS, g1_model.params.dt)
    assert z_mj > 0.75
    assert abs(ours - theirs) < 4e-3, (ours, theirs)


def test_normal_impulse_balances_weight(g1_model, standing):
    _, _, imp = standing
    per_second = int(round(1.0 / g1_model.params.control_dt))
    last_second = imp[-per_second:].sum()
    weight_impulse = g1_model.total_mass * abs(g1_model.gravity[2]) * 1.0
    assert abs(last_second / weight_impulse - 1) < 0.05


def test_same_seed_rollouts_are_bitwise_identical(g1_model):
    def rollout(seed: int):
        gen = torch.Generator().manual_seed(seed)
        q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(3, 1)
        qd = torch.zeros(3, g1_model.nv)
        targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(3, 1)
        tg = (targets[:, None] + 0.1 * torch.randn(3, 20, g1_model.nu, generator=gen)).requires_grad_(True)
        imps = []
        for t in range(20):
            q, qd, rep = step(g1_model, q, qd, tg[:, t])
            imps.append(rep.impulse)
        (q.sum() + qd.square().sum()).backward()
        return q.detach(), qd.detach(), torch.stack(imps).detach(), tg.grad

    a, b = rollout(3), rollout(3)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_no_grad_and_grad_paths_agree(g1_model):
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(2, 1)
    qd = torch.randn(2, g1_model.nv, generator=torch.Generator().manual_seed(0)) * 0.1
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None].repeat(2, 1)
    with torch.no_grad():
        a = step(g1_model, q, qd, targets)
        a2 = step(g1_model, q, qd, targets)  # reused scratch must not leak state between calls
    b = step(g1_model, q, qd, targets.clone().requires_grad_(True))
    assert torch.equal(a[0], a2[0]) and torch.equal(a[0], b[0].detach())
    assert torch.equal(a[2].impulse, b[2].impulse.detach())
