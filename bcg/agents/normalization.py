"""Running mean / variance in torch (observation and return normalisation) and frozen copies of it.

:class:`RunningMeanStd` merges batches count-weighted (Chan et al.'s parallel update) into float64 accumulators, so
millions of float32 samples do not drift. :meth:`RunningMeanStd.frozen` returns a :class:`FrozenNormalizer`, a
constant copy of the statistics that SHAC uses inside a window while the running statistics keep updating
(DiffRL's ``deepcopy(obs_rms)``): no gradient flows through the statistics and they do not change within a window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["FrozenNormalizer", "RunningMeanStd"]


@dataclass(frozen=True)
class FrozenNormalizer:
    """Constant statistics: ``normalize(x) = clip((x - mean) / sqrt(var + eps), -clip, clip)``."""

    mean: torch.Tensor
    """[D] float64 mean."""
    var: torch.Tensor
    """[D] float64 variance."""
    eps: float
    """Added to the variance before the square root."""
    clip: float | None
    """Bound of the normalised values (None: unbounded)."""

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., D] normalised, in ``x``'s dtype (differentiable w.r.t. ``x``)."""
        mean = self.mean.to(x.dtype)
        inv_std = torch.rsqrt(self.var + self.eps).to(x.dtype)
        y = (x - mean) * inv_std
        return y if self.clip is None else y.clamp(-self.clip, self.clip)


class RunningMeanStd:
    """Count-weighted running mean and (population) variance of [..., D] samples, float64 accumulators.

    Starts, like DiffRL's and rl_games' ``RunningMeanStd``, at mean 0, variance 1 and a tiny prior count
    (``initial_count``), so that normalising before the first update is the identity up to ``eps``.
    """

    def __init__(self, shape: int | tuple[int, ...], *, eps: float = 1e-5, clip: float | None = None,
                 initial_count: float = 1e-4, device: torch.device | str = "cpu"):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if clip is not None and not clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {clip!r}")
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)
        f64 = dict(dtype=torch.float64, device=device)
        self.mean = torch.zeros(shape, **f64)
        """Running mean (float64)."""
        self.var = torch.ones(shape, **f64)
        """Running population variance (float64)."""
        self.count = torch.tensor(float(initial_count), **f64)
        """Samples merged so far (plus the prior count)."""
        self.eps = float(eps)
        self.clip = None if clip is None else float(clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the samples ``x`` [B, *shape] (any float dtype; rows that are not finite everywhere are ignored)."""
        x = x.detach().to(torch.float64).reshape(-1, *self.mean.shape)
        ok = torch.isfinite(x.reshape(x.shape[0], -1)).all(1)
        if not bool(ok.all()):
            x = x[ok]
        n = x.shape[0]
        if n == 0:
            return
        b_mean = x.mean(0)
        b_var = x.var(0, unbiased=False)
        tot = self.count + n
        delta = b_mean - self.mean
        self.mean = self.mean + delta * (n / tot)
        m2 = self.var * self.count + b_var * n + delta.square() * (self.count * n / tot)
        self.var = m2 / tot
        self.count = tot

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` normalised with the current statistics (see :meth:`FrozenNormalizer.normalize`)."""
        return self.frozen().normalize(x)

    def frozen(self) -> FrozenNormalizer:
        """A constant copy of the current statistics (later updates do not change it)."""
        return FrozenNormalizer(self.mean.clone(), self.var.clone(), self.eps, self.clip)

    @property
    def std(self) -> torch.Tensor:
        """sqrt(var + eps), float64."""
        return torch.sqrt(self.var + self.eps)

    def state_dict(self) -> dict[str, Any]:
        """Tensors and floats only (``torch.load(..., weights_only=True)`` reads it)."""
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count.clone(), "eps": self.eps,
                "clip": self.clip}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (shapes must match)."""
        for key in ("mean", "var", "count"):
            if key not in state:
                raise KeyError(f"normaliser state has no {key!r} (keys: {sorted(state)})")
        mean, var = torch.as_tensor(state["mean"]), torch.as_tensor(state["var"])
        if mean.shape != self.mean.shape or var.shape != self.var.shape:
            raise ValueError(f"normaliser state has shape {list(mean.shape)}, expected {list(self.mean.shape)}")
        dev = self.mean.device
        self.mean = mean.to(dev, torch.float64).clone()
        self.var = var.to(dev, torch.float64).clone()
        self.count = torch.as_tensor(state["count"]).to(dev, torch.float64).clone()
        self.eps = float(state.get("eps", self.eps))
        clip = state.get("clip", self.clip)
        self.clip = None if clip is None else float(clip)
