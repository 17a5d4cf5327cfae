"""The Cartesian perturbation law (docs/method.md §3.4, issue 9): end-link Jacobians against finite differences, the
covariance of J dq against sigma_p^2 I (3.9 (5)), the per-joint cap near a stretched knee, only chain hinges move."""

from __future__ import annotations

import torch
from test_estimators import N, _actions, _env

from bcg.estimators import make
from bcg.estimators.bundled import BCG
from bcg.estimators.grs import GRS
from bcg.estimators.perturb import FOOT_END_BODIES, LIMB_END_BODIES, chain_mask, end_link_jacobians, end_points
from bcg.motion.kinematics import KinematicsFn
from bcg.robots.g1 import DEFAULT_JOINT_POS


def _pose(model, knee: float = 0.6):
    """A crouch: hip pitch -knee/2, knee ``knee``, ankle pitch -knee/2 on both legs (knee 0: stretched legs)."""
    q = torch.zeros(1, 36)
    q[0, 2], q[0, 3] = 0.8, 1.0
    q[0, 7:] = torch.tensor(DEFAULT_JOINT_POS.copy(), dtype=torch.float32)
    for leg in (0, 6):
        q[0, 7 + leg], q[0, 7 + leg + 3], q[0, 7 + leg + 4] = -knee / 2, knee, -knee / 2
    return q, torch.zeros(1, 35)


def test_jacobian_matches_finite_differences(g1_model) -> None:
    kin = KinematicsFn(g1_model, dtype=torch.float64)
    q, _ = _pose(g1_model)
    q = q.double()
    idx, pts = end_points(g1_model, LIMB_END_BODIES)
    pts = pts.double()
    J = end_link_jacobians(kin, q, idx, pts)[0]  # [L, 3, nh]

    def points(x):
        k = kin(x)
        return k.pos[0, idx] + (k.rot[0, idx] @ pts[:, :, None])[..., 0]

    eps = 1e-6
    for j in (0, 3, 5, 13, 18):
        dq = torch.zeros_like(q)
        dq[0, 7 + j] = eps
        torch.testing.assert_close(J[:, :, j], (points(q + dq) - points(q - dq)) / (2 * eps), rtol=1e-6, atol=1e-8)
    mask = chain_mask(g1_model, LIMB_END_BODIES)
    assert mask.sum(1).tolist() == [6, 6, 10, 10]  # 6 leg hinges; 3 waist + 7 arm hinges
    moves = J.abs().sum(1) > 1e-9
    assert not (moves & ~mask).any()  # an end point moves with its chain's hinges only
    assert moves[:2].eq(mask[:2]).all()  # a foot's sphere centroid moves with all 6 leg hinges


def _autograd_jacobians(kin, q, body_idx, points):
    """The oracle: one reverse pass through the torch kinematics per point coordinate."""
    qh = q[:, 7:].clone().requires_grad_(True)
    k = kin(torch.cat([q[:, :7], qh], 1))
    pos = k.pos[:, body_idx] + (k.rot[:, body_idx] @ points[None, :, :, None])[..., 0]
    rows = [torch.autograd.grad(pos[:, l_, c].sum(), qh, retain_graph=True)[0]
            for l_ in range(len(body_idx)) for c in range(3)]
    return torch.stack(rows, 1).reshape(q.shape[0], len(body_idx), 3, qh.shape[1])


def test_closed_form_jacobian_equals_autograd_on_random_poses_far_away(g1_model) -> None:
    """64 random poses (hinges uniform in their ranges, random root orientation, 30-1000 m from the origin):
    the closed form equals reverse-mode autograd through the kinematics to float64 rounding (measured 3e-13 m/rad)."""
    g = torch.Generator().manual_seed(3)
    kin = KinematicsFn(g1_model, dtype=torch.float64)
    n = 64
    q = torch.zeros(n, 36, dtype=torch.float64)
    q[:, :3] = (torch.rand(n, 3, generator=g, dtype=torch.float64) - 0.5) * 2000.0
    q[:, 0] += 30.0
    quat = torch.randn(n, 4, generator=g, dtype=torch.float64)
    q[:, 3:7] = quat / quat.norm(dim=1, keepdim=True)
    rng = torch.as_tensor(g1_model.dof_range[6:], dtype=torch.float64)
    q[:, 7:] = rng[:, 0] + torch.rand(n, 29, generator=g, dtype=torch.float64) * (rng[:, 1] - rng[:, 0])
    idx, pts = end_points(g1_model, LIMB_END_BODIES)
    pts = pts.double()
    J = end_link_jacobians(kin, q, idx, pts)
    torch.testing.assert_close(J, _autograd_jacobians(kin, q, idx, pts), rtol=0, atol=1e-12)


