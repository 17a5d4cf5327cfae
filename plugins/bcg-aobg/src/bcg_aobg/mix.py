"""The estimator-free parts of the alpha-order batched gradient (docs/method.md §4.1): the zeroth-order samples, their
weighted statistics and the bias-constrained choice of alpha. Pure tensor functions, no simulator, no ``bcg`` state.

Shapes: n rows (environments), B branches per row, d perturbed input coordinates; ``keep`` [n, B] marks the usable
branches (non-finite ones are dropped and the weights renormalised over the rest).
"""

from __future__ import annotations

import math

import torch

__all__ = ["ALPHA_BAR", "ALPHA_CASES", "ALPHA_CLIPPED", "ALPHA_ZOBG", "bias_constrained_alpha", "mean_and_trace_var",
           "zobg_samples"]

ALPHA_ZOBG = 0
"""Case code of :func:`bias_constrained_alpha`: the confidence width exceeds gamma, alpha = 0 (pure ZoBG)."""
ALPHA_BAR = 1
"""Case code: the variance-optimal alpha-bar = var0 / (var1 + var0) keeps the bias bound, alpha = alpha-bar."""
ALPHA_CLIPPED = 2
"""Case code: alpha-bar would exceed the bias budget, alpha = (gamma - eps) / |FoBG - ZoBG|."""
ALPHA_CASES = ("zobg", "alpha_bar", "clipped")
"""Names of the case codes, in code order."""


def zobg_samples(value: torch.Tensor, value0: torch.Tensor, offsets: torch.Tensor, sigma2: torch.Tensor
                 ) -> torch.Tensor:
    """Per-branch zeroth-order gradient samples [n, B, d]: ``(F_i - F_0) w_i / sigma^2`` per coordinate.

    Args:
        value: [n, B] F(x + w_i), the scalar each branch contributes (here <g, f(x + w_i)> for the cotangent g).
        value0: [n] F(x), the unperturbed baseline.
        offsets: [n, B, d] the perturbations w_i that were applied (after any clamping).
        sigma2: [d] the variance of each coordinate's perturbation (all > 0).
    """
    return (value - value0[:, None])[..., None] * offsets / sigma2


def mean_and_trace_var(samples: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean [n, d] over the kept branches of ``samples`` [n, B, d] and the trace of their sample covariance [n]
    (sum over coordinates of the unbiased per-coordinate variance; 0 with fewer than two kept branches). Dropped
    branches contribute nothing, even when non-finite."""
    k = keep[..., None]
    cnt = keep.sum(1).to(samples.dtype)
    s = torch.where(k, samples, torch.zeros((), dtype=samples.dtype, device=samples.device))
    mean = s.sum(1) / cnt.clamp(min=1)[:, None]
    dev = torch.where(k, s - mean[:, None], torch.zeros((), dtype=samples.dtype, device=samples.device))
    var = (dev * dev).sum((1, 2)) / (cnt - 1).clamp(min=1)
    return mean, var


def bias_constrained_alpha(fobg: torch.Tensor, zobg: torch.Tensor, keep: torch.Tensor, gamma: float, L: float,
                           delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row alpha of the bias-constrained alpha-order gradient (docs/method.md §4.1; ``bias_constrained_aobg``).

    From the per-branch samples ``fobg``, ``zobg`` [n, B, d] of the first- and zeroth-order estimators (kept
    branches ``keep`` [n, B], N of them per row): the means m1, m0 and trace variances var1, var0
    (:func:`mean_and_trace_var`), the Bernstein confidence width of the ZoBG
    ``eps = sqrt(2 var0 log((d + 1) / delta) / N) + 2 L / (3 N) log((d + 1) / delta)`` (L a bound on the gradient
    norm, delta the confidence parameter, used as written), and the bias tolerance ``gamma``:

    * ``eps > gamma``: alpha = 0 (case :data:`ALPHA_ZOBG`);
    * else alpha-bar = var0 / (var1 + var0) (1 when both are 0); if alpha-bar |m1 - m0| <= gamma - eps then
      alpha = alpha-bar (:data:`ALPHA_BAR`), else alpha = (gamma - eps) / |m1 - m0| (:data:`ALPHA_CLIPPED`).

    Returns ``(alpha [n], case [n] long)``.
    """
    d = int(fobg.shape[-1])
    m1, var1 = mean_and_trace_var(fobg, keep)
    m0, var0 = mean_and_trace_var(zobg, keep)
    n_kept = keep.sum(1).to(fobg.dtype).clamp(min=1)
    log_term = math.log((d + 1) / delta)
    eps = torch.sqrt(2.0 * var0 * log_term / n_kept) + (2.0 * L / (3.0 * n_kept)) * log_term
    total = var1 + var0
    alpha_bar = torch.where(total > 0, var0 / torch.where(total > 0, total, torch.ones_like(total)),
                            torch.ones_like(total))
    gap = torch.linalg.vector_norm(m1 - m0, dim=-1)
    within = alpha_bar * gap <= gamma - eps
    clipped = (gamma - eps) / torch.where(gap > 0, gap, torch.ones_like(gap))
    too_wide = eps > gamma
    alpha = torch.where(too_wide, torch.zeros_like(alpha_bar), torch.where(within, alpha_bar, clipped))
    case = torch.where(too_wide, ALPHA_ZOBG, torch.where(within, ALPHA_BAR, ALPHA_CLIPPED))
    return alpha, case.to(torch.long)
