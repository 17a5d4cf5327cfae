"""What a ``bcg train`` run is: :class:`TrainConfig` (every option: agent, estimator, motion, preset, reward, env
options, limits), the presets, the command-line parser (:func:`parse_train_args`: the preset first, then every field
of the nested agent config) and the JSON form stored in run directories and checkpoints (:func:`config_to_dict`,
:func:`config_from_dict`, with :data:`LEGACY_DEFAULTS` for runs written before a field existed).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import tyro

from bcg.agents.checkpoint import (
    load_checkpoint,
)
from bcg.envs.config import FLAT_GROUPS
from bcg.envs.dynamics import Dynamics
from bcg.envs.episode_layers import EpisodeLayers
from bcg.parsing import parse_command

if TYPE_CHECKING:  # pragma: no cover - bound at parse time by _bind_types (plugins included)
    from bcg.agents.add import ADDConfig
    from bcg.agents.ppo import PPOConfig
    from bcg.agents.shac import SHACConfig
    from bcg.envs.config import EnvConfig
    from bcg.envs.randomization import DomainRandomization

    EstimatorChoice = Any


__all__ = [
    "CONTACT_RANDOMIZATION", "DEFAULT_ITERATIONS", "ENV_PRESETS", "LEGACY_DEFAULTS", "RECORDED_FIELDS",
    "TORQUE_LIMIT_RANDOMIZATION", "RUN_CONTROL_FIELDS", "TrainConfig", "check_motion", "config_from_dict",
    "config_to_dict", "default_config", "motion_name", "parse_train_args",
]


RUN_CONTROL_FIELDS: tuple[str, ...] = ("iterations", "max_time_s", "checkpoint_every", "resume", "branch", "out",
                                       "name", "device", "torch_threads", "update_threads", "overlap_critic_fit",
                                       "critic_fit_worker", "progress", "tensorboard", "eval_every", "eval_episodes",
                                       "eval_seconds")
"""TrainConfig fields a resumed run may change: how long and where it runs, not what it computes (the numbers are
exact on the device the checkpoint was written on)."""

RECORDED_FIELDS: tuple[str, ...] = ("motion_sha256",)
"""TrainConfig fields that bcg records rather than the user chooses; a resume checks them on their own (a checkpoint
written before they existed has None)."""


LEGACY_DEFAULTS: dict[str, Any] = {
    "schedule_over_time": False, "domain_randomization": False, "adaptive_start": False,
    "termination_anchor_height": None, "termination_gravity_z": None, "termination_end_effector_height": None,
    "adaptive_start_credit": "end", "contact_randomization": False, "torque_limit_randomization": False}
"""What a run's config meant by a field it does not have (written before the field existed): the behaviour then."""

CONTACT_RANDOMIZATION: dict[str, Any] = {
    "contact_beta": (0.1, 0.5), "contact_soft_timeconst": (0.01, 0.03), "contact_soft_share": 0.5}
"""The DomainRandomization ranges of --contact-randomization."""

TORQUE_LIMIT_RANDOMIZATION: dict[str, Any] = {"torque_limit_scale": (0.85, 1.2)}
"""The DomainRandomization range of --torque-limit-randomization."""

DEFAULT_ITERATIONS = 100
"""Iterations of a run given neither --iterations nor --max-time-s."""


ENV_PRESETS: dict[str, dict[str, Any]] = {
    "cpu-small": {"action_offset": "reference", "action_scale": 0.5},
    "paper": {"action_offset": "default", "action_scale": None},
}
"""The action map of each preset (what ``--action-offset`` / ``--action-scale`` default to). cpu-small: residuals
on the reference, 0.5 rad per unit of tanh(a); measured on the jump clip, this is what makes SHAC's progress visible
within minutes (docs/shac.md). paper: docs/method.md §7.2's absolute targets around the default pose at the env's
per-joint scale."""


def _shac_presets() -> dict[str, Any]:
    from bcg.agents.shac import PRESETS

    return PRESETS


def _ppo_presets() -> dict[str, Any]:
    from bcg.agents.ppo import PRESETS

    return PRESETS


def _add_default() -> Any:
    from bcg.agents.add import ADDConfig

    return ADDConfig()


