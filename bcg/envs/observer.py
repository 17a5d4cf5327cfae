"""The env's observation of simulated features against the clip: ``observer(sim, frame) -> obs [N, D]``.

The robot part comes from the simulated :class:`~bcg.motion.features.Features`, the reference part from the clip's
frames ``frame + 1 .. frame + ref_steps`` (clamped to the clip), as :func:`bcg.envs.observations.observation` lays
them out. On the CPU one Warp launch computes it (:class:`~bcg.envs.warp_observation.WarpObservation`, the same bits,
differentiable); elsewhere, or with ``use_warp`` off, the torch formula.
"""

from __future__ import annotations

import torch

from bcg.envs.observations import ReferenceTable, observation, observation_layout
from bcg.envs.warp_observation import WarpObservation
from bcg.motion.features import Features

__all__ = ["Observer"]


class Observer:
    """Noise-free observations of simulated features at motion frames.

    Args:
        ref: the reference :class:`Features` at every frame of the clip ([F] rows).
        nb: bodies; nk: key bodies; nj: hinges (the observation's sizes).
        ref_steps: reference frames shown ahead.
        device: where the observations are made; the Warp path runs on the CPU only.
    """

    def __init__(self, ref: Features, nb: int, nk: int, nj: int, ref_steps: int, device: torch.device) -> None:
        self.table = ReferenceTable.of(ref)
        self.num_frames = int(ref.root_pos_w.shape[0])
        self.future = torch.arange(1, int(ref_steps) + 1, device=device)
        """Frame offsets of the reference part [ref_steps]."""
        self.layout: list[tuple[str, int]] = observation_layout(nb, nk, nj, int(ref_steps))
        """Ordered ``(term, size)`` of the observation."""
        self.dim = sum(s for _, s in self.layout)
        """Observation size D."""
        self.warp = WarpObservation(self.table, nb, nj, nk, int(ref_steps)) if device.type == "cpu" else None
        if self.warp is not None and self.warp.dim != self.dim:
            raise RuntimeError(f"WarpObservation has {self.warp.dim} entries, the layout {self.dim}")
        self.use_warp = self.warp is not None
        """Whether the Warp launch runs (the env switches it with its other Warp paths)."""

    def __call__(self, sim: Features, frame: torch.Tensor) -> torch.Tensor:
        """Observation [N, D] of features ``sim`` ([N] rows) at motion frames ``frame`` [N] long."""
        fut = (frame[:, None] + self.future).clamp(0, self.num_frames - 1)  # valid rows for the Warp launch too
        if self.use_warp and WarpObservation.accepts(sim):
            return self.warp(sim, fut)
        return observation(sim, self.table, fut)
