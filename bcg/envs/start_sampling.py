"""Adaptive start states: episodes start more often in the parts of the clip where the policy fails.

The clip's start frames ``[0, F - 2]`` (those the env's uniform reset draws from) are split into bins of
``bin_seconds``. Every control step the environment reports which rows terminated and at which frame; each bin keeps
an exponential average of its failures per step, ``score_b <- (1 - alpha) score_b + alpha * failures_b``. A start
frame picks a bin with probability

    p_b = (1 - floor) * score_b / sum(score) + floor * width_b / W

(``width_b`` the bin's frames, ``W`` all start frames; the uniform part alone while no failure has been recorded), then
a frame uniformly inside the bin. The floor keeps every part of the clip visited. By default a failure counts to the
bin where the episode ended (as BeyondMimic's adaptive sampling does); with ``credit="start"`` to the bin where it
started, so that a part of the clip from which episodes drift and fall seconds later starts more often, even when
episodes started later, on the reference, pass the place of the fall without trouble.

The sampler only turns uniform numbers into frames: the environment feeds it its counter-based per-row draws, so a
reset stays a function of the row's key; :meth:`AdaptiveStartSampler.sample` draws from a ``torch.Generator``. The
scores are statistics of the training run (like a running observation normaliser), not part of the per-row
``EnvState``; agents save them with :meth:`~AdaptiveStartSampler.state_dict`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["AdaptiveStartSampler"]

_BITS = 24  # random bits of one uniform draw used here (the env's draws carry 24 bits: exact in float32)


class AdaptiveStartSampler:
    """Start frames drawn in proportion to recent failures per bin of the clip, with a uniform floor.

    Args:
        num_frames: F, frames of the clip (>= 2); start frames are in [0, F - 2].
        control_dt: seconds per frame [s].
        bin_seconds: length of a bin [s] (rounded to whole frames, at least one).
        alpha: weight of the newest step in the exponential average of failures per bin, in (0, 1].
        uniform_floor: share of the draws that are uniform over the start frames, in [0, 1].
        device: where the scores live (that of the frames it receives).
        credit: ``"end"``: a failure counts to the bin where the episode ended; ``"start"``: where it started.
    """

    def __init__(self, num_frames: int, control_dt: float, bin_seconds: float = 1.0, alpha: float = 0.001,
                 uniform_floor: float = 0.1, device: torch.device | str = "cpu", credit: str = "end"):
        if isinstance(num_frames, bool) or not isinstance(num_frames, numbers.Integral) or num_frames < 2:
            raise ValueError(f"num_frames must be an integer >= 2, got {num_frames!r}")
        for name, v in (("control_dt", control_dt), ("bin_seconds", bin_seconds)):
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0 [s], got {v!r}")
        if not (isinstance(alpha, numbers.Real) and 0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be a number in (0, 1], got {alpha!r}")
        if not (isinstance(uniform_floor, numbers.Real) and 0.0 <= uniform_floor <= 1.0):
            raise ValueError(f"uniform_floor must be a number in [0, 1], got {uniform_floor!r}")
        if credit not in ("end", "start"):
            raise ValueError(f"credit must be 'end' or 'start', got {credit!r}")
        self.credit = credit
        """Which frame of a failed episode picks its bin: where it ended or where it started."""
        self.num_starts = int(num_frames) - 1
        """W: start frames [0, W - 1]."""
        self.bin_frames = max(1, round(float(bin_seconds) / float(control_dt)))
        """Frames per bin (the last bin may be shorter)."""
        self.num_bins = -(-self.num_starts // self.bin_frames)
        """B: number of bins."""
        self.alpha, self.uniform_floor = float(alpha), float(uniform_floor)
        self.device = torch.device(device)
        starts = torch.arange(self.num_bins, device=self.device) * self.bin_frames
        self._starts = starts
        self._widths = torch.clamp(self.num_starts - starts, max=self.bin_frames)
        self.scores = torch.zeros(self.num_bins, dtype=torch.float64, device=self.device)
        """[B] exponential average of the failures per control step in each bin (float64)."""

    def bin_of(self, frames: torch.Tensor) -> torch.Tensor:
        """Bin [K] long of motion frames ``frames`` [K] (frames past the last start frame count to the last bin)."""
        return torch.clamp(frames.long() // self.bin_frames, 0, self.num_bins - 1)

    def probabilities(self) -> torch.Tensor:
        """[B] float64: the probability that a new episode starts in each bin."""
        uniform = self._widths.to(torch.float64) / self.num_starts
        total = float(self.scores.sum())
        if total <= 0.0:
            return uniform
        return (1.0 - self.uniform_floor) * self.scores / total + self.uniform_floor * uniform

    def frames_from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        """Start frames [K] long from uniform draws ``u`` [K, 2] in [0, 1): column 0 picks the bin (inverse of the
        cumulative probabilities), column 1 the frame inside it (24 bits times the bin's width, shifted down: exact
        integers)."""
        if u.dim() != 2 or u.shape[1] != 2:
            raise ValueError(f"u must have shape [K, 2], got {list(u.shape)}")
        p = self.probabilities()
        cdf = torch.cumsum(p, 0) / p.sum()
        # a draw beyond the rounded last sum lands in the last bin that can be drawn
        cdf[int(torch.nonzero(p > 0).max()):] = 2.0
        b = torch.searchsorted(cdf, u[:, 0].to(torch.float64).contiguous(), right=True)
        bits = (u[:, 1] * float(1 << _BITS)).long()
        return self._starts[b] + ((bits * self._widths[b]) >> _BITS)

    def sample(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` start frames [count] long drawn with ``generator`` (on the sampler's device)."""
        u = torch.rand(count, 2, generator=generator, device=self.device)
        return self.frames_from_uniform(torch.floor(u * float(1 << _BITS)) / float(1 << _BITS))

    @torch.no_grad()
    def record(self, failed: torch.Tensor, frames: torch.Tensor, starts: torch.Tensor | None = None) -> None:
        """One control step of the environments: ``failed`` [N] bool (episodes that terminated, a fall or another
        termination rule) at motion frames ``frames`` [N] long, the episodes having started at frames ``starts``
        [N] long (needed with ``credit="start"``). Every call is one step of the average."""
        if self.credit == "start":
            if starts is None:
                raise ValueError("credit='start' needs the episodes' start frames (record(failed, frames, starts))")
            frames = starts
        counts = torch.bincount(self.bin_of(frames[failed]), minlength=self.num_bins).to(torch.float64)
        self.scores = (1.0 - self.alpha) * self.scores + self.alpha * counts

    def state_dict(self) -> dict[str, Any]:
        """The scores and the binning they belong to (tensors and plain values)."""
        return {"scores": self.scores.clone(), "bin_frames": self.bin_frames, "num_starts": self.num_starts}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (same clip and bin length)."""
        if (int(state["bin_frames"]), int(state["num_starts"])) != (self.bin_frames, self.num_starts):
            raise ValueError(f"the start-sampler state has bins of {state['bin_frames']} frames over "
                             f"{state['num_starts']} start frames, this sampler {self.bin_frames} over "
                             f"{self.num_starts}")
        self.scores = state["scores"].to(self.device, torch.float64).clone()