def _estimator_default() -> Any:
    from bcg.estimators import make

    return make("bptt")


RANGE_RULES: dict[str, tuple[str, Any]] = {
    "friction_range": ("0 < LO <= HI", lambda lo, hi: 0 < lo <= hi),
    "torque_limit_range": ("0 < LO <= HI", lambda lo, hi: 0 < lo <= hi),
    "contact_dropout_range": ("0 <= LO <= HI <= 1", lambda lo, hi: 0 <= lo <= hi <= 1),
}
"""The range options LO HI of :class:`TrainConfig`: the rule each must satisfy (as its error states it), and the
check."""


@dataclass(frozen=True)
class TrainConfig:
    """Train an agent on a G1 tracking clip: SHAC through a gradient estimator, or PPO (stable-baselines3).

    Choose the estimator with --estimator NAME (bptt, grs, bcg or a plugin's); its parameters follow as
    --estimator.FIELD, or in the spec syntax of bcg compare and the studies, --estimator bcg:tau=300,branches=8. The
    preset (--preset) sets the agent config first; every --shac.FIELD / --ppo.FIELD overrides
    one field of it."""

    agent: Literal["shac", "ppo"] = "shac"
    """Learning algorithm: shac (first-order, through the estimator) or ppo (stable-baselines3 baseline)."""
    estimator: EstimatorChoice = field(default_factory=_estimator_default)
    """Gradient estimator of SHAC (--estimator NAME, its parameters as --estimator.FIELD); PPO takes bptt only."""
    motion: str = "jump"
    """Reference clip: run, jump, fight, dance, or the path of a .npz / .csv motion file."""
    preset: Literal["cpu-small", "paper"] = "cpu-small"
    """Agent config preset (PRESETS of the agent module), applied before the --shac.* / --ppo.* overrides."""
    reward: Literal["tracking", "add"] = "tracking"
    """tracking: the env's TrackingReward; add: the ADD adversarial imitation reward (options under --add.*)."""
    add: ADDConfig = field(default_factory=_add_default)
    """Options of the ADD reward and its discriminator (used with --reward add)."""
    shac: SHACConfig = field(default_factory=lambda: _shac_presets()["cpu-small"])
    """SHAC options (used with --agent shac); defaults: the preset's."""
    ppo: PPOConfig = field(default_factory=lambda: _ppo_presets()["cpu-small"])
    """PPO options (used with --agent ppo); defaults: the preset's."""
    iterations: int | None = None
    """Iterations to run in total (a resumed run continues up to this number); None: 100, or as many as --max-time-s
    allows when it is set. One SHAC iteration is one window; one PPO iteration one rollout and its update. The
    learning-rate schedule follows the agent config's own length."""
    max_time_s: float | None = None
    """Stop (checkpoint and export as at the end) once the run's training wall time reaches this [s] (None: no
    limit). Counted over the iterations only, across resumes."""
    schedule_over_time: bool | None = None
    """SHAC's linear learning-rate schedule runs over the time budget: its progress is the training time spent over
    --max-time-s instead of iteration / --shac.max-iterations (so a longer budget learns longer, not at the final
    rate). None: on when --max-time-s is set and --iterations is not. The learning rates then depend on the machine's
    speed, as the number of iterations does."""
    seed: int = 0
    """Seed of the networks, the action noise, the environment resets and the estimator's draws."""
    out: Path = Path("runs")
    """Folder in which the run directory is made."""
    name: str | None = None
    """Run directory name (default: MOTION-AGENT[-ESTIMATOR][-add]-PRESET-sSEED-YYYYmmdd-HHMMSS)."""
    checkpoint_every: int = 50
    """Write a checkpoint every this many iterations (0: only at the end and on Ctrl-C or SIGTERM)."""
    resume: Path | None = None
    """Continue a run: its run directory (latest checkpoint) or a checkpoint file. The other options default to the
    checkpoint's; only iterations, max_time_s, checkpoint_every, device, torch_threads, progress and tensorboard may
    differ. The run continues in its own directory, from its latest checkpoint only (an older one, or a checkpoint
    outside a run's checkpoints/ folder, needs --branch)."""
    branch: bool = False
    """With --resume: continue from the checkpoint in a new run directory (--out, --name; default: beside the run,
    RUN-from-iterN-YYYYmmdd-HHMMSS), leaving the run it came from as it is."""
    device: str = "cpu"
    """Torch / Warp device of the environment and the networks: cpu or cuda[:K]."""
    dynamics: tyro.conf.OmitArgPrefixes[Dynamics] = Dynamics()
    """The simulator's dynamics (bcg.envs.Dynamics), each None for the simulator's default: contact stiffness, soft
    contact, Baumgarte factor, substeps and substep (docs/simulator.md)."""
    domain_randomization: bool = True
    """Randomise physics, pushes, latency and observation noise (docs/envs.md ranges); --no-domain-randomization: off.
    On by default: one of the layers with which policies stand in MuJoCo (docs/shac.md, the ablation)."""
    contact_randomization: bool = True
    """Randomise how the ground gives, per environment: the contacts' Baumgarte factor U(0.1, 0.5), and for half the
    environments a soft ground (time constant U(0.01, 0.03) s, MuJoCo's 0.02 inside) (docs/envs.md). Works with or
    without --domain-randomization; --no-contact-randomization: off. On by default: with the next flag and failures
    credited where they happen, what makes SpinKarate stand in MuJoCo (docs/shac.md, the default's levers)."""
    torque_limit_randomization: bool = True
    """Randomise each actuator's torque limit (where its torque saturates) by U(0.85, 1.2) per environment (MuJoCo's
    hard clamp gives up to 16 % more than our smooth saturation near the limit; docs/envs.md). Works with or without
    --domain-randomization; --no-torque-limit-randomization: off (on by default, as the previous flag)."""
    torque_limit_range: tuple[float, float] | None = None
    """Range LO HI that --torque-limit-randomization draws each actuator's torque-limit scale from (None: U(0.85,
    1.2)). MuJoCo's clamp acts about as our saturation with every limit x1.19, so a range centred there (1.0 1.4)
    trains on push-offs as strong as MuJoCo's more often (benchmarks/push_off_randomization.py; docs/envs.md). Needs
    --torque-limit-randomization."""
    friction_range: tuple[float, float] | None = None
    """Range LO HI of the ground friction coefficient drawn per environment (None: domain randomisation's U(0.3, 1.2),
    or the model's 0.8 without it). A lower range trains on feet that slide and turn more freely: in MuJoCo a foot
    pivoting under load behaves like ours at mu of about 0.3 (docs/shac.md, SpinKarate). Works with or without
    --domain-randomization."""
    contact_dropout_range: tuple[float, float] | None = None
    """Range LO HI in [0, 1] of the probability, drawn per environment, that a foot sphere near the ground (less than
    2 mm deep) has no contact in a substep (None: never). MuJoCo's contacts, found once per 5 ms step, sometimes miss
    a toe that rocks off the ground for a step, and it sinks deep into MuJoCo's soft ground; this trains on such
    steps, at random (docs/envs.md, docs/shac.md). Works with or without --domain-randomization."""
    max_episode_steps: int | None = None
    """Extra time limit of an episode in control steps (None: the clip's end)."""
    reference_joint_margin: float = 0.0
    """Keep the clip's joint angles this far [rad] inside the joint ranges (0: the clip as loaded): a clip held at a
    joint's stop (e.g. an ankle roll) otherwise asks the policy to stand on it there (docs/envs.md)."""
    action_offset: Literal["default", "reference"] | None = None
    """What a zero action holds: default (the default pose) or reference (residual actions on the clip's joint
    positions); None: the preset's (cpu-small: reference, paper: default). Both agents get the same action map."""
    action_scale: float | None = None
    """PD-target change per unit of tanh(a) [rad] for every joint; None: the preset's (cpu-small: 0.5, paper: the
    env's per-joint default, which reaches the farther joint limit at |a| = 0.9)."""
    action_scale_torque: float | None = None
    """Per-joint action scale in torque units: a full action moves joint j's target by this fraction of its torque
    limit over its kp (s_j = f L_j / kp_j; 0.5: 0.22 rad on the hips, 0.35 on the knees, 0.125 on ankles and arms).
    Overrides --action-scale; None: off."""
    layers: tyro.conf.OmitArgPrefixes[EpisodeLayers] = EpisodeLayers.training()
    """Deviation terminations, adaptive start sampling and demonstration replay (bcg.envs.EpisodeLayers): on by
    default, BeyondMimic's three terminations and start frames drawn where episodes that fail began
    (docs/start_states_and_replay.md); --no-adaptive-start, --termination-anchor-height None, ... turn them off."""
    torch_threads: int | None = 1
    """torch.set_num_threads for the run (None: torch's default). 1 is the fastest during the rollout, where the
    simulator's own threads use the cores."""
    update_threads: int | None = None
    """torch threads of SHAC's critic fit and PPO's update (None: every core when their minibatches are large, as
    with the paper's sizes, and OpenMP spins (OMP_WAIT_POLICY=ACTIVE, for a machine of your own); else 1;
    bcg.agents.threads)."""
    overlap_critic_fit: bool = True
    """SHAC: fit the critics on a second thread while the actor's backward pass, the ADD update and the next window's
    steps run (the same numbers bit for bit; the critic columns of metrics.csv are then the previous window's fit;
    benchmarks/critic_overlap.py; bcg.agents.shac.SHAC). Only where the fit and the rest use one torch thread each."""
    critic_fit_worker: Literal["thread", "process"] = "process"
    """SHAC, with overlap_critic_fit: run the overlapping fit in a worker process (outside the interpreter's lock, the
    critics in shared memory, about 230 MB; 0.77x the wall time per iteration of the thread on 2 cores) or on a second
    thread; the same numbers either way (bcg.agents.critic_fit)."""
    progress: bool = True
    """Show a progress bar with live figures."""
    tensorboard: bool = True
    """Write TensorBoard event files beside metrics.csv."""
    eval_every: int = 10
    """Evaluate the deterministic policy every this many iterations, after the first and after the last (0: never);
    the columns eval_tracking_error_cm, eval_fall_rate and eval_episode_s of metrics.csv. Not counted in
    wall_time_s or --max-time-s."""
    eval_episodes: int = 8
    """Evaluation episodes: start phases spread evenly over the clip (initial joint noise +-0.02 rad, seed 0)."""
    eval_seconds: float = 3.0
    """Longest evaluation episode [s] (each also ends at a fall or the clip's end)."""
    motion_sha256: tyro.conf.Suppress[str | None] = None
    """sha256 of the motion file, recorded when the run starts (a resume refuses a changed file); not an option."""

    def __post_init__(self) -> None:
        from bcg.envs.config import check_count
        from bcg.estimators import Estimator

        if self.iterations is not None:
            object.__setattr__(self, "iterations", check_count("iterations", self.iterations, 1))
        object.__setattr__(self, "checkpoint_every", check_count("checkpoint_every", self.checkpoint_every, 0))
        object.__setattr__(self, "eval_every", check_count("eval_every", self.eval_every, 0))
        object.__setattr__(self, "eval_episodes", check_count("eval_episodes", self.eval_episodes, 1))
        if not (isinstance(self.eval_seconds, numbers.Real) and math.isfinite(self.eval_seconds)
                and self.eval_seconds > 0):
            raise ValueError(f"eval_seconds must be a finite number > 0, got {self.eval_seconds!r}")
        for name, (rule, holds) in RANGE_RULES.items():
            r = getattr(self, name)
            if r is None:
                continue
            if not (len(r) == 2 and all(isinstance(x, numbers.Real) and math.isfinite(x) for x in r) and holds(*r)):
                raise ValueError(f"{name} must be two numbers LO HI with {rule}, got {r!r}")
            object.__setattr__(self, name, (float(r[0]), float(r[1])))  # a config file gives a list
        if self.torque_limit_range is not None and not self.torque_limit_randomization:
            raise ValueError("torque_limit_range is the range of --torque-limit-randomization, which is off "
                             "(--no-torque-limit-randomization): drop one of the two")
        for name, unit in (("action_scale", " [rad]"), ("action_scale_torque", "")):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0{unit} or None, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63 - 1], got {self.seed!r}")
        if self.torch_threads is not None:
            object.__setattr__(self, "torch_threads", check_count("torch_threads", self.torch_threads, 1))
        if self.update_threads is not None:
            object.__setattr__(self, "update_threads", check_count("update_threads", self.update_threads, 1))
        if self.max_time_s is not None and not (isinstance(self.max_time_s, numbers.Real) and self.max_time_s > 0):
            raise ValueError(f"max_time_s must be a number > 0 or None, got {self.max_time_s!r}")
        if self.schedule_over_time and self.max_time_s is None:
            raise ValueError("schedule_over_time needs --max-time-s (the budget the schedule runs over)")
        object.__setattr__(self, "out", Path(self.out))
        if self.resume is not None:
            object.__setattr__(self, "resume", Path(self.resume))
        if self.agent not in ("shac", "ppo"):
            raise ValueError(f"agent must be 'shac' or 'ppo', got {self.agent!r}")
        if self.reward not in ("tracking", "add"):
            raise ValueError(f"reward must be 'tracking' or 'add', got {self.reward!r}")
        if not isinstance(self.estimator, Estimator):
            raise TypeError(f"estimator must be a bcg.estimators.Estimator, got {type(self.estimator).__name__}")
        if self.agent == "ppo" and self.estimator.name != "bptt":
            raise ValueError(f"--estimator {self.estimator.name} applies to SHAC only: PPO does not differentiate "
                             "the simulator (leave --estimator at bptt with --agent ppo)")
        if self.name is not None and (not self.name or "/" in self.name or self.name in (".", "..")):
            raise ValueError(f"name must be a plain directory name, got {self.name!r}")
        if self.branch and self.resume is None:
            raise ValueError("--branch continues a checkpoint in a new run directory; it needs --resume")
        check_motion(self.motion)
        if self.motion not in _packaged_motions():  # the run must find its clip from any folder
            object.__setattr__(self, "motion", str(Path(self.motion).resolve()))
        self.env_config()  # the env options are checked by EnvConfig itself (kappa > 0, max_episode_steps >= 1)

    def schedule_follows_time(self) -> bool:
        """Whether SHAC's learning-rate schedule runs over --max-time-s (``schedule_over_time``, resolved)."""
        if self.schedule_over_time is not None:
            return bool(self.schedule_over_time)
        return self.max_time_s is not None and self.iterations is None

    def iteration_limit(self) -> int | None:
        """The iterations to run: ``iterations``; else no limit (until ``max_time_s``) with a time limit; else 100."""
        if self.iterations is not None:
            return self.iterations
        return None if self.max_time_s is not None else DEFAULT_ITERATIONS

    def env_config(self) -> EnvConfig:
        """The :class:`~bcg.envs.EnvConfig` of the run (differentiable for SHAC)."""
        from bcg.envs.config import REFERENCE_FIELDS, EnvConfig

        preset = ENV_PRESETS[self.preset]
        offset = preset["action_offset"] if self.action_offset is None else self.action_offset
        scale = preset["action_scale"] if self.action_scale is None else self.action_scale
        if self.action_scale_torque is not None:
            from bcg.envs.actions import torque_action_scale
            from bcg.robots import g1

            scale = tuple(float(x) for x in torque_action_scale(g1.KP, g1.TORQUE_LIMITS, self.action_scale_torque))
        return EnvConfig(motion_file=self.motion, dynamics=self.dynamics, device=self.device,
                         differentiable=self.agent == "shac", domain_randomization=self._randomization(),
                         max_episode_steps=self.max_episode_steps, action_offset=offset, action_scale=scale,
                         layers=self.layers, **{name: getattr(self, name) for name in REFERENCE_FIELDS})

    def _randomization(self) -> bool | DomainRandomization:
        """EnvConfig.domain_randomization: the flag, or the ranges with the contact, torque-limit and friction draws
        added."""
        from bcg.envs.randomization import DomainRandomization

        extra = {**(CONTACT_RANDOMIZATION if self.contact_randomization else {}),
                 **(TORQUE_LIMIT_RANDOMIZATION if self.torque_limit_randomization else {}),
                 **({"torque_limit_scale": self.torque_limit_range} if self.torque_limit_range else {}),
                 **({"friction": self.friction_range} if self.friction_range else {}),
                 **({"dropout_probability": self.contact_dropout_range} if self.contact_dropout_range else {})}
        if not extra:
            return bool(self.domain_randomization)
        base = DomainRandomization() if self.domain_randomization else DomainRandomization.off()
        return dataclasses.replace(base, **extra)

    @property
    def agent_config(self) -> Any:
        """The config of the chosen agent (``shac`` or ``ppo``)."""
        return self.shac if self.agent == "shac" else self.ppo


