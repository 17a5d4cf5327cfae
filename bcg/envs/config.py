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

from bcg.envs.randomization import DomainRandomization

__all__ = ["DYNAMICS_FIELDS", "DYNAMICS_PARAMS", "LAYER_FIELDS", "MAX_REFERENCE_MARGIN", "REFERENCE_FIELDS",
           "EnvConfig", "ObservationNoise", "check_count"]

DYNAMICS_PARAMS: dict[str, tuple[str, type]] = {
    "kappa": ("kappa", float), "substeps": ("substeps", int), "sim_dt": ("dt", float),
    "soft_contact_timeconst": ("soft_timeconst", float), "contact_beta": ("beta", float)}
"""Each dynamics field of EnvConfig: its :func:`bcg.sim.load_model` parameter and type."""

DYNAMICS_FIELDS: tuple[str, ...] = tuple(DYNAMICS_PARAMS)
"""The EnvConfig fields that set the simulator's dynamics (None: its default). Policy files record them, and a
replay of a policy uses them (:meth:`EnvConfig.sim_params` maps them onto :class:`bcg.sim.ContactParams`)."""

REFERENCE_FIELDS: tuple[str, ...] = ("reference_joint_margin",)
"""The EnvConfig fields that change the reference a policy tracks (besides the clip): policy files record them, and
a replay of a policy uses them, since with residual actions the reference is part of the action map."""

MAX_REFERENCE_MARGIN = 0.2
"""Largest ``reference_joint_margin`` [rad]."""

LAYER_FIELDS: tuple[str, ...] = (
    "termination_anchor_height", "termination_gravity_z", "termination_end_effector_height", "adaptive_start",
    "adaptive_start_bin_s", "adaptive_start_alpha", "adaptive_start_floor", "adaptive_start_credit",
    "replay_threshold")
"""The EnvConfig fields of the optional training layers (deviation termination, adaptive start sampling,
demonstration replay), all off by default; ``bcg train`` has an option of the same name for each."""


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


def check_count(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as a Python int >= ``minimum`` (numpy integers accepted); a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} of type {type(value).__name__}")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {int(value)}")
    return int(value)


MAX_SEED: int = 2**63 - 1
"""Largest seed an environment's ``reset`` accepts (seeds are integers in [0, MAX_SEED])."""


