"""The optional layers that decide where episodes start, when they end early and when a row is put back on its
reference, declared once: :class:`EpisodeLayers`. Imports nothing heavy, so that command-line parsers can embed it.

An environment has all of them off unless asked (``EnvConfig.layers``); ``bcg train`` turns adaptive start sampling
and the deviation terminations on (:meth:`EpisodeLayers.training`), the settings with which its policies stand in
MuJoCo (docs/shac.md, the ablation)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from bcg.envs.checks import is_real

__all__ = ["LAYER_FIELDS", "EpisodeLayers"]


@dataclass(frozen=True)
class EpisodeLayers:
    """Deviation terminations (bcg.envs.termination), adaptive start sampling (bcg.envs.start_sampling) and
    demonstration replay (bcg.envs.demo_replay) of a tracking env; each rule None or False is off. On the command
    line as flat flags (``--adaptive-start``, ``--termination-anchor-height``, ...)."""

    termination_anchor_height: float | None = None
    """End an episode when the pelvis height error exceeds this [m] (BeyondMimic's 0.25; None: off)."""
    termination_gravity_z: float | None = None
    """End an episode when the projected gravity's z component (pelvis frame) differs from the reference's by more
    than this (BeyondMimic's 0.8; None: off)."""
    termination_end_effector_height: float | None = None
    """End an episode when an ankle or wrist height error exceeds this [m] (BeyondMimic's 0.25; None: off)."""
    adaptive_start: bool = False
    """Start episodes where they fail: start frames drawn in proportion to recent failures per bin of the clip, with
    a uniform floor (docs/start_states_and_replay.md); off (--no-adaptive-start): uniform over the clip."""
    adaptive_start_bin_s: float = 1.0
    """Bin length of the adaptive start sampling [s]."""
    adaptive_start_alpha: float = 0.001
    """Weight of the newest control step in the per-bin exponential average of failures, in (0, 1]."""
    adaptive_start_floor: float = 0.1
    """Share of the start frames drawn uniformly over the clip when adaptive start sampling is on, in [0, 1]."""
    adaptive_start_credit: Literal["end", "start"] = "end"
    """Which bin a failed episode counts to: where it ended (BeyondMimic's rule) or where it started (more starts
    where episodes begin that drift and fall seconds later); docs/start_states_and_replay.md."""
    replay_threshold: float | None = None
    """Demonstration replay: after a step, rows whose tracking error exceeds this [m] are put back on the reference
    state of their frame, which also cuts their gradient to earlier steps (DiffMimic: 0.2 run, 0.4 jump / dance;
    None: off)."""

    def __post_init__(self) -> None:
        for name in ("termination_anchor_height", "termination_gravity_z", "termination_end_effector_height",
                     "replay_threshold"):
            v = getattr(self, name)
            if v is not None and not (is_real(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {v!r}")
        if not isinstance(self.adaptive_start, bool):
            raise TypeError(f"adaptive_start must be a bool, got {self.adaptive_start!r}")
        if not (is_real(self.adaptive_start_bin_s) and self.adaptive_start_bin_s > 0):
            raise ValueError(f"adaptive_start_bin_s must be a finite number > 0 [s], got {self.adaptive_start_bin_s!r}")
        if not (is_real(self.adaptive_start_alpha) and 0 < self.adaptive_start_alpha <= 1):
            raise ValueError(f"adaptive_start_alpha must be a number in (0, 1], got {self.adaptive_start_alpha!r}")
        if not (is_real(self.adaptive_start_floor) and 0 <= self.adaptive_start_floor <= 1):
            raise ValueError(f"adaptive_start_floor must be a number in [0, 1], got {self.adaptive_start_floor!r}")
        if self.adaptive_start_credit not in ("end", "start"):
            raise ValueError(f"adaptive_start_credit must be 'end' or 'start', got {self.adaptive_start_credit!r}")

    @classmethod
    def training(cls) -> EpisodeLayers:
        """``bcg train``'s default: BeyondMimic's three deviation terminations and adaptive start sampling crediting
        a failure to the bin where its episode ended (BeyondMimic's rule); no demonstration replay."""
        return cls(termination_anchor_height=0.25, termination_gravity_z=0.8, termination_end_effector_height=0.25,
                   adaptive_start=True, adaptive_start_credit="end")


LAYER_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EpisodeLayers))
"""The fields of :class:`EpisodeLayers`; ``bcg train`` and the keyword form of the envs take them flat."""
