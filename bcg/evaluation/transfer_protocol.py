"""The replay protocol of ``bcg evaluate``, ``bcg curve`` and the studies: :class:`TransferOptions`.

E = phases x seeds episodes run side by side; episode (seed s, phase k) starts at frame floor(k (T - 1) / phases) of
the T-frame clip on the reference, with uniform joint-angle noise of half-width ``joint_noise`` drawn from seed s, and
runs to a fall, an unstable state, the clip's end or ``seconds`` (:mod:`bcg.evaluation.mujoco_transfer` runs it).
Declared once here, and embedded in the commands' own configs, so every command offers the same options with the
same defaults and checks. This module imports nothing heavy, so that the command line can build its parsers from it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import tyro

from bcg.envs.dynamics import Dynamics

__all__ = ["TransferOptions", "check_refine"]


def check_refine(refine: Any, name: str = "mujoco_refine") -> int:
    """``refine`` (MuJoCo steps per substep) as an int; a ValueError naming ``name`` unless it is an integer >= 1."""
    if isinstance(refine, bool) or not isinstance(refine, (int, float)) or int(refine) != refine or refine < 1:
        raise ValueError(f"{name} must be an integer >= 1 (MuJoCo steps per substep), got {refine!r}")
    return int(refine)


@dataclass(frozen=True)
class TransferOptions:
    """How a policy is replayed (the protocol of the module docstring)."""

    phases: int = 4
    """Start phases per seed, spread evenly over the clip: episode k starts at frame floor(k (T - 1) / phases)."""
    seeds: tuple[int, ...] = (0, 1)
    """Seeds; each draws the initial joint-angle noise of its episodes."""
    seconds: float | None = None
    """Longest episode [s] (None: to the clip's end)."""
    joint_noise: float = 0.02
    """Half-width of the uniform initial joint-angle noise [rad] (0: every seed starts exactly on the reference)."""
    mujoco_refine: int = 1
    """MuJoCo steps per substep of the policy's dynamics: 1 steps MuJoCo at the MJCF's own 5 ms, 5 at 1 ms (the
    control period stays the policy's). A finer step checks whether a fall in MuJoCo is the policy's or the 5 ms
    step's: at 5 ms a toe driven down by a saturated ankle can lose its contact for a whole step and sink tens of
    millimetres (46 mm in a jump's push-off, 3.4 mm at 1 ms; docs/evaluation.md, *MuJoCo's own step*)."""
    dynamics: tyro.conf.OmitArgPrefixes[Dynamics] = Dynamics()
    """Dynamics of the replay that replace the policy's (each None: the policy's, else the simulator's default), for
    example our simulator's contact stiffness (kappa) or both simulators' control step (substeps, sim_dt)."""

    def __post_init__(self) -> None:
        if isinstance(self.phases, bool) or int(self.phases) != self.phases or self.phases < 1:
            raise ValueError(f"phases must be an integer >= 1, got {self.phases!r}")
        if not self.seeds or any(isinstance(s, bool) or int(s) != s or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be one or more integers >= 0, got {self.seeds!r}")
        if self.seconds is not None and not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"seconds must be a finite value > 0 or None, got {self.seconds!r}")
        if not (math.isfinite(self.joint_noise) and self.joint_noise >= 0):
            raise ValueError(f"joint_noise must be a finite value >= 0 [rad], got {self.joint_noise!r}")
        check_refine(self.mujoco_refine)
        if not isinstance(self.dynamics, Dynamics):
            raise TypeError(f"dynamics must be a bcg.envs.Dynamics, got {type(self.dynamics).__name__}")

    def digest_fields(self) -> dict[str, Any]:
        """The options as a flat dict for the names of evaluation folders: every field, the dynamics' stiffness as
        ``kappa``, its other fields and ``mujoco_refine`` only when set (the layout from before the dynamics were one
        option group and MuJoCo's step could be refined, so that folders written then keep their names)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("dynamics",
                                                                                              "mujoco_refine")}
        refine = {"mujoco_refine": self.mujoco_refine} if self.mujoco_refine != 1 else {}
        return {**d, "kappa": self.dynamics.kappa, **self.dynamics.chosen(), **refine}

    @property
    def num_episodes(self) -> int:
        """E = phases x seeds."""
        return self.phases * len(self.seeds)