def _packaged_motions() -> tuple[str, ...]:
    from bcg.motion import PACKAGED_MOTIONS

    return PACKAGED_MOTIONS


def check_motion(motion: str) -> None:
    packaged = _packaged_motions()
    if not isinstance(motion, str) or not motion:
        raise ValueError(f"motion must be a clip name or a path, got {motion!r}")
    if motion in packaged:
        return
    p = Path(motion)
    if p.suffix.lower() in (".npz", ".csv") and p.is_file():
        return
    if p.suffix.lower() in (".npz", ".csv"):
        raise ValueError(f"motion file {motion!r} does not exist (expected one of {', '.join(packaged)} or the path "
                         "of an existing .npz / .csv motion file)")
    raise ValueError(f"unknown motion {motion!r}: expected one of {', '.join(packaged)} or the path of an "
                     "existing .npz / .csv motion file")


def motion_name(motion: str) -> str:
    return Path(motion).stem if motion.lower().endswith((".npz", ".csv")) else motion


# -------------------------------------------------------------------------------------------- parsing


def _bind_types() -> None:
    """Bind the names :class:`TrainConfig`'s annotations refer to, for tyro and :func:`config_from_dict`: the agent
    config classes and ``EstimatorChoice``, the union over the estimators registered *now* (plugins included), one
    tyro subcommand each."""
    from bcg.agents.add import ADDConfig
    from bcg.agents.ppo import PPOConfig
    from bcg.agents.shac import SHACConfig
    from bcg.envs.config import EnvConfig
    from bcg.estimators import ESTIMATORS

    choices = tuple(Annotated[cls, tyro.conf.subcommand(name)] for name, cls in ESTIMATORS.items())
    g = globals()
    g.update(ADDConfig=ADDConfig, PPOConfig=PPOConfig, SHACConfig=SHACConfig, EnvConfig=EnvConfig,
             EstimatorChoice=Union[choices] if len(choices) > 1 else choices[0])  # noqa: UP007 - a runtime union


