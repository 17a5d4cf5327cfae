"""``grs``: global randomized smoothing. Every control step, every environment is expanded into B perturbed
branches that share the step's PD targets (the shared action); the branches are simulated in one batch and their
next states averaged (positions and velocities arithmetically, the root quaternion sign-aligned and renormalised).
The perturbations are constants for backprop, so autograd of the mean is the mean of the branch sensitivities
(docs/method.md §3.6). Branches whose next state is non-finite (or faster than :data:`bcg.sim.MAX_SPEED`) are dropped
with renormalised weights; a row with no usable branch is returned as NaN, which the environment treats as a
diverged step (reward 0, terminated, gradient blocked, reset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from bcg.estimators.base import Estimator, EstimatorStats, RowGradMask, branch_mean, quat_mean_wxyz, repeat_physics
from bcg.estimators.registry import register
from bcg.sim import ContactReport

__all__ = ["GRS", "average_branches", "cartesian_law_offsets", "clamp_offsets", "expand", "joint_gaussian_offsets",
           "mean_of_branches", "usable"]


@register("grs")
@dataclass(frozen=True)
class GRS(Estimator):
    """Global randomized smoothing: B perturbed branches of every environment at every control step (H = 1)."""

    branches: int = 10
    """B, perturbed branches per environment and control step."""
    sigma_q: float = 0.02
    """Standard deviation of the joint-angle perturbation [rad] (joint-space Gaussian law)."""
    sigma_qd: float = 0.05
    """Standard deviation of the joint-rate perturbation [rad/s] (joint-space Gaussian law)."""
    law: Literal["joint_gaussian", "cartesian"] = "cartesian"
    """Perturbation law: ``joint_gaussian`` (independent N(0, sigma_q^2), N(0, sigma_qd^2) on every hinge angle and
    rate) or ``cartesian`` (end-link offsets N(0, sigma_p^2), N(0, sigma_v^2) of all four limb chains through the
    damped Jacobian pseudoinverse, :mod:`bcg.estimators.perturb`; the default, the same law as ``bcg``'s, so that the
    comparison isolates the trigger). The floating base is never perturbed."""
    sigma_p: float = 0.01
    """Cartesian law: standard deviation of the end-link position offset [m]."""
    sigma_v: float = 0.02
    """Cartesian law: standard deviation of the end-link velocity offset [m/s]."""
    damping: float = 1e-4
    """Cartesian law: lambda of the damped pseudoinverse J^T (J J^T + lambda I)^-1 [m^2]."""
    max_joint_offset: float = 0.1
    """Cartesian law: cap of every joint-angle offset [rad] (the pseudoinverse gain reaches 50 rad/m at a
    stretched knee)."""
    max_joint_rate_offset: float = 0.2
    """Cartesian law: cap of every joint-rate offset [rad/s]."""
    antithetic: bool = False
    """Draw perturbations in pairs (d, -d) (needs an even ``branches``); the branch mean of the start states is then
    the nominal start state (up to clamping at the joint limits)."""
    seed: int = 0
    """Seed of the estimator's own generator (every perturbation is drawn from it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.branches, int) or isinstance(self.branches, bool) or self.branches < 1:
            raise ValueError(f"branches must be an int >= 1, got {self.branches!r}")
        for name in ("sigma_q", "sigma_qd", "sigma_p", "sigma_v", "damping", "max_joint_offset",
                     "max_joint_rate_offset"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0.0) or v == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.law not in ("joint_gaussian", "cartesian"):
            raise ValueError(f"law must be 'joint_gaussian' or 'cartesian', got {self.law!r}")
        if self.antithetic and self.branches % 2:
            raise ValueError(f"antithetic pairs need an even number of branches, got {self.branches}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    # ---------------------------------------------------------------------------------------- perturbations

    def sample(self, model, q: torch.Tensor, qd: torch.Tensor, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint-space offsets ``(dq [n, B, nh], dqd [n, B, nh])`` for the rows of ``q``, ``qd`` (see
        :func:`joint_gaussian_offsets` and :func:`cartesian_law_offsets`)."""
        if self.law == "cartesian":
            from bcg.estimators.perturb import LIMB_END_BODIES

            active = torch.ones(q.shape[0], len(LIMB_END_BODIES), dtype=torch.bool, device=q.device)
            return cartesian_law_offsets(self, model, q, qd, active, LIMB_END_BODIES, generator)
        return joint_gaussian_offsets(model, q, qd, self.branches, self.sigma_q, self.sigma_qd, self.antithetic,
                                      generator)

    # ---------------------------------------------------------------------------------------- transition

    def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
        n, B = int(q.shape[0]), self.branches
        dq, dqd = self.sample(model, q, qd, self.generator(q.device))
        qb, qdb, tb, pb, ids = expand(q, qd, targets, physics, env_ids, B, dq, dqd)
        q1, qd1, contact, dropped, all_bad = mean_of_branches(self, model, qb, qdb, tb, pb, ids, n, B)
        stats = EstimatorStats(calls=1, envs=n, envs_triggered=n, branches_simulated=n * B,
                               nonfinite_dropped=dropped, envs_all_nonfinite=all_bad)
        return q1, qd1, contact, {}, stats


def joint_gaussian_offsets(model, q: torch.Tensor, qd: torch.Tensor, branches: int, sigma_q: float, sigma_qd: float,
                           antithetic: bool, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached joint-space Gaussian offsets ``(dq [n, B, nh], dqd [n, B, nh])`` (nh hinges) for the n rows of ``q``,
    ``qd``, clamped so that no perturbed angle leaves the joint range (or goes further beyond it than the nominal
    angle) and no perturbed rate exceeds :data:`bcg.sim.MAX_SPEED`; ``antithetic`` draws pairs (d, -d)."""

    n, B = int(q.shape[0]), branches
    nh = int(q.shape[1]) - 7
    dev, dt = q.device, q.dtype
    half = B // 2 if antithetic else B
    z = torch.randn(n, half, 2, nh, generator=generator, device=dev, dtype=dt)
    if antithetic:
        z = torch.cat([z, -z], 1)
    dq, dqd = z[:, :, 0] * sigma_q, z[:, :, 1] * sigma_qd
    return clamp_offsets(model, q, qd, dq, dqd)


def clamp_offsets(model, q: torch.Tensor, qd: torch.Tensor, dq: torch.Tensor, dqd: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Hinge offsets ``dq``, ``dqd`` [n, B, nh] clamped (detached) so that no perturbed angle leaves the joint range
    (or goes further beyond it than the nominal angle) and no perturbed rate exceeds :data:`bcg.sim.MAX_SPEED`."""
    import bcg.sim

    with torch.no_grad():
        dt, dev = q.dtype, q.device
        qh, qdh = q.detach()[:, None, 7:], qd.detach()[:, None, 6:]
        rng = torch.as_tensor(model.dof_range[6:], dtype=dt, device=dev)
        lo, hi = torch.minimum(rng[:, 0], qh), torch.maximum(rng[:, 1], qh)
        dq = torch.minimum(torch.maximum(qh + dq, lo), hi) - qh
        vmax = float(bcg.sim.MAX_SPEED)
        dqd = (qdh + dqd).clamp(-vmax, vmax) - qdh
    return dq, dqd


def cartesian_law_offsets(est, model, q: torch.Tensor, qd: torch.Tensor, active: torch.Tensor,
                          end_bodies: tuple[str, ...], generator: torch.Generator):
    """Offsets of the Cartesian law (:mod:`bcg.estimators.perturb`) with ``est``'s fields ``branches``,
    ``sigma_p``, ``sigma_v``, ``damping``, ``max_joint_offset``, ``max_joint_rate_offset``, ``antithetic``, clamped
    to the joint limits; ``active`` [n, L] says which chains of ``end_bodies`` are perturbed."""
    from bcg.estimators.perturb import cartesian_offsets, chain_mask, end_link_jacobians, end_points
    from bcg.motion.kinematics import KinematicsFn

    cache = est._rt.__dict__.setdefault("kinematics", {})
    key = (id(model), str(q.device), q.dtype, end_bodies)
    if key not in cache:
        idx, pts = end_points(model, end_bodies)
        cache[key] = (KinematicsFn(model, dtype=q.dtype, device=q.device), idx, pts.to(q.device, q.dtype),
                      chain_mask(model, end_bodies).to(q.device))
    kin, idx, pts, mask = cache[key]
    with torch.no_grad():
        jac = end_link_jacobians(kin, q, idx, pts)
        dq, dqd = cartesian_offsets(jac, mask, active, est.branches, est.sigma_p, est.sigma_v, est.damping,
                                    est.max_joint_offset, est.max_joint_rate_offset, est.antithetic, generator)
    return clamp_offsets(model, q, qd, dq, dqd)


def expand(q, qd, targets, physics, env_ids, B, dq, dqd):
    """Branch inputs: every row repeated B times (rows ``[0, 0, ..., 1, 1, ...]``) plus the detached offsets on the
    hinge angles and rates; the targets (shared action), Physics rows and env ids are repeated."""
    n = int(q.shape[0])
    zq = torch.zeros(n, B, 7, dtype=q.dtype, device=q.device)
    zqd = torch.zeros(n, B, 6, dtype=qd.dtype, device=qd.device)
    off_q = torch.cat([zq, dq.to(q.dtype)], -1).reshape(n * B, -1).detach()
    off_qd = torch.cat([zqd, dqd.to(qd.dtype)], -1).reshape(n * B, -1).detach()
    qb = q.repeat_interleave(B, 0) + off_q
    qdb = qd.repeat_interleave(B, 0) + off_qd
    tb = targets.repeat_interleave(B, 0)
    ids = None if env_ids is None else env_ids.repeat_interleave(B, 0)
    return qb, qdb, tb, repeat_physics(physics, B), ids


def mean_of_branches(est: Estimator, model, qb, qdb, tb, pb, ids, n: int, B: int):
    """Simulate the n * B branch rows with ``est``'s inner function and average them per environment, dropping
    non-finite branches. Returns ``(q [n, nq], qd [n, nv], contact, dropped, all_bad)``."""
    holder: dict = {}
    if torch.is_grad_enabled():
        qb, qdb, tb = (RowGradMask.apply(x, holder) for x in (qb, qdb, tb))
    q1, qd1, contact = est._call_inner(model, qb, qdb, tb, pb, ids)
    q_mean, qd_mean, c, keep = average_branches(q1, qd1, contact, n, B)
    holder["drop"] = ~keep.reshape(-1)
    return q_mean, qd_mean, c, int((~keep).sum()), int((keep.sum(1) == 0).sum())


def usable(q1: torch.Tensor, qd1: torch.Tensor) -> torch.Tensor:
    """[M] bool: rows whose next state is finite and no faster than :data:`bcg.sim.MAX_SPEED`."""
    import bcg.sim

    with torch.no_grad():
        return (torch.isfinite(q1).all(1) & torch.isfinite(qd1).all(1)
                & (qd1.abs().amax(1) <= float(bcg.sim.MAX_SPEED)))


def average_branches(q1: torch.Tensor, qd1: torch.Tensor, contact: ContactReport, n: int, B: int):
    """Per-environment means of n * B simulated branch rows (branch-major inside each environment), dropping
    unusable branches with renormalised weights; a row without a usable branch is NaN. Returns
    ``(q [n, nq], qd [n, nv], contact, keep [n, B])``."""
    with torch.no_grad():
        keep = usable(q1, qd1).reshape(n, B)
        count = keep.sum(1)
        weights = keep.to(q1.dtype) / count.clamp(min=1)[:, None].to(q1.dtype)
        none = count == 0
    q1, qd1 = q1.reshape(n, B, q1.shape[-1]), qd1.reshape(n, B, qd1.shape[-1])
    q_mean = torch.cat([branch_mean(q1[..., :3], weights, keep), quat_mean_wxyz(q1[..., 3:7], weights, keep),
                        branch_mean(q1[..., 7:], weights, keep)], -1)
    qd_mean = branch_mean(qd1, weights, keep)
    c = ContactReport(*(branch_mean(t.reshape(n, B, t.shape[-1]), weights, keep) for t in contact))
    if bool(none.any()):
        nan = torch.full((), float("nan"), dtype=q_mean.dtype, device=q_mean.device)
        q_mean = torch.where(none[:, None], nan, q_mean)
        qd_mean = torch.where(none[:, None], nan, qd_mean)
    return q_mean, qd_mean, c, keep
