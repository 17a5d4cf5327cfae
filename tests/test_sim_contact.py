"""Determinism and path agreement of the contact step. Standing, drop and slide against MuJoCo (stability,
penetration, momentum balance, drift) are in test_sim_contact_mujoco.py."""

from __future__ import annotations

import torch

from bcg.robots import g1
from bcg.sim import step


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

    from bcg.sim.runtime import clear_pool, default_runtime

    clear_pool(g1_model)
    a = rollout(3)  # fresh arrays
    pool = default_runtime().workspace(g1_model).grad_pool
    assert pool.get((3, False)), "backward should hand the step arrays back to the pool"
    b = rollout(3)  # arrays reused from the pool: stale values or gradients would show here
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
