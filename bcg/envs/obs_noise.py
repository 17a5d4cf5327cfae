"""Observation noise of the G1 tracking environments: uniform, per entry, a function of each row's key and step.

The policy sees ``obs + noise``; a critic reads the noise-free observation (``info["critic_obs"]``). The noise of a
row at a step is a counter-based draw of its ``rng_key`` and ``episode_steps`` (:class:`~bcg.envs.draws.
CounterDraws`), so ``obs`` and ``final_obs`` of a step carry the same noise and a restored state repeats it.
"""

from __future__ import annotations

import torch

from bcg.envs.draws import STREAM_NOISE, CounterDraws
from bcg.envs.state import EnvState

__all__ = ["ObservationNoiseLayer"]


class ObservationNoiseLayer:
    """``noise(state) -> [N, D]``: U(-w, w) per observation entry with half-widths ``half_width`` [D].

    Args:
        half_width: [D] half-width of each observation entry's noise (observation units).
        draws: the env's counter-based draws.
        on: whether the env adds the noise (``DomainRandomization.observation_noise``).
    """

    def __init__(self, half_width: torch.Tensor, draws: CounterDraws, on: bool) -> None:
        self.half_width, self.draws, self.on = half_width, draws, bool(on)

    def __call__(self, s: EnvState) -> torch.Tensor:
        """Noise [N, D] of state ``s`` (detached)."""
        u = self.draws.uniform(s.rng_key, s.episode_steps, int(self.half_width.numel()), STREAM_NOISE)
        return (2 * u - 1) * self.half_width
