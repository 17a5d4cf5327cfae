"""Perturbation laws of the branching estimators (METHOD.md 3.4).

* ``joint_gaussian``: :func:`bcg.estimators.grs.joint_gaussian_offsets`.
* ``cartesian``: Cartesian offsets of a kinematic chain's end point (a foot's contact-sphere centroid, a wrist's
  origin), ``dp ~ N(0, sigma_p^2 I)``, ``dv ~ N(0,
  sigma_v^2 I)``, mapped to the chain's hinge angles and rates through the damped pseudoinverse
  ``J^T (J J^T + lambda I)^-1`` of the end link's positional Jacobian (torch forward kinematics,
  :class:`bcg.motion.kinematics.KinematicsFn`, evaluated at the nominal state, detached). Near a stretched knee the
  pseudoinverse gain reaches 1 / (2 sqrt(lambda)) (50 rad/m at lambda = 1e-4), so every joint offset is capped at
  ``max_joint_offset`` (rate offsets at ``max_joint_rate_offset``), then clamped to the joint limits.
"""

from __future__ import annotations

import torch

__all__ = ["LIMB_END_BODIES", "FOOT_END_BODIES", "cartesian_offsets", "chain_mask", "end_link_jacobians", "end_points"]

FOOT_END_BODIES: tuple[str, ...] = ("left_ankle_roll_link", "right_ankle_roll_link")
"""End links of the leg chains (the contacting chains of the feet)."""
LIMB_END_BODIES: tuple[str, ...] = FOOT_END_BODIES + ("left_wrist_yaw_link", "right_wrist_yaw_link")
"""End links of the four limb chains (legs and arms, the arms through the waist)."""


def chain_mask(model, end_bodies: tuple[str, ...]) -> torch.Tensor:
    """[L, nh] bool: hinge j belongs to the chain from the pelvis to end body l (the floating base excluded)."""
    import numpy as np

    names = list(model.body_names)
    parent = np.asarray(model.body_parent)
    dof_body = np.asarray(model.dof_body)[6:]
    mask = np.zeros((len(end_bodies), len(dof_body)), bool)
    for i, name in enumerate(end_bodies):
        b = names.index(name)
        chain = set()
        while b > 0:
            chain.add(b)
            b = parent[b]
        mask[i] = np.isin(dof_body, sorted(chain))
    return torch.as_tensor(mask)


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
    """[n, L, 3, nh] positional Jacobians of the points ``points`` [L, 3] (body frames; default the origins) of the
    bodies ``body_idx`` w.r.t. the hinge angles (detached). One backward pass per output coordinate (3 L passes over
    the whole batch; rows are independent)."""
    with torch.enable_grad():
        qh = q.detach()[:, 7:].clone().requires_grad_(True)
        full = torch.cat([q.detach()[:, :7], qh], 1)
        k = kin(full)
        pos = k.pos[:, body_idx]  # [n, L, 3]
        if points is not None:
            pos = pos + (k.rot[:, body_idx] @ points.to(pos)[None, :, :, None])[..., 0]
        rows = []
        for l_ in range(len(body_idx)):
            for c in range(3):
                (g,) = torch.autograd.grad(pos[:, l_, c].sum(), qh, retain_graph=True)
                rows.append(g)
    n, nh = qh.shape
    return torch.stack(rows, 1).reshape(n, len(body_idx), 3, nh)


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
    dq = torch.einsum("nljc,nblc->nbj", pinv, dp).clamp(-max_joint_offset, max_joint_offset)
    dqd = torch.einsum("nljc,nblc->nbj", pinv, dv).clamp(-max_joint_rate_offset, max_joint_rate_offset)
    return dq, dqd