def default_config(agent: str = "shac", preset: str = "cpu-small", **overrides: Any) -> TrainConfig:
    """A TrainConfig with ``agent`` and both agent configs at ``preset`` (then ``overrides``)."""
    shac, ppo = _shac_presets(), _ppo_presets()
    for name, table in (("shac", shac), ("ppo", ppo)):
        if preset not in table:
            raise ValueError(f"unknown preset {preset!r} for {name}; presets: {', '.join(table)}")
    return TrainConfig(agent=agent, preset=preset, shac=shac[preset], ppo=ppo[preset], **overrides)  # type: ignore


def _split_estimator(args: list[str]) -> tuple[list[str], str | None, dict[str, Any]]:
    """Take ``--estimator SPEC`` / ``--estimator=SPEC`` / ``estimator:NAME`` out of ``args``: (the other args, the
    estimator's name or None, its parameters). SPEC is a name or ``name:key=value,...``
    (:func:`bcg.estimators.parse_spec`); the name is checked against the registry (the message lists it)."""
    from bcg.estimators import ESTIMATORS, parse_spec

    out, spec = [], None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--estimator" or a.startswith("--estimator="):
            if a == "--estimator":
                if i + 1 >= len(args):
                    raise ValueError(f"--estimator needs a name; registered: {', '.join(ESTIMATORS)}")
                spec, i = args[i + 1], i + 2
            else:
                spec, i = a.split("=", 1)[1], i + 1
            continue
        if a.startswith("estimator:"):
            spec, i = a.split(":", 1)[1], i + 1
            continue
        out.append(a)
        i += 1
    if spec is None:
        return out, None, {}
    name, params = parse_spec(spec)
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}")
    return out, name, params


