"""Rigid-body terms and free flight against MuJoCo (mj_fullM, qfrc_bias, mj_kinematics, Euler integration)."""

from __future__ import annotations

import mujoco
import numpy as np
import torch
from conftest import random_state

from bcg.sim import bias_forces, mass_matrix, reference, step


def _mujoco_terms(m, qs, vs):
    d = mujoco.MjData(m)
    Ms, bs, xs = [], [], []
    for q, v in zip(qs, vs):
        d.qpos[:], d.qvel[:] = q, v
        mujoco.mj_forward(m, d)
        M = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, M)
        Ms.append(M)
        bs.append(d.qfrc_bias.copy())
        xs.append((d.xpos[1:].copy(), d.xmat[1:].reshape(-1, 3, 3).copy()))
    return np.array(Ms), np.array(bs), xs


def _rel(a, b):
    return np.abs(a - b).max(axis=tuple(range(1, a.ndim))) / np.abs(b).max(axis=tuple(range(1, b.ndim)))


def test_mass_matrix_and_bias_match_mujoco_100_states(g1_model, g1_mj):
    rng = np.random.default_rng(0)
    states = [random_state(g1_mj.nq, g1_mj.nv, rng, joint_scale=1.5, vel_scale=2.0) for _ in range(100)]
    qs = np.array([s[0] for s in states])
    vs = np.array([s[1] for s in states])
    M_mj, b_mj, _ = _mujoco_terms(g1_mj, qs, vs)
    q32, v32 = torch.tensor(qs, dtype=torch.float32), torch.tensor(vs, dtype=torch.float32)
    M_wp = mass_matrix(g1_model, q32).double().numpy()
    b_wp = bias_forces(g1_model, q32, v32).double().numpy()
    assert _rel(M_wp, M_mj).max() < 1e-4
    assert _rel(b_wp, b_mj).max() < 1e-4
    # the float64 oracle is exact to rounding
    M_ref = reference.mass_matrix(g1_model, torch.tensor(qs)).numpy()
    b_ref = reference.bias_forces(g1_model, torch.tensor(qs), torch.tensor(vs)).numpy()
    assert _rel(M_ref, M_mj).max() < 1e-10
    assert _rel(b_ref, b_mj).max() < 1e-10


def test_forward_kinematics_matches_mujoco(g1_model, g1_mj):
    rng = np.random.default_rng(1)
    qs = np.array([random_state(g1_mj.nq, g1_mj.nv, rng)[0] for _ in range(20)])
    _, _, xs = _mujoco_terms(g1_mj, qs, np.zeros((20, g1_mj.nv)))
    kin = reference.forward_kinematics(g1_model, torch.tensor(qs))
    for i, (xpos, xmat) in enumerate(xs):
        np.testing.assert_allclose(kin.pos[i].numpy(), xpos, atol=1e-12)
        np.testing.assert_allclose(kin.rot[i].numpy(), xmat, atol=1e-12)


def test_contact_free_rollout_follows_mujoco_euler(g1_model, g1_mj):
    """Robot in the air, gravity, no actuation: 0.5 s against MuJoCo's Euler integrator at the same h."""
    model = g1_model.with_gains(kp=np.zeros(g1_model.nu), kd=np.zeros(g1_model.nu)).without_joint_limits()
    m = mujoco.MjModel.from_xml_path(g1_model.mjcf_path)
    m.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    m.opt.timestep = model.params.dt
    m.opt.disableflags |= (mujoco.mjtDisableBit.mjDSBL_ACTUATION | mujoco.mjtDisableBit.mjDSBL_CONTACT
                           | mujoco.mjtDisableBit.mjDSBL_LIMIT)
    rng = np.random.default_rng(2)
    n = 4
    qs, vs = zip(*[random_state(m.nq, m.nv, rng, height=3.0, joint_scale=0.5, vel_scale=0.5) for _ in range(n)])
    q = torch.tensor(np.array(qs), dtype=torch.float32)
    qd = torch.tensor(np.array(vs), dtype=torch.float32)
    targets = torch.zeros(n, model.nu)
    steps = int(round(0.5 / model.params.control_dt))
    with torch.no_grad():
        for _ in range(steps):
            q, qd, _ = step(model, q, qd, targets)
    d = mujoco.MjData(m)
    for i in range(n):
        d.qpos[:], d.qvel[:] = qs[i], vs[i]
        mujoco.mj_step(m, d, nstep=steps * model.params.substeps)
        mine = q[i].double().numpy()
        ref = d.qpos.copy()
        if np.dot(mine[3:7], ref[3:7]) < 0:
            ref[3:7] *= -1
        assert np.abs(mine - ref).max() < 1e-3, np.abs(mine - ref).max()
