"""Perturbation laws of the branching estimators (docs/method.md §3.4).

* ``joint_gaussian``: :func:`bcg.estimators.grs.joint_gaussian_offsets`.
* ``cartesian``: Cartesian offsets of a kinematic chain's end point (a foot's contact-sphere centroid, a wrist's
  origin), ``dp ~ N(0, sigma_p^2 I)``, ``dv ~ N(0,
  sigma_v^2 I)``, mapped to the chain's hinge angles and rates through the damped pseudoinverse
  ``J^T (J J^T + lambda I)^-1`` of the end link's positional Jacobian (torch forward kinematics,
  :class:`bcg.motion.kinematics.KinematicsFn`, evaluated at the nominal state, detached). Near a stretched knee the
  pseudoinverse gain reaches 1 / (2 sqrt(lambda)) (50 rad/m at lambda = 1e-4), so each chain's offset is scaled down
  until no joint of it moves more than ``max_joint_offset`` (rate offsets: ``max_joint_rate_offset``), which keeps
  the direction of the end-link offset, then clamped to the joint limits.

Measured on the clips' own stance states (every frame, each leg whose lowest sphere is within 2 cm of the ground;
``python benchmarks/estimators.py --perturb-scale``, docs/estimators.md): the stance knees are bent (0.77 rad or
more in 95 % of the jump's stance legs, 0.83 in the run's), the leg Jacobian's smallest singular value is at least
0.097 m/rad in 95 % of them, so the stretched-knee gain never appears and lambda = 1e-4 (the paper's value) is kept.
For 1 cm the largest joint offset of a branch has a median of 0.042 / 0.043 rad (jump / run), a 95th percentile of
0.126 / 0.124 rad; after the cap the largest per-joint standard deviation (the knee) is 0.039 / 0.040 rad and the
RMS over the 12 leg hinges 0.020 rad, the 0.02-0.04 rad of docs/method.md §3.4; the 0.1 rad cap scales down 10.5 % /
11.0 % of the branches and the foot still moves 97 % / 98 % of the drawn distance (median). A larger damping would
shrink the offsets mostly along the vertical: lambda = 1e-2 caps only 1.2 % but keeps 87 % of the distance.
"""

from __future__ import annotations

import torch

__all__ = ["LIMB_END_BODIES", "FOOT_END_BODIES", "cartesian_offsets", "chain_mask", "end_link_jacobians", "end_points",
           "stance_offset_statistics"]

FOOT_END_BODIES: tuple[str, ...] = ("left_ankle_roll_link", "right_ankle_roll_link")
"""End links of the leg chains (the contacting chains of the feet)."""
LIMB_END_BODIES: tuple[str, ...] = FOOT_END_BODIES + ("left_wrist_yaw_link", "right_wrist_yaw_link")
"""End links of the four limb chains (legs and arms, the arms through the waist)."""


def chain_mask(model, end_bodies: tuple[str, ...]) -> torch.Tensor:
    """[L, nh] bool: hinge j belongs to the chain from the pelvis to end body l (the floating base excluded)."""
    import numpy as np

    from bcg.motion.kinematics import body_ancestry

    names = list(model.body_names)
    ancestry = body_ancestry(np.asarray(model.body_parent))
    dof_body = np.asarray(model.dof_body)[6:]
    return torch.as_tensor(ancestry[[names.index(name) for name in end_bodies]][:, dof_body])


def end_points(model, end_bodies: tuple[str, ...]) -> tuple[list[int], torch.Tensor]:
    """Body indices and body-frame points [L, 3] of the chains' end points: the centroid of a body's contact
    spheres (a foot), else the body origin (a wrist)."""
    import numpy as np

    names = list(model.body_names)
    idx = [names.index(b) for b in end_bodies]
    pts = np.zeros((len(idx), 3))
    sb, sp = np.asarray(model.sphere_body), np.asarray(model.sphere_pos)
    for i, b in enumerate(idx):
        if (sb == b).any():
            pts[i] = sp[sb == b].mean(0)
    return idx, torch.as_tensor(pts, dtype=torch.float32)


