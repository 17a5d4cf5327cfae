"""Configuration of the G1 tracking environments: :class:`EnvConfig` and the observation-noise table.

``gym.make_vec(id, num_envs=N, config=EnvConfig(...))`` and the keyword form ``gym.make_vec(id, num_envs=N,
kappa=100.0, ...)`` are equivalent; keywords given beside a ``config`` override its fields. Frozen dataclasses with a
docstring per field, so that the command line (tyro) can expose them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import tyro

from bcg.envs.checks import MAX_SEED, check_count, check_seed, is_real
from bcg.envs.dynamics import DYNAMICS_FIELDS, DYNAMICS_PARAMS, Dynamics
from bcg.envs.episode_layers import LAYER_FIELDS, EpisodeLayers
from bcg.envs.randomization import DomainRandomization

__all__ = ["DYNAMICS_FIELDS", "DYNAMICS_PARAMS", "FLAT_GROUPS", "LAYER_FIELDS", "MAX_REFERENCE_MARGIN",
           "REFERENCE_FIELDS", "MAX_SEED", "Dynamics", "EnvConfig", "EpisodeLayers", "ObservationNoise", "check_count",
           "check_seed"]

REFERENCE_FIELDS: tuple[str, ...] = ("reference_joint_margin",)
"""The EnvConfig fields that change the reference a policy tracks (besides the clip): policy files record them, and
a replay of a policy uses them, since with residual actions the reference is part of the action map."""

MAX_REFERENCE_MARGIN = 0.2
"""Largest ``reference_joint_margin`` [rad]."""

FLAT_GROUPS: dict[str, tuple[str, ...]] = {"dynamics": DYNAMICS_FIELDS, "layers": LAYER_FIELDS}
"""The option groups (of EnvConfig and of ``bcg train``'s config) whose fields are taken flat: by keyword
(``kappa=100.0``), as flags (``--kappa``, ``--adaptive-start``) and in run configs written before they were groups."""

@dataclass(frozen=True)
class ObservationNoise:
    """Half-widths of the uniform observation noise U(-n, n) per observation term (docs/method.md §7.1), used when
    domain randomisation turns observation noise on. Terms not listed get none."""

    root_rot_h: float = 0.05
    """Root orientation (6-D) [rad]."""
    root_lin_vel_h: float = 0.5
    """Root linear velocity [m/s]."""
    root_ang_vel_h: float = 0.2
    """Root angular velocity [rad/s]."""
    body_rot_h: float = 0.01
    """Body orientations (6-D each) [rad]."""
    joint_vel: float = 0.5
    """Hinge rates [rad/s]."""
    key_pos_h: float = 0.01
    """Key-body positions [m]."""
    root_pos_h: float = 0.25
    """Reference root position relative to the robot, each reference step [m]."""

    def half_width(self, term: str) -> float:
        """Noise half-width of an observation term of :func:`bcg.envs.observations.observation_layout`."""
        if term.startswith("ref"):
            base = term.split("_", 1)[1]
            return self.root_pos_h if base == "root_pos_h" else 0.0
        return float(getattr(self, term, 0.0)) if term != "root_pos_h" else 0.0


@dataclass(frozen=True)
class EnvConfig:
    """Every option of the G1 tracking environments (``BCG-G1-{Run,Jump,Fight,Dance}-v0``)."""

    motion_file: str | None = None
    """Reference: a packaged clip name (run, jump, fight, dance) or a file path (.npz / .csv); a pathlib.Path or a
    bcg.motion.Motion at the control period are accepted too. None: the environment id's own clip."""
    motion_fps: float | None = None
    """Frame rate of the motion file [Hz] (None: what the file or its name says; see bcg.motion.formats)."""
    motion_format: Literal["auto", "lafan1", "g1moves", "npz"] = "auto"
    """Motion file format (lafan1: CSV at 30 FPS; g1moves: CSV at 60 FPS)."""
    dynamics: tyro.conf.OmitArgPrefixes[Dynamics] = field(default_factory=Dynamics)
    """Contact stiffness, soft contact, Baumgarte factor, substeps and substep of the simulator (:class:`Dynamics`);
    the keyword form takes its fields flat (``kappa=100.0``)."""
    device: str = "cpu"
    """Torch / Warp device: "cpu" or "cuda[:K]"."""
    differentiable: bool = False
    """Keep the autograd graph through the simulator (vector env only); otherwise steps run under no_grad."""
    domain_randomization: bool | DomainRandomization = False
    """False (off), True (docs/method.md §7.3 ranges) or a DomainRandomization."""
    observation_noise: ObservationNoise = field(default_factory=ObservationNoise)
    """Half-widths of the observation noise (applied only when domain randomisation turns the noise on)."""
    reward: str | Callable[..., Any] = "tracking"
    """"tracking" (bcg.envs.rewards.TrackingReward) or a callable reward(sim, ref, ctx) -> [N]."""
    action_scale: float | tuple[float, ...] | None = None
    """s_a of q_des = q_default + offset + s_a tanh(a), scalar or [29] [rad]. None: per joint, the distance from
    the default pose to its farther joint limit divided by tanh(0.9), so that every target inside the joint range
    is reached with |a| <= 0.9 (plus the default-pose offset of domain randomisation)."""
    action_offset: Literal["default", "reference"] = "default"
    """What a zero action holds: "default" (q_des = q_default + offset + s_a tanh(a), docs/method.md §7.2) or
    "reference" (q_des = q_ref(t+1) + offset + s_a tanh(a): a residual on the phase-matched reference's joint
    positions at the frame the step lands on, so that a = 0 PD-tracks the clip and the policy learns corrections).
    The observation is the same in both; "reference" is what makes tracking learnable within a CPU budget
    (docs/shac.md)."""
    reference_joint_margin: float = 0.0
    """Keep the clip's joint angles this far [rad] inside the joint ranges (at most a quarter of a range): a clip held
    at a joint's stop puts the PD targets, the start states and the tracking reward there too (docs/envs.md). 0: the
    clip as loaded. Policy files record it, and a replay of the policy tracks the same reference."""
    max_episode_steps: int | None = None
    """Extra time limit in control steps (>= 1); the clip's end always truncates."""
    termination_height: float = 0.3
    """A pelvis below this height [m] ends the episode (fall)."""
    termination_distance: float = 1.0
    """A key body farther than this from its reference [m] ends the episode."""
    layers: tyro.conf.OmitArgPrefixes[EpisodeLayers] = field(default_factory=EpisodeLayers)
    """Deviation terminations, adaptive start sampling and demonstration replay (:class:`EpisodeLayers`), all off by
    default; the keyword form takes its fields flat (``adaptive_start=True``)."""
    ref_steps: int = 3
    """Number of future reference frames in the observation."""
    state_limit: float = 1e4
    """A qpos entry beyond this magnitude counts as diverged; qvel entries are bounded by bcg.sim.MAX_SPEED."""
    autoreset: bool = True
    """Reset finished environments inside step (SAME_STEP); False is for the single env."""
    render_mode: str | None = None
    """None or "rgb_array" (environment 0 and its reference ghost, MuJoCo offscreen)."""

    def __post_init__(self) -> None:
        if self.max_episode_steps is not None:
            object.__setattr__(self, "max_episode_steps", check_count("max_episode_steps", self.max_episode_steps))
        object.__setattr__(self, "ref_steps", check_count("ref_steps", self.ref_steps))
        if not isinstance(self.dynamics, Dynamics):
            raise TypeError(f"dynamics must be a bcg.envs.Dynamics, got {type(self.dynamics).__name__}")
        if self.motion_fps is not None and not (is_real(self.motion_fps) and self.motion_fps > 0):
            raise ValueError(f"motion_fps must be a finite number > 0 or None, got {self.motion_fps!r}")
        for name in ("termination_height", "termination_distance", "state_limit"):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not isinstance(self.layers, EpisodeLayers):
            raise TypeError(f"layers must be a bcg.envs.EpisodeLayers, got {type(self.layers).__name__}")
        if not (is_real(self.reference_joint_margin) and 0 <= self.reference_joint_margin <= MAX_REFERENCE_MARGIN):
            raise ValueError(f"reference_joint_margin must be a number in [0, {MAX_REFERENCE_MARGIN}] [rad], got "
                             f"{self.reference_joint_margin!r}")
        if self.state_limit <= 0 or self.termination_distance <= 0:
            raise ValueError("state_limit and termination_distance must be > 0, got "
                             f"{self.state_limit!r} and {self.termination_distance!r}")
        if self.render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {self.render_mode!r}")
        if not isinstance(self.domain_randomization, (bool, DomainRandomization)):
            raise TypeError("domain_randomization must be a bool or a DomainRandomization, got "
                            f"{type(self.domain_randomization).__name__}")
        if not isinstance(self.observation_noise, ObservationNoise):
            raise TypeError("observation_noise must be an ObservationNoise, got "
                            f"{type(self.observation_noise).__name__}")
        if self.action_offset not in ("default", "reference"):
            raise ValueError(f"action_offset must be 'default' or 'reference', got {self.action_offset!r}")
        if not (self.reward == "tracking" or callable(self.reward)):
            raise ValueError(f"reward must be 'tracking' or a callable reward(sim, ref, ctx), got {self.reward!r}")

    @property
    def randomization(self) -> DomainRandomization:
        """The :class:`DomainRandomization` this config asks for (``DomainRandomization.off()`` when False)."""
        dr = self.domain_randomization
        if dr is True:
            return DomainRandomization()
        if dr is False:
            return DomainRandomization.off()
        return dr

    @staticmethod
    def from_kwargs(config: EnvConfig | None = None, **kwargs: Any) -> EnvConfig:
        """``config`` (default ``EnvConfig()``) with the keyword fields replaced; the :class:`Dynamics` and
        :class:`EpisodeLayers` fields are taken flat (``kappa=100.0`` replaces ``dynamics.kappa``,
        ``adaptive_start=True`` ``layers.adaptive_start``); unknown keywords raise."""
        base = EnvConfig() if config is None else config
        if not isinstance(base, EnvConfig):
            raise TypeError(f"config must be an EnvConfig, got {type(base).__name__}")
        names = {f.name for f in dataclasses.fields(EnvConfig)}
        known = names.union(*FLAT_GROUPS.values())
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown environment option(s) {unknown}; EnvConfig fields are {sorted(known)}")
        for group, fields in FLAT_GROUPS.items():
            flat = {k: kwargs.pop(k) for k in fields if k in kwargs}
            if flat:
                kwargs[group] = dataclasses.replace(kwargs.get(group, getattr(base, group)), **flat)
        return dataclasses.replace(base, **kwargs) if kwargs else base
