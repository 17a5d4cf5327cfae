"""``aobg``: the alpha-order batched gradient (docs/method.md §4.1 and 4.3, Suh et al. 2022) as a ``bcg`` estimator.

Per control step every row (environment) is expanded into B perturbed branches (independent Gaussians on the PD
targets, ``sigma_u``, and optionally on the hinge angles and rates, ``sigma_q``, ``sigma_qd``; constants for
backprop, the hinge offsets clamped to the joint limits as ``grs`` clamps them) plus one unperturbed nominal
branch, all simulated in one call of the inner transition function. The forward value is the branch mean, computed
as ``grs`` computes it (the nominal branch only serves as the baseline of the zeroth-order estimate). The backward
pass goes through a custom ``torch.autograd.Function``: for the cotangent g of the mean and every perturbed input
coordinate j,

    grad_j = alpha * FoBG_j + (1 - alpha) * ZoBG_j,
    FoBG = sum_i w_i g^T df(x + w_i)/dx          (the branch mean's autograd gradient, = grs),
    ZoBG_j = sum_i w_i <g, f(x + w_i) - f(x)> w_ij / sigma_j^2,

with w_i = 1/B over the usable branches (non-finite ones dropped, the weights renormalised). Coordinates that are not
perturbed (the floating base, and by default the hinge angles and rates) keep the first-order gradient. alpha is fixed
(``alpha`` a number) or chosen per row by the bias-constrained rule (``alpha="auto"``,
:func:`bcg_aobg.mix.bias_constrained_alpha`) from the same B branches.

Only bcg's public API is used: :class:`bcg.estimators.Estimator`, :func:`bcg.estimators.register`,
:class:`bcg.estimators.EstimatorStats` and the public branch helpers of :mod:`bcg.estimators.grs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from bcg.estimators import Estimator, EstimatorStats, register
from bcg.estimators.grs import average_branches, joint_gaussian_offsets, usable
from bcg_aobg.mix import ALPHA_CASES, bias_constrained_alpha, zobg_samples

__all__ = ["AOBG", "AlphaStats"]


@dataclass(frozen=True)
class AlphaStats:
    """How alpha was chosen, counted over rows of the backward passes since construction or reset."""

    zobg: int = 0
    """Rows where the auto rule fell back to alpha = 0 (confidence width eps > gamma)."""
    alpha_bar: int = 0
    """Rows where the auto rule took the variance-optimal alpha-bar."""
    clipped: int = 0
    """Rows where the auto rule clipped alpha to (gamma - eps) / |FoBG - ZoBG|."""
    fixed: int = 0
    """Rows with the fixed ``alpha`` of the field."""
    nominal_nonfinite: int = 0
    """Rows whose unperturbed baseline branch was unusable: first-order gradient only (alpha = 1)."""
    alpha_sum: float = 0.0
    """Sum of the alphas used (divide by the row count for the mean)."""

    def __add__(self, other: AlphaStats) -> AlphaStats:
        return AlphaStats(*(getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@register("aobg")
@dataclass(frozen=True)
class AOBG(Estimator):
    """Alpha-order batched gradient: B perturbed branches per row and step, forward = branch mean, backward = alpha
    FoBG + (1 - alpha) ZoBG (alpha fixed or bias-constrained per row)."""

    branches: int = 10
    """B, perturbed branches per row and control step (plus one unperturbed baseline branch when a gradient is
    needed)."""
    sigma_q: float = 0.0
    """Standard deviation of the hinge-angle perturbation [rad] (0: angles not perturbed, first-order gradient).
    Off by default: a zeroth-order state Jacobian from B = 10 samples in 29 + 29 dimensions is so noisy that its
    product over a window grows about 10x per step (measured on the jump clip, see docs/estimator_plugins.md)."""
    sigma_qd: float = 0.0
    """Standard deviation of the hinge-rate perturbation [rad/s] (0: rates not perturbed)."""
    sigma_u: float = 0.02
    """Standard deviation of the PD-target perturbation [rad]: the action noise of the policy setting of
    docs/method.md §4.1 (the zeroth-order part enters once per path from a step's action, never along the state chain).
    0 keeps the shared action of grs and the first-order gradient to the targets."""
    alpha: float | Literal["auto"] = "auto"
    """Weight of the first-order estimate in [0, 1] (1: FoBG = grs, 0: pure ZoBG), or ``auto`` for the
    bias-constrained choice per row."""
    gamma: float = 10.0
    """Auto rule: bias tolerance gamma, in the units of the gradient with respect to the step's inputs (absolute, so
    it depends on the loss scale; on the jump clip gamma = 1 always gives alpha = 0, 10 mostly alpha-bar ~ 1)."""
    L: float = 10.0
    """Auto rule: bound L on the gradient norm in the Bernstein width (official default 10)."""
    delta: float = 0.95
    """Auto rule: confidence parameter delta of log((d + 1) / delta) (official default 0.95, used as written)."""
    antithetic: bool = False
    """Draw perturbations in pairs (w, -w) (needs an even ``branches``)."""
    seed: int = 0
    """Seed of the estimator's own generator (every perturbation is drawn from it)."""
    _alpha_rt: dict = field(default_factory=lambda: {"total": AlphaStats(), "last": None}, init=False, repr=False,
                            compare=False)
    """Run-time companion beside the frozen fields (the base class keeps its own in ``_rt``): the alpha statistics."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.branches, int) or isinstance(self.branches, bool) or self.branches < 1:
            raise ValueError(f"branches must be an int >= 1, got {self.branches!r}")
        for name in ("sigma_q", "sigma_qd", "sigma_u", "gamma", "L"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0.0) or v == float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not (isinstance(self.delta, (int, float)) and 0.0 < self.delta <= 1.0):
            raise ValueError(f"delta must be a number in (0, 1], got {self.delta!r}")
        if self.alpha != "auto" and not (isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
                                         and 0.0 <= self.alpha <= 1.0):
            raise ValueError(f"alpha must be a number in [0, 1] or 'auto', got {self.alpha!r}")
        if self.antithetic and self.branches % 2:
            raise ValueError(f"antithetic pairs need an even number of branches, got {self.branches}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    # ---------------------------------------------------------------------------------------- alpha statistics

    @property
    def alpha_stats(self) -> AlphaStats:
        """How alpha was chosen over the rows of all backward passes since construction or :meth:`reset`."""
        return self._alpha_rt["total"]

    @property
    def last_alpha(self) -> torch.Tensor | None:
        """[n] the alphas of the most recent backward pass (None before the first)."""
        return self._alpha_rt["last"]

    def reset(self, seed: int | None = None) -> None:
        """Restart the random draws (from ``seed``, default the ``seed`` field) and clear all counters."""
        super().reset(seed)
        self._alpha_rt.update(total=AlphaStats(), last=None)

    def state_dict(self) -> dict[str, Any]:
        """:meth:`bcg.estimators.Estimator.state_dict` plus the alpha counters (plain values) and the last alphas."""
        out = super().state_dict()
        last = self._alpha_rt["last"]
        out["alpha_stats"] = self.alpha_stats.as_dict()
        out["last_alpha"] = None if last is None else last.detach().clone()
        return out

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Restore what :meth:`state_dict` saved (generators, counters, alpha counters)."""
        super().load_state_dict(state, strict=strict)
        last = state.get("last_alpha")
        self._alpha_rt.update(total=AlphaStats(**state.get("alpha_stats", {})),
                              last=None if last is None else last.detach().clone())

    # ---------------------------------------------------------------------------------------- perturbations

    def sample(self, model: Any, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Detached offsets ``(dq [n, B, nh], dqd [n, B, nh], du [n, B, nu])`` of the hinge angles, rates and PD
        targets. The hinge offsets are :func:`bcg.estimators.grs.joint_gaussian_offsets` (the same draws as ``grs``
        with the same seed); the target offsets come after them from the same generator (none with sigma_u = 0)."""
        dq, dqd = joint_gaussian_offsets(model, q, qd, self.branches, self.sigma_q, self.sigma_qd, self.antithetic,
                                         generator)
        n, nu = int(targets.shape[0]), int(targets.shape[1])
        if self.sigma_u == 0.0:
            return dq, dqd, targets.new_zeros(n, self.branches, nu)
        half = self.branches // 2 if self.antithetic else self.branches
        z = torch.randn(n, half, nu, generator=generator, device=targets.device, dtype=targets.dtype)
        if self.antithetic:
            z = torch.cat([z, -z], 1)
        return dq, dqd, z * self.sigma_u

    # ---------------------------------------------------------------------------------------- transition

    def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
        n, B = int(q.shape[0]), self.branches
        nq, nv, nu = int(q.shape[1]), int(qd.shape[1]), int(targets.shape[1])
        dev = q.device
        dq, dqd, du = self.sample(model, q, qd, targets, self.generator(dev))
        grad = torch.is_grad_enabled() and (q.requires_grad or qd.requires_grad or targets.requires_grad)
        if grad and physics is not None and any(t.requires_grad for t in physics):
            raise ValueError("the aobg estimator propagates gradients to q, qd and the PD targets only; got Physics "
                             "rows that require grad (use bptt or grs for gradients with respect to Physics)")
        n0 = n if grad else 0  # the unperturbed baseline rows, needed only by the backward pass
        rows = torch.arange(n, device=dev)
        idx = torch.cat([rows[:n0], rows.repeat_interleave(B)])
        off_q = torch.cat([q.new_zeros(n0, nq), torch.cat([q.new_zeros(n, B, 7), dq.to(q.dtype)], -1).reshape(-1, nq)])
        off_qd = torch.cat([qd.new_zeros(n0, nv),
                            torch.cat([qd.new_zeros(n, B, 6), dqd.to(qd.dtype)], -1).reshape(-1, nv)])
        off_u = torch.cat([targets.new_zeros(n0, nu), du.to(targets.dtype).reshape(-1, nu)])
        with torch.enable_grad() if grad else torch.no_grad():
            xq = (q.detach()[idx] + off_q).requires_grad_(grad)
            xqd = (qd.detach()[idx] + off_qd).requires_grad_(grad)
            xt = (targets.detach()[idx] + off_u).requires_grad_(grad)
            pb = None if physics is None else type(physics)(*(t.detach()[idx] for t in physics))
            q1, qd1, contact = self._call_inner(model, xq, xqd, xt, pb, None if env_ids is None else env_ids[idx])
            bq, bqd = q1[n0:], qd1[n0:]
            bc = type(contact)(*(t[n0:] for t in contact))
            mq, mqd, mc, keep = average_branches(bq, bqd, bc, n, B)
        stats = EstimatorStats(calls=1, envs=n, envs_triggered=n, branches_simulated=n * B + n0,
                               nonfinite_dropped=int((~keep).sum()), envs_all_nonfinite=int((keep.sum(1) == 0).sum()))
        if not grad:
            return mq, mqd, mc, {}, stats
        plan = _Plan(self, (xq, xqd, xt), (q1[:n].detach(), qd1[:n].detach(), type(contact)(*(t[:n].detach()
                     for t in contact))), (bq, bqd, bc), (mq, mqd, mc), keep, (dq, dqd, du))
        out = _AoBGFunction.apply(plan, q, qd, targets)
        return out[0], out[1], type(contact)(*out[2:]), {}, stats


class _Plan:
    """Everything the backward pass of one step needs: the branch leaves and graph, the baseline, the offsets."""

    def __init__(self, est: AOBG, leaves, nominal, branches, means, keep, offsets) -> None:
        self.est, self.leaves, self.nominal, self.branches = est, leaves, nominal, branches
        self.means, self.keep, self.offsets = means, keep, offsets

    def outputs(self) -> list[torch.Tensor]:
        mq, mqd, mc = self.means
        return [mq, mqd, *mc]

    def backward(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        est, keep = self.est, self.keep
        n, B = keep.shape
        pairs = [(y, g) for y, g in zip(self.outputs(), grads, strict=True) if y.requires_grad]
        vjp = torch.autograd.grad([y for y, _ in pairs], self.leaves, [g for _, g in pairs], retain_graph=True,
                                  allow_unused=True)
        vjp = [torch.zeros_like(x) if v is None else v for v, x in zip(vjp, self.leaves, strict=True)]
        zero = torch.zeros((), dtype=vjp[0].dtype, device=vjp[0].device)
        # per-branch vector-Jacobian products (they carry the weights 1/N), dropped branches zeroed even if NaN
        v_q, v_qd, v_u = (torch.where(keep[..., None], v[-n * B:].reshape(n, B, -1), zero) for v in vjp)
        first = [v_q.sum(1), v_qd.sum(1), v_u.sum(1)]  # FoBG of every input coordinate (= grs)

        # which input coordinates are perturbed, with their samples, offsets and variances
        dq, dqd, du = self.offsets
        parts = [(0, slice(7, None), v_q[..., 7:], dq, est.sigma_q), (1, slice(6, None), v_qd[..., 6:], dqd,
                 est.sigma_qd), (2, slice(None), v_u, du, est.sigma_u)]
        parts = [p for p in parts if p[4] > 0.0]
        if not parts:
            return first[0], first[1], first[2]
        with torch.no_grad():
            value, value0 = self._values(grads)
            ok0 = usable(self.nominal[0], self.nominal[1]) & torch.isfinite(value0)
            cnt = keep.sum(1).to(v_q.dtype)
            weights = keep.to(v_q.dtype) / cnt.clamp(min=1)[:, None]
            w_all = torch.cat([p[3].to(v_q.dtype) for p in parts], -1)
            sigma2 = torch.cat([torch.full((p[3].shape[-1],), p[4] ** 2, dtype=v_q.dtype, device=v_q.device)
                                for p in parts])
            value = torch.where(keep, value, zero)
            s0 = torch.where(keep[..., None], zobg_samples(value, torch.where(ok0, value0, zero), w_all, sigma2), zero)
            fo = torch.cat([p[2] for p in parts], -1)  # [n, B, d] weighted per-branch FoBG
            zo_mean = (weights[..., None] * s0).sum(1)
            fo_mean = fo.sum(1)
            if est.alpha == "auto":
                s1 = fo * cnt.clamp(min=1)[:, None, None]  # per-sample FoBG (undo the weight 1/N)
                alpha, case = bias_constrained_alpha(s1, s0, keep, est.gamma, est.L, est.delta)
            else:
                alpha = torch.full((n,), float(est.alpha), dtype=v_q.dtype, device=v_q.device)
                case = None
            alpha = torch.where(ok0, alpha, torch.ones_like(alpha))
            mixed = alpha[:, None] * fo_mean + (1.0 - alpha[:, None]) * zo_mean
            self._count(alpha, case, ok0)
        out = list(first)
        start = 0
        for which, sl, _, w, _ in parts:
            d = int(w.shape[-1])
            g = out[which].clone()
            g[:, sl] = mixed[:, start:start + d]
            out[which] = g
            start += d
        return out[0], out[1], out[2]

    def _values(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(<g, f(x + w_i)> [n, B], <g, f(x)> [n])`` over all outputs (q, qd, contact), the root quaternions of the
        branches and the baseline sign-aligned with the mean's."""
        n, B = self.keep.shape
        mq = self.means[0].detach()
        bq = self.branches[0].detach().reshape(n, B, -1)
        nq0 = self.nominal[0]

        def aligned(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
            sign = torch.where((x[..., 3:7] * ref[..., 3:7]).sum(-1, keepdim=True) < 0, -1.0, 1.0).to(x.dtype)
            return torch.cat([x[..., :3], x[..., 3:7] * sign, x[..., 7:]], -1)

        ys = [aligned(bq, mq[:, None])] + [t.detach().reshape(n, B, -1) for t in (self.branches[1], *self.branches[2])]
        y0 = [aligned(nq0, mq)] + [self.nominal[1], *self.nominal[2]]
        value = sum((g[:, None] * y).sum(-1) for g, y in zip(grads, ys, strict=True))
        value0 = sum((g * y).sum(-1) for g, y in zip(grads, y0, strict=True))
        return value, value0

    def _count(self, alpha: torch.Tensor, case: torch.Tensor | None, ok0: torch.Tensor) -> None:
        rt = self.est._alpha_rt
        counts = {"nominal_nonfinite": int((~ok0).sum()), "alpha_sum": float(alpha.sum())}
        if case is None:
            counts["fixed"] = int(ok0.sum())
        else:
            for code, name in enumerate(ALPHA_CASES):
                counts[name] = int(((case == code) & ok0).sum())
        rt["total"] = rt["total"] + AlphaStats(**counts)
        rt["last"] = alpha.detach().clone()


class _AoBGFunction(torch.autograd.Function):
    """Forward: the branch mean (computed beforehand, in the plan). Backward: alpha FoBG + (1 - alpha) ZoBG with
    respect to (q, qd, targets); not differentiable twice."""

    @staticmethod
    def forward(ctx, plan: _Plan, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor):
        ctx.plan = plan
        return tuple(t.detach().clone() for t in plan.outputs())

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        g_q, g_qd, g_u = ctx.plan.backward(grads)
        return None, g_q, g_qd, g_u