def parse_train_args(args: Sequence[str], prog: str = "bcg train") -> TrainConfig:
    """The :class:`TrainConfig` of a ``bcg train`` command line.

    Two passes: the first reads ``--agent``, ``--preset`` and ``--resume`` and builds the defaults (the preset's agent
    configs, or the checkpoint's whole config when resuming); the second is tyro over :class:`TrainConfig` with those
    defaults, so ``--shac.FIELD`` overrides one field of the preset. Raises ``ValueError`` (or
    :class:`~bcg.agents.checkpoint.CheckpointError`) with a clear message on bad values."""
    _bind_types()
    rest, est_name, est_params = _split_estimator(list(args))
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--agent", default=None)
    first.add_argument("--preset", default=None)
    first.add_argument("--resume", default=None)
    known, _ = first.parse_known_args(rest)
    if known.resume is not None and not any(a in ("-h", "--help") for a in rest):
        ckpt = load_checkpoint(known.resume)
        base = config_from_dict(ckpt.config)
        base = dataclasses.replace(base, resume=Path(known.resume), branch=False)  # a branch's resume is in place
    else:
        base = default_config(known.agent or "shac", known.preset or "cpu-small")
    if est_name is not None and (est_name != base.estimator.name or est_params):
        from bcg.estimators import make

        try:
            base = dataclasses.replace(base, estimator=make(est_name, **est_params))
        except TypeError as exc:  # a parameter the estimator does not have
            raise ValueError(f"--estimator: {exc}") from None
    # the subcommand token selects the estimator's fields; a bare --help shows the top level (all subcommands)
    asks_help = any(a in ("-h", "--help") for a in rest)
    token = [] if asks_help and est_name is None else [f"estimator:{est_name or base.estimator.name}"]
    return parse_command(TrainConfig, token + rest, prog=prog, default=base, config=(tyro.conf.CascadeSubcommandArgs,))