def test_covariance_of_the_end_link_offsets(g1_model) -> None:
    """On a crouch (knees at 0.6 rad), J dq over 20000 draws (no cap) has covariance sigma_p^2 I within 5 %."""
    q, qd = _pose(g1_model)
    est = GRS(law="cartesian", branches=20000, max_joint_offset=10.0, max_joint_rate_offset=100.0)
    dq, dqd = est.sample(g1_model, q, qd, torch.Generator().manual_seed(0))
    idx, pts = end_points(g1_model, FOOT_END_BODIES)
    J = end_link_jacobians(KinematicsFn(g1_model), q, idx, pts)[0]  # [2, 3, nh]
    for leg in range(2):
        dp = dq[0] @ J[leg].T  # [B, 3]
        dv = dqd[0] @ J[leg].T
        torch.testing.assert_close(dp.T.cov(), 0.01**2 * torch.eye(3), rtol=0, atol=0.05 * 0.01**2)
        torch.testing.assert_close(dv.T.cov(), 0.02**2 * torch.eye(3), rtol=0, atol=0.05 * 0.02**2)
    # measured: the knee takes 0.10 rad per cm (a vertical foot offset needs knee flexion), the hip and ankle
    # pitch 0.05, the others <= 0.015
    leg_std = dq[0, :, :12].std(0)
    assert 0.07 < leg_std[3] < 0.14 and 0.07 < leg_std[9] < 0.14 and leg_std.max() < 0.14


def test_cap_near_a_stretched_knee_and_leg_chains_only(g1_model) -> None:
    q, qd = _pose(g1_model, knee=0.0)
    free = GRS(law="cartesian", branches=4000, max_joint_offset=10.0).sample(g1_model, q, qd,
                                                                             torch.Generator().manual_seed(0))[0]
    capped = GRS(law="cartesian", branches=4000).sample(g1_model, q, qd, torch.Generator().manual_seed(0))[0]
    assert free.abs().amax() > 0.1 and capped.abs().amax() <= 0.1 + 1e-6
    # bcg perturbs the two leg chains only (hinges 0..11)
    env = _env(BCG(law="cartesian", trigger="always", branches=3))
    a = _actions(env, 0)
    _, rew, *_ = env.step(a)
    rew.sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0
    est = make("bcg", law="cartesian")
    s = env.state
    from bcg.estimators.grs import cartesian_law_offsets

    dq, _ = cartesian_law_offsets(est, env.model, s.q, s.qd, torch.ones(N, 2, dtype=torch.bool), FOOT_END_BODIES,
                                  torch.Generator().manual_seed(0))
    assert dq[..., 12:].abs().amax() == 0 and dq[..., :12].abs().amax() > 0


def test_bcg_perturbs_the_chains_of_the_feet_that_passed_tau(g1_model) -> None:
    """A scripted inner step reports 500 N on the left foot of environment 0, on both feet of environment 1 and no
    force on environment 2: at the next (lagged) step environment 0 branches its left leg only, environment 1 both
    legs, environment 2 not at all."""
    from bcg.envs import simulator_step
    from bcg.sim.reference import ContactReport

    force = torch.zeros(N, 8)
    force[0, :4] = 500.0
    force[1] = 500.0
    seen: list = []

    def scripted(model, q, qd, targets, physics=None, *, env_ids=None, memory=None):
        seen.append((q.detach().clone(), env_ids.clone()))
        q1, qd1, c, _ = simulator_step(model, q, qd, targets, physics)
        return q1, qd1, ContactReport(c.impulse, force[env_ids], c.penetration), {}

    est = BCG(law="cartesian", branches=3, tau=400.0).set_inner(scripted)
    env = _env(est)
    with torch.no_grad():
        env.step(torch.zeros(N, 29))
        nominal = env.state.q
        env.step(torch.zeros(N, 29))
    assert est.last_stats.envs_triggered == 2
    q_in, ids = seen[-1]
    assert ids.tolist() == [2, 0, 0, 0, 1, 1, 1]  # the nominal row first, then the branches
    moved = (q_in[:, 7:] - nominal[ids, 7:]).abs() > 0
    assert not moved[0].any()
    assert moved[1:4, :6].any() and not moved[1:4, 6:].any()        # environment 0: left leg only
    assert moved[4:, :6].any() and moved[4:, 6:12].any() and not moved[4:, 12:].any()