def end_link_jacobians(kin, q: torch.Tensor, body_idx: list[int], points: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """[n, L, 3, nh] positional Jacobians [m/rad] of the points ``points`` [L, 3] (body frames; default the origins)
    of the bodies ``body_idx`` w.r.t. the hinge angles, at qpos ``q`` [n, nq] (detached). ``kin``: a
    :class:`~bcg.motion.kinematics.KinematicsFn` of the model.

    Closed form from one forward-kinematics pass: the column of hinge j (pivot at its body's origin o_j, world axis
    a_j) is ``a_j x (p - o_j)`` where j is on the point's path to the root, else 0. This replaced 3 L autograd
    passes through the kinematics, which cost 5-6x as much on the few rows a bundle perturbs."""
    with torch.no_grad():
        k = kin(q.detach())
        rot, pos = k.rot, k.pos
        p = pos[:, body_idx]  # [n, L, 3]
        if points is not None:
            p = p + (rot[:, body_idx] @ points.to(p)[None, :, :, None])[..., 0]
        axis_w = (rot[:, 1:] @ kin.axis[1:].to(p)[None, :, :, None])[..., 0]  # [n, nh, 3]
        r = p[:, :, None, :] - pos[:, None, 1:, :]  # [n, L, nh, 3]
        cols = torch.linalg.cross(axis_w[:, None].expand_as(r), r, dim=-1)
        on_path = kin.ancestor[body_idx][:, 1:].to(device=p.device, dtype=p.dtype)  # [L, nh]
        return (cols * on_path[None, :, :, None]).transpose(-1, -2).contiguous()


def cartesian_offsets(jac: torch.Tensor, mask: torch.Tensor, active: torch.Tensor, branches: int, sigma_p: float,
                      sigma_v: float, damping: float, max_joint_offset: float, max_joint_rate_offset: float,
                      antithetic: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Joint offsets ``(dq, dqd)`` [n, B, nh] of Cartesian end-link offsets on the ``active`` [n, L] chains.

    ``jac`` [n, L, 3, nh] (from :func:`end_link_jacobians`), ``mask`` [L, nh] (from :func:`chain_mask`). The offsets
    of several chains add (they share only the waist hinges, for the arms). Not yet clamped to the joint limits.
    """
    n, L, _, nh = jac.shape
    dev, dt = jac.device, jac.dtype
    J = jac * mask.to(device=dev, dtype=dt)[None, :, None, :]  # only the chain's hinges
    eye = torch.eye(3, device=dev, dtype=dt)
    pinv = J.transpose(-1, -2) @ torch.linalg.inv(J @ J.transpose(-1, -2) + damping * eye)  # [n, L, nh, 3]
    half = branches // 2 if antithetic else branches
    z = torch.randn(n, half, L, 2, 3, generator=generator, device=dev, dtype=dt)
    if antithetic:
        z = torch.cat([z, -z], 1)
    z = z * active.to(dt)[:, None, :, None, None]
    dp, dv = z[..., 0, :] * sigma_p, z[..., 1, :] * sigma_v  # [n, B, L, 3]
    dq = _capped_sum(torch.einsum("nljc,nblc->nblj", pinv, dp), max_joint_offset)
    dqd = _capped_sum(torch.einsum("nljc,nblc->nblj", pinv, dv), max_joint_rate_offset)
    return dq, dqd


def _capped_sum(per_chain: torch.Tensor, cap: float) -> torch.Tensor:
    """[n, B, nh] sum over the chains of ``per_chain`` [n, B, L, nh] after scaling every chain's offset down so that
    its largest joint entry is at most ``cap``. Scaling the whole chain offset (instead of clipping joints one by one)
    keeps the direction of the end-link offset, so a capped branch still moves the foot along the drawn dp, only
    less far; the final clamp only acts on hinges two chains share (the waist, for the arms)."""
    big = per_chain.abs().amax(-1, keepdim=True)
    scale = torch.where(big > cap, cap / big.clamp(min=1e-30), torch.ones_like(big))
    return (per_chain * scale).sum(2).clamp(-cap, cap)


def stance_offset_statistics(model, qpos: torch.Tensor, *, sigma_p: float = 0.01, damping: float = 1e-4,
                             max_joint_offset: float = 0.1, branches: int = 200, contact_height: float = 0.02,
                             seed: int = 0) -> dict[str, float]:
    """Distribution of the leg-joint offsets the Cartesian law draws on the stance legs of the states ``qpos``
    [n, 36] (e.g. every frame of a clip): a leg is in stance when its lowest contact sphere is within
    ``contact_height`` [m] of the ground. Returns (rad unless noted) the stance fraction, the quantiles of the
    stance knee angle and of the chain Jacobian's smallest singular value [m/rad], the quantiles of the largest
    joint offset of a branch before the cap (``branch_max_q50/q95/q99/max``), the largest and the RMS over the 12
    leg hinges of the per-joint standard deviation after the cap, the fraction of branches the cap scales down
    (``capped``) and the median foot displacement ``|J dq|`` after the cap over the median drawn ``|dp|``
    (``kept_displacement``, 1 = the drawn offset is reached)."""
    from bcg.motion.kinematics import KinematicsFn

    q = qpos.detach().to(torch.float32)
    kin = KinematicsFn(model)
    idx, pts = end_points(model, FOOT_END_BODIES)
    jac = end_link_jacobians(kin, q, idx, pts)  # [n, 2, 3, nh]
    with torch.no_grad():
        k = kin(q)
        sb = torch.as_tensor(model.sphere_body, dtype=torch.long)
        sp = torch.as_tensor(model.sphere_pos, dtype=torch.float32)
        centres = k.pos[:, sb] + (k.rot[:, sb] @ sp[None, :, :, None])[..., 0]
        low = centres[..., 2] - torch.as_tensor(model.sphere_radius, dtype=torch.float32)
        foot = torch.as_tensor(model.sphere_foot, dtype=torch.long)
        stance = torch.stack([low[:, foot == f].amin(1) for f in range(len(FOOT_END_BODIES))], 1) < contact_height
        mask = chain_mask(model, FOOT_END_BODIES)
        J = (jac * mask.to(jac)[None, :, None, :])[stance]  # [m, 3, nh], one stance leg per row
        pinv = J.transpose(-1, -2) @ torch.linalg.inv(J @ J.transpose(-1, -2) + damping * torch.eye(3))
        g = torch.Generator().manual_seed(int(seed))
        dp = sigma_p * torch.randn(J.shape[0], branches, 3, generator=g)
        raw = torch.einsum("mjc,mbc->mbj", pinv, dp)  # [m, B, nh]
        big = raw.abs().amax(-1)
        capped = raw * torch.where(big > max_joint_offset, max_joint_offset / big.clamp(min=1e-30),
                                   torch.ones_like(big))[..., None]
        reached = torch.einsum("mcj,mbj->mbc", J, capped).norm(dim=-1)
        knee = q[:, 7:][:, [3, 9]][stance]
        smin = torch.linalg.svdvals(J)[:, -1]
        std = capped[..., :12].reshape(-1, 12).std(0)
        qs = torch.tensor([0.05, 0.5, 0.95, 0.99])

        def quant(x: torch.Tensor) -> list[float]:
            return [float(v) for v in torch.quantile(x.flatten(), qs)]

        kq, sq, bq = quant(knee), quant(smin), quant(big)
        return {"stance_fraction": float(stance.float().mean()), "knee_q05": kq[0], "knee_q50": kq[1],
                "sigma_min_q05": sq[0], "sigma_min_q50": sq[1], "branch_max_q50": bq[1], "branch_max_q95": bq[2],
                "branch_max_q99": bq[3], "branch_max_max": float(big.max()), "joint_std_max": float(std.max()),
                "joint_std_rms": float(std.pow(2).mean().sqrt()),
                "capped": float((big > max_joint_offset).float().mean()),
                "kept_displacement": float(reached.median() / dp.norm(dim=-1).median())}