# -------------------------------------------------------------------------------------------- config <-> JSON


def _to_plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        from bcg.estimators import Estimator

        d = {f.name: _to_plain(getattr(v, f.name)) for f in dataclasses.fields(v) if f.init}
        return {"name": v.name, **d} if isinstance(v, Estimator) else d
    if isinstance(v, (list, tuple)):
        return [_to_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _to_plain(x) for k, x in v.items()}
    if isinstance(v, Path):
        return str(v)
    return v


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as JSON-able values (the estimator as ``{"name": ..., **its fields}``; tuples as lists)."""
    return _to_plain(cfg)


def _from_plain(default: Any, value: Any, where: str) -> Any:
    """``value`` (from JSON) shaped like ``default``: dataclasses rebuilt field by field, lists back to tuples."""
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: expected an object, got {value!r}")
        names = {f.name for f in dataclasses.fields(default) if f.init}
        unknown = sorted(set(value) - names - {"name"})
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown} for {type(default).__name__}")
        kw = {k: _from_plain(getattr(default, k), value[k], f"{where}.{k}") for k in names if k in value}
        return dataclasses.replace(default, **kw)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(default, Path) and isinstance(value, str):
        return Path(value)
    return value


def config_from_dict(d: Mapping[str, Any]) -> TrainConfig:
    """Inverse of :func:`config_to_dict` (e.g. a checkpoint's or config.json's config)."""
    from bcg.estimators import ESTIMATORS, make

    _bind_types()
    d = dict(d)
    # runs written before the action-map options had absolute targets at the env's per-joint scale
    d.setdefault("action_offset", "default")
    # runs written before the time-driven schedule ran SHAC's schedule over iterations; runs written before the
    # start-state and termination layers (or before they were on by default) had none of them
    for key, old_default in LEGACY_DEFAULTS.items():
        d.setdefault(key, old_default)
    # runs written before the dynamics and the episode layers were option groups had them flat (kappa,
    # adaptive_start, ...); the legacy defaults above are flat too, and a group that is there wins over them
    for group, fields in FLAT_GROUPS.items():
        flat = {k: d.pop(k) for k in fields if k in d}
        if flat:
            d[group] = {**flat, **d.get(group, {})}
    base = default_config(d.get("agent", "shac"), d.get("preset", "cpu-small"))
    est = d.pop("estimator", None)
    if est is not None:
        name = est.get("name")
        if name not in ESTIMATORS:
            raise ValueError(f"config: unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}")
        base = dataclasses.replace(base, estimator=_from_plain(make(name), est, "estimator"))
    return _from_plain(base, d, "config")


# -------------------------------------------------------------------------------------------- run directory