def check_seed(seed: Any) -> int | None:
    """``seed`` as a Python int in [0, MAX_SEED], or None; a clear error otherwise."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be None or an integer in [0, {MAX_SEED}], got {seed!r} of type "
                        f"{type(seed).__name__}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}] (2^63 - 1), got {int(seed)}")
    return int(seed)


def _real(v: Any) -> bool:
    """Whether ``v`` is a finite real number (bools are not)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


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
    kappa: float | None = None
    """Contact stiffness of the simulator [1/m] (None: the simulator's default, 300)."""
    soft_contact_timeconst: float | None = None
    """Time constant [s] of the soft normal contact (MuJoCo's solref[0]; 0.02 is MuJoCo's default): impacts are
    braked over several substeps as in MuJoCo; None: stopped within one (bcg.sim.ContactParams.soft_timeconst)."""
    contact_beta: float | None = None
    """Baumgarte factor of the contacts in [0, 1] (None: the simulator's 0.5); lower is a softer ground."""
    substeps: int | None = None
    """Physics substeps per control step (None: 4)."""
    sim_dt: float | None = None
    """Physics substep [s] (None: 0.005); the control period is substeps * sim_dt."""
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
    termination_anchor_height: float | None = None
    """Deviation rule: a pelvis height error above this [m] ends the episode (BeyondMimic: 0.25; None: off;
    bcg.envs.termination)."""
    termination_gravity_z: float | None = None
    """Deviation rule: a difference of the projected gravity's z component (pelvis frame) from the reference's above
    this ends the episode (BeyondMimic: 0.8; None: off)."""
    termination_end_effector_height: float | None = None
    """Deviation rule: an ankle or wrist height error above this [m] ends the episode (BeyondMimic: 0.25; None:
    off)."""
    adaptive_start: bool = False
    """Draw start frames in proportion to recent failures per bin of the clip, with a uniform floor
    (bcg.envs.start_sampling); False: uniform over the clip."""
    adaptive_start_bin_s: float = 1.0
    """Bin length of the adaptive start sampling [s]."""
    adaptive_start_alpha: float = 0.001
    """Weight of the newest control step in the per-bin exponential average of failures, in (0, 1]."""
    adaptive_start_floor: float = 0.1
    """Share of the start frames drawn uniformly over the clip when adaptive start sampling is on, in [0, 1]."""
    adaptive_start_credit: Literal["end", "start"] = "end"
    """Which bin a failed episode counts to in adaptive start sampling: where it ended (BeyondMimic's rule) or where
    it started (more starts where episodes begin that drift and fall seconds later)."""
    replay_threshold: float | None = None
    """Demonstration replay: after a step, rows whose tracking error exceeds this [m] are put back on the reference
    state of their frame, which also cuts their gradient to earlier steps (DiffMimic: 0.2 run, 0.4 jump / dance;
    None: off; bcg.envs.demo_replay)."""
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
        if self.substeps is not None:
            object.__setattr__(self, "substeps", check_count("substeps", self.substeps))
        if self.contact_beta is not None and not (isinstance(self.contact_beta, numbers.Real)
                                                  and 0 <= self.contact_beta <= 1):
            raise ValueError(f"contact_beta must be a number in [0, 1] or None, got {self.contact_beta!r}")
        for name in ("kappa", "sim_dt", "motion_fps", "soft_contact_timeconst"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {v!r}")
        from bcg.sim import ContactParams

        h = ContactParams.dt if self.sim_dt is None else float(self.sim_dt)
        if self.soft_contact_timeconst is not None and self.soft_contact_timeconst < 2 * h:
            raise ValueError(f"soft_contact_timeconst must be at least twice the physics substep ({2 * h:g} s), got "
                             f"{self.soft_contact_timeconst!r}")
        for name in ("termination_height", "termination_distance", "state_limit"):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Real) and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        for name in ("termination_anchor_height", "termination_gravity_z", "termination_end_effector_height",
                     "replay_threshold"):
            v = getattr(self, name)
            if v is not None and not (_real(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {v!r}")
        if not (_real(self.adaptive_start_bin_s) and self.adaptive_start_bin_s > 0):
            raise ValueError(f"adaptive_start_bin_s must be a finite number > 0 [s], got {self.adaptive_start_bin_s!r}")
        if not (_real(self.adaptive_start_alpha) and 0 < self.adaptive_start_alpha <= 1):
            raise ValueError(f"adaptive_start_alpha must be a number in (0, 1], got {self.adaptive_start_alpha!r}")
        if not (_real(self.adaptive_start_floor) and 0 <= self.adaptive_start_floor <= 1):
            raise ValueError(f"adaptive_start_floor must be a number in [0, 1], got {self.adaptive_start_floor!r}")
        if self.adaptive_start_credit not in ("end", "start"):
            raise ValueError(f"adaptive_start_credit must be 'end' or 'start', got {self.adaptive_start_credit!r}")
        if not isinstance(self.adaptive_start, bool):
            raise TypeError(f"adaptive_start must be a bool, got {self.adaptive_start!r}")
        if not (_real(self.reference_joint_margin) and 0 <= self.reference_joint_margin <= MAX_REFERENCE_MARGIN):
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

    def sim_params(self) -> dict[str, Any]:
        """The :func:`bcg.sim.load_model` parameters of the :data:`DYNAMICS_FIELDS` that are set (the others keep
        the simulator's defaults)."""
        return {param: cast(getattr(self, field)) for field, (param, cast) in DYNAMICS_PARAMS.items()
                if getattr(self, field) is not None}

    @staticmethod
    def from_kwargs(config: EnvConfig | None = None, **kwargs: Any) -> EnvConfig:
        """``config`` (default ``EnvConfig()``) with the keyword fields replaced; unknown keywords raise."""
        base = EnvConfig() if config is None else config
        if not isinstance(base, EnvConfig):
            raise TypeError(f"config must be an EnvConfig, got {type(base).__name__}")
        names = {f.name for f in dataclasses.fields(EnvConfig)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown environment option(s) {unknown}; EnvConfig fields are {sorted(names)}")
        return dataclasses.replace(base, **kwargs) if kwargs else base
