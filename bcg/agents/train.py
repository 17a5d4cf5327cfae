"""``bcg train`` and ``bcg export``: the training loop around any :class:`~bcg.agents.base.Agent` and its artefacts.

:class:`TrainConfig` is every option of a run (agent, estimator, motion, preset, reward, env options, iterations,
checkpoints); :func:`parse_train_args` turns a command line into one (the preset is applied first, then every field of
the nested agent config can be overridden); :func:`train` builds the agent and runs a :class:`Trainer`, which owns a
run directory::

    runs/jump-shac-bcg-cpu-small-s0-20261201-0930/
        config.json        the resolved TrainConfig
        versions.json      python, torch, warp, mujoco, gymnasium, stable-baselines3, tyro, numpy, bcg, git commit
        metrics.csv        one row per iteration: iteration, samples, wall_time_s, METRIC_NAMES, the agent's extras
        tensorboard/       TensorBoard event files with the same scalars (step = iteration)
        checkpoints/       iter_NNNNNN.pt every checkpoint_every iterations, at the end and on Ctrl-C or SIGTERM
        policy.pt          the self-contained policy (bcg.agents.export) at the end

``--resume RUN_DIR_OR_CHECKPOINT`` continues a run in its own directory: metrics.csv is rewritten from the
checkpoint's rows (anything logged after the checkpoint is dropped) and the run goes on exactly as an uninterrupted
one would (same numbers on the same device; the tests compare the rows).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import io
import json
import math
import numbers
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import tyro

from bcg.agents.base import METRIC_NAMES
from bcg.agents.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_compatible,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    verify_state_fits,
)
from bcg.errors import UserError
from bcg.files import remove_stale_temporaries
from bcg.parsing import parse_command

if TYPE_CHECKING:  # pragma: no cover - bound at parse time by _bind_types (plugins included)
    from bcg.agents.add import ADDConfig
    from bcg.agents.ppo import PPOConfig
    from bcg.agents.shac import SHACConfig
    from bcg.envs.config import EnvConfig
    from bcg.envs.randomization import DomainRandomization

    EstimatorChoice = Any

__all__ = ["RUN_CONTROL_FIELDS", "TrainConfig", "Trainer", "build_agent", "checkpoint_export", "collect_versions",
           "config_from_dict", "config_to_dict", "default_config", "export_run", "parse_train_args", "run_name",
           "train"]

FIXED_COLUMNS: tuple[str, ...] = ("iteration", "samples", "wall_time_s")
"""The trainer's own metrics.csv columns, before :data:`~bcg.agents.base.METRIC_NAMES` and the agent's extras."""

EVAL_COLUMNS: dict[str, str] = {
    "eval_tracking_error_cm": "E_track of the deterministic policy on the fixed evaluation episodes [cm]",
    "eval_fall_rate": "fraction of the evaluation episodes that ended in a fall",
    "eval_episode_s": "mean length of the evaluation episodes [s] (at most --eval-seconds)",
}
"""Columns of the periodic evaluation (NaN on iterations without one): the policy's mean action, replayed in our
simulator from fixed start phases with fixed initial noise, so that the numbers of a run are comparable over its
iterations and across methods (the training columns mix exploration noise and the changing episode phases)."""

RUN_CONTROL_FIELDS: tuple[str, ...] = ("iterations", "max_time_s", "checkpoint_every", "resume", "branch", "out",
                                       "name", "device", "torch_threads", "update_threads", "progress", "tensorboard",
                                       "eval_every", "eval_episodes", "eval_seconds")
"""TrainConfig fields a resumed run may change: how long and where it runs, not what it computes (the numbers are
exact on the device the checkpoint was written on)."""

RECORDED_FIELDS: tuple[str, ...] = ("motion_sha256",)
"""TrainConfig fields that bcg records rather than the user chooses; a resume checks them on their own (a checkpoint
written before they existed has None)."""


LEGACY_DEFAULTS: dict[str, Any] = {
    "schedule_over_time": False, "domain_randomization": False, "adaptive_start": False,
    "termination_anchor_height": None, "termination_gravity_z": None, "termination_end_effector_height": None}
"""What a run's config meant by a field it does not have (written before the field existed): the behaviour then."""

CONTACT_RANDOMIZATION: dict[str, Any] = {
    "contact_beta": (0.1, 0.5), "contact_soft_timeconst": (0.01, 0.03), "contact_soft_share": 0.5}
"""The DomainRandomization ranges of --contact-randomization."""

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


@dataclass(frozen=True)
class TrainConfig:
    """Train an agent on a G1 tracking clip: SHAC through a gradient estimator, or PPO (stable-baselines3).

    Choose the estimator with --estimator NAME (bptt, grs, bcg or a plugin's); its parameters follow as
    --estimator.FIELD. The preset (--preset) sets the agent config first; every --shac.FIELD / --ppo.FIELD overrides
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
    kappa: float | None = None
    """Contact stiffness of the simulator [1/m] (None: the simulator's default, 300)."""
    soft_contact_timeconst: float | None = None
    """Brake contact impacts over several substeps as MuJoCo's soft contact does, with this time constant [s] (0.02:
    MuJoCo's default, where policies are evaluated; docs/simulator.md); None: stopped within one substep."""
    contact_beta: float | None = None
    """Baumgarte factor of the contacts in [0, 1] (None: the simulator's 0.5); lower is a softer ground."""
    domain_randomization: bool = True
    """Randomise physics, pushes, latency and observation noise (docs/envs.md ranges); --no-domain-randomization: off.
    On by default: one of the layers with which policies stand in MuJoCo (docs/shac.md, the ablation)."""
    contact_randomization: bool = False
    """Randomise how the ground gives, per environment: the contacts' Baumgarte factor U(0.1, 0.5), and for half the
    environments a soft ground (time constant U(0.01, 0.03) s, MuJoCo's 0.02 inside) (docs/envs.md). Works with or
    without --domain-randomization."""
    max_episode_steps: int | None = None
    """Extra time limit of an episode in control steps (None: the clip's end)."""
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
    termination_anchor_height: float | None = 0.25
    """End an episode when the pelvis height error exceeds this [m] (BeyondMimic's 0.25; None: off)."""
    termination_gravity_z: float | None = 0.8
    """End an episode when the projected gravity's z component differs from the reference's by more than this
    (BeyondMimic's 0.8; None: off)."""
    termination_end_effector_height: float | None = 0.25
    """End an episode when an ankle or wrist height error exceeds this [m] (BeyondMimic's 0.25; None: off)."""
    adaptive_start: bool = True
    """Start episodes where they fail: per-bin failure averages with a uniform floor (docs/start_states_and_replay.md);
    --no-adaptive-start: uniform start frames."""
    adaptive_start_bin_s: float = 1.0
    """Bin length of the adaptive start sampling [s]."""
    adaptive_start_alpha: float = 0.001
    """Weight of the newest step in the per-bin failure average, in (0, 1]."""
    adaptive_start_floor: float = 0.1
    """Share of uniformly drawn start frames with adaptive start sampling, in [0, 1]."""
    replay_threshold: float | None = None
    """Demonstration replay: put rows whose tracking error exceeds this [m] back on the reference, cutting their
    gradient there (DiffMimic: 0.2 run, 0.4 jump / dance; None: off)."""
    torch_threads: int | None = 1
    """torch.set_num_threads for the run (None: torch's default). 1 is the fastest during the rollout, where the
    simulator's own threads use the cores."""
    update_threads: int | None = None
    """torch threads of SHAC's critic fit and PPO's update (None: every core when their minibatches are large, as
    with the paper's sizes, and OpenMP spins (OMP_WAIT_POLICY=ACTIVE, for a machine of your own); else 1;
    bcg.agents.threads)."""
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
        _check_motion(self.motion)
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
        from bcg.envs.config import LAYER_FIELDS, EnvConfig

        preset = ENV_PRESETS[self.preset]
        offset = preset["action_offset"] if self.action_offset is None else self.action_offset
        scale = preset["action_scale"] if self.action_scale is None else self.action_scale
        if self.action_scale_torque is not None:
            from bcg.envs.actions import torque_action_scale
            from bcg.robots import g1

            scale = tuple(float(x) for x in torque_action_scale(g1.KP, g1.TORQUE_LIMITS, self.action_scale_torque))
        return EnvConfig(motion_file=self.motion, kappa=self.kappa, device=self.device,
                         soft_contact_timeconst=self.soft_contact_timeconst, contact_beta=self.contact_beta,
                         differentiable=self.agent == "shac", domain_randomization=self._randomization(),
                         max_episode_steps=self.max_episode_steps, action_offset=offset, action_scale=scale,
                         **{name: getattr(self, name) for name in LAYER_FIELDS})

    def _randomization(self) -> bool | DomainRandomization:
        """EnvConfig.domain_randomization: the flag, or the ranges with the contact draws added."""
        from bcg.envs.randomization import DomainRandomization

        if not self.contact_randomization:
            return bool(self.domain_randomization)
        base = DomainRandomization() if self.domain_randomization else DomainRandomization.off()
        return dataclasses.replace(base, **CONTACT_RANDOMIZATION)

    @property
    def agent_config(self) -> Any:
        """The config of the chosen agent (``shac`` or ``ppo``)."""
        return self.shac if self.agent == "shac" else self.ppo

    def run(self) -> int:
        """Run :func:`train` (the ``bcg train`` command); returns the exit status (130 after Ctrl-C, 143 after
        SIGTERM). A checkpoint or run directory that cannot be used raises a :class:`~bcg.errors.UserError` (one line
        from ``bcg``)."""
        return train(self).status


def _packaged_motions() -> tuple[str, ...]:
    from bcg.motion import PACKAGED_MOTIONS

    return PACKAGED_MOTIONS


def _check_motion(motion: str) -> None:
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


def _motion_name(motion: str) -> str:
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


def _split_estimator(args: list[str]) -> tuple[list[str], str | None]:
    """Turn ``--estimator NAME`` / ``--estimator=NAME`` into tyro's subcommand token ``estimator:NAME``; checks the
    name against the registry (the message lists the registered estimators)."""
    from bcg.estimators import ESTIMATORS

    out, name = [], None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--estimator" or a.startswith("--estimator="):
            if a == "--estimator":
                if i + 1 >= len(args):
                    raise ValueError(f"--estimator needs a name; registered: {', '.join(ESTIMATORS)}")
                name, i = args[i + 1], i + 2
            else:
                name, i = a.split("=", 1)[1], i + 1
            continue
        if a.startswith("estimator:"):
            name, i = a.split(":", 1)[1], i + 1
            continue
        out.append(a)
        i += 1
    if name is not None and name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}")
    return out, name


def parse_train_args(args: Sequence[str], prog: str = "bcg train") -> TrainConfig:
    """The :class:`TrainConfig` of a ``bcg train`` command line.

    Two passes: the first reads ``--agent``, ``--preset`` and ``--resume`` and builds the defaults (the preset's agent
    configs, or the checkpoint's whole config when resuming); the second is tyro over :class:`TrainConfig` with those
    defaults, so ``--shac.FIELD`` overrides one field of the preset. Raises ``ValueError`` (or
    :class:`~bcg.agents.checkpoint.CheckpointError`) with a clear message on bad values."""
    _bind_types()
    rest, est_name = _split_estimator(list(args))
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
    if est_name is not None and est_name != base.estimator.name:
        from bcg.estimators import make

        base = dataclasses.replace(base, estimator=make(est_name))
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
    base = default_config(d.get("agent", "shac"), d.get("preset", "cpu-small"))
    est = d.pop("estimator", None)
    if est is not None:
        name = est.get("name")
        if name not in ESTIMATORS:
            raise ValueError(f"config: unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}")
        base = dataclasses.replace(base, estimator=_from_plain(make(name), est, "estimator"))
    return _from_plain(base, d, "config")


# -------------------------------------------------------------------------------------------- run directory


def run_name(cfg: TrainConfig, now: _dt.datetime | None = None) -> str:
    """``MOTION-AGENT[-ESTIMATOR][-add]-PRESET-sSEED-YYYYmmdd-HHMMSS`` (the estimator only for SHAC)."""
    now = now or _dt.datetime.now()
    parts = [_motion_name(cfg.motion), cfg.agent]
    if cfg.agent == "shac":
        parts.append(cfg.estimator.name)
    if cfg.reward == "add":
        parts.append("add")
    parts += [cfg.preset, f"s{cfg.seed}", now.strftime("%Y%m%d-%H%M%S")]
    return "-".join(parts)


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint file belongs to (``RUN/checkpoints/iter_N.pt`` -> ``RUN``)."""
    parent = Path(checkpoint).resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def _dist_version(*names: str) -> str | None:
    import importlib.metadata

    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect_versions() -> dict[str, Any]:
    """Versions of Python, the libraries a run depends on, bcg, and the git commit of the checkout (if any)."""
    import torch

    import bcg

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "warp": _dist_version("warp-lang", "warp"),
        "mujoco": _dist_version("mujoco"),
        "gymnasium": _dist_version("gymnasium"),
        "stable_baselines3": _dist_version("stable-baselines3", "stable_baselines3"),
        "tyro": _dist_version("tyro"),
        "numpy": _dist_version("numpy"),
        "bcg": bcg.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
    root = Path(bcg.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            out["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fmt(col: str, v: float) -> str:
    """A metrics.csv cell: integers for iteration / samples, ``repr`` for floats (round-trips exactly)."""
    if col in ("iteration", "samples") and math.isfinite(v):
        return str(int(v))
    return repr(float(v))


def _human(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


# -------------------------------------------------------------------------------------------- the loop


def _signal_label(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Trainer:
    """Runs any :class:`~bcg.agents.base.Agent` for ``iterations`` in a run directory, logging and checkpointing.

    Args:
        agent: the agent (fresh, or about to continue ``resume_from``).
        run_dir: the run directory (made if missing).
        config: the resolved config as JSON-able values (written to config.json and into every checkpoint).
        iterations: total iterations (the loop runs from ``agent.iteration`` to here); None: until ``max_time_s``
            or a stop signal.
        checkpoint_every: checkpoint period in iterations (0: only at the end and on Ctrl-C or SIGTERM).
        max_time_s: stop once the cumulative training wall time reaches this [s] (None: no limit).
        schedule_over_time: before each iteration, tell an agent with ``set_schedule_progress`` the share of
            ``max_time_s`` spent (its learning-rate schedule then spans the time budget).
        resume_from: a checkpoint to continue: its config must equal ``config`` except :data:`RUN_CONTROL_FIELDS`,
            its agent state must fit ``agent``; the metrics rows are restored from it.
        progress: show the tqdm bar. tensorboard: write event files.
        export: write ``policy.pt`` from ``agent.export_policy()`` at the end.
        evaluator: ``evaluator(agent) -> {column: value}`` for the :data:`EVAL_COLUMNS` (see :func:`policy_evaluator`),
            called after iteration 1, every ``eval_every`` iterations and after the last; its time is not counted.
    """

    def __init__(self, agent: Any, *, run_dir: str | Path, config: Mapping[str, Any], iterations: int | None,
                 checkpoint_every: int = 50, max_time_s: float | None = None, resume_from: Checkpoint | None = None,
                 schedule_over_time: bool = False, progress: bool = True, tensorboard: bool = True, export: bool = True,
                 evaluator: Callable[[Any], Mapping[str, float]] | None = None, eval_every: int = 0):
        self.agent = agent
        self.evaluator = evaluator
        self.eval_every = int(eval_every) if evaluator is not None else 0
        self.run_dir = Path(run_dir)
        self.config = dict(config)
        self.iterations = None if iterations is None else int(iterations)
        self.checkpoint_every = int(checkpoint_every)
        self.max_time_s = max_time_s
        if schedule_over_time and max_time_s is None:
            raise ValueError("schedule_over_time needs max_time_s (the budget the schedule runs over)")
        self.schedule_over_time = bool(schedule_over_time)
        self.progress = progress
        self.tensorboard = tensorboard
        self.export = export
        self.header: list[str] = []
        self.rows: list[list[float]] = []
        self.resume_from = resume_from
        self._stop = False  # set by the first Ctrl-C / SIGTERM: finish the iteration, checkpoint, stop
        self._stop_signal = signal.SIGINT  # which one (the exit status is 128 + its number)
        self._in_iteration = False
        self._tb_values: dict[str, float] = {}
        self.last_checkpoint: Path | None = None

    # ------------------------------------------------------------------------------------ files

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.csv"

    def _prepare(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(exist_ok=True)
        for f in remove_stale_temporaries(self.run_dir, self.checkpoint_dir):
            print(f"[bcg train] removed {f}, left by a write that was killed", file=sys.stderr)
        ck = self.resume_from
        if ck is not None:
            check_compatible(ck, self.config, ignore=RUN_CONTROL_FIELDS + RECORDED_FIELDS)
            verify_state_fits(ck.agent_state, self.agent.state_dict(), ck.path)
            try:
                self.agent.load_state_dict(ck.agent_state)
            except (ValueError, KeyError, RuntimeError, TypeError) as exc:
                raise CheckpointError(f"{ck.path}: the agent refused the state: {exc}") from None
            if int(self.agent.iteration) != ck.iteration:
                raise CheckpointError(f"{ck.path}: the agent state is at iteration {self.agent.iteration}, the "
                                      f"trainer's at {ck.iteration}")
            if self.iterations is not None and ck.iteration > self.iterations:
                raise CheckpointError(f"{ck.path} is at iteration {ck.iteration}, beyond --iterations "
                                      f"{self.iterations}; ask for more iterations to continue")
            self.header = list(ck.metrics_header)
            self.rows = [list(r) for r in ck.metrics_rows]
        _write_text_atomic(self.run_dir / "config.json", json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        _write_text_atomic(self.run_dir / "versions.json",
                           json.dumps(collect_versions(), indent=2, sort_keys=True) + "\n")
        if self.header:  # rows beyond the checkpoint (a crash after it) are dropped: the run repeats them
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(self.header)
            for r in self.rows:
                w.writerow([_fmt(c, v) for c, v in zip(self.header, r, strict=True)])
            _write_text_atomic(self.metrics_path, buf.getvalue())
        elif self.metrics_path.exists():
            self.metrics_path.unlink()

    def _row(self, metrics: Mapping[str, float], wall: float) -> list[float]:
        missing = [k for k in METRIC_NAMES if k not in metrics]
        if missing:
            raise ValueError(f"{type(self.agent).__name__}.train_iteration did not return {missing} (every agent "
                             "returns the scalars of bcg.agents.base.METRIC_NAMES, NaN where one does not apply)")
        values = {"iteration": float(self.agent.iteration), "samples": float(self.agent.samples),
                  "wall_time_s": wall}
        for k, v in metrics.items():
            if k in values:
                continue
            try:
                values[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"metric {k!r} is not a number: {v!r}") from None
        if not self.header:  # fixed at the first row; a later extra key goes to TensorBoard only
            extras = [k for k in metrics if k not in METRIC_NAMES and k not in FIXED_COLUMNS and k not in EVAL_COLUMNS]
            evals = list(EVAL_COLUMNS) if self.eval_every else []
            self.header = [*FIXED_COLUMNS, *METRIC_NAMES, *evals, *extras]
            with open(self.metrics_path, "w", newline="", encoding="utf-8") as f:
                csv.writer(f, lineterminator="\n").writerow(self.header)
        self._tb_values = values
        return [values.get(c, math.nan) for c in self.header]

    def _append_row(self, row: list[float]) -> None:
        self.rows.append(row)
        with open(self.metrics_path, "a", newline="", encoding="utf-8") as f:
            csv.writer(f, lineterminator="\n").writerow([_fmt(c, v) for c, v in zip(self.header, row, strict=True)])
            f.flush()

    def write_checkpoint(self) -> Path:
        """Checkpoint the agent and the trainer's state now (atomically) as ``checkpoints/iter_NNNNNN.pt``."""
        it = int(self.agent.iteration)
        path = self.checkpoint_dir / f"iter_{it:06d}.pt"
        save_checkpoint(path, agent_state=self.agent.state_dict(), iteration=it, run_id=self.run_dir.name,
                        config=self.config, metrics_header=self.header, metrics_rows=self.rows)
        self.last_checkpoint = path
        return path

    # ------------------------------------------------------------------------------------ Ctrl-C, SIGTERM

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        """Ctrl-C (SIGINT) or SIGTERM: finish the iteration, checkpoint, stop; a second one (or one outside an
        iteration) stops at once through KeyboardInterrupt (the loop still checkpoints between iterations)."""
        if self._stop or not self._in_iteration:
            self._stop_signal = signal.Signals(signum)
            raise KeyboardInterrupt
        self._stop, self._stop_signal = True, signal.Signals(signum)
        print(f"\n[bcg train] {_signal_label(signum)}: finishing iteration {self.agent.iteration + 1}, then writing a "
              f"checkpoint ({_signal_label(signum)} again to stop at once without one)", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------ run

    def run(self) -> int:
        """Train up to ``iterations``; returns 0 when done, 130 when stopped by Ctrl-C and 143 by SIGTERM (after
        checkpointing)."""
        from tqdm import tqdm

        self._prepare()
        start = int(self.agent.iteration)
        wall0 = self.rows[-1][self.header.index("wall_time_s")] if self.rows else 0.0
        writer = None
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: a resumed run discards events the interrupted one logged after its checkpoint
            writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"),
                                   purge_step=start + 1 if self.resume_from is not None else None)
        old_handlers: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                old_handlers[sig] = signal.signal(sig, self._on_stop_signal)
        bar = tqdm(total=self.iterations, initial=start, desc=self.run_dir.name[:40], unit="it", dynamic_ncols=True,
                   disable=not self.progress, file=sys.stderr)
        status = 0
        wall = float(wall0)
        try:
            while not self._reached(self.agent.iteration) and not self._stop:
                if self.max_time_s is not None and wall >= self.max_time_s:
                    print(f"[bcg train] time limit {self.max_time_s:g} s reached after {self.agent.iteration} "
                          "iterations", file=sys.stderr)
                    break
                if self.schedule_over_time and hasattr(self.agent, "set_schedule_progress"):
                    self.agent.set_schedule_progress(wall / self.max_time_s)
                t0 = time.perf_counter()
                # an iteration and its row are one unit: a Ctrl-C / SIGTERM in here only sets _stop (_on_stop_signal)
                self._in_iteration = True
                metrics = self.agent.train_iteration()
                wall += time.perf_counter() - t0
                done_it = int(self.agent.iteration)
                if self.eval_every and (done_it == 1 or done_it % self.eval_every == 0 or self._reached(done_it)
                                        or (self.max_time_s is not None and wall >= self.max_time_s)):
                    metrics = {**metrics, **{k: float(v) for k, v in self.evaluator(self.agent).items()}}
                row = self._row(metrics, wall)
                self._append_row(row)
                it = int(self.agent.iteration)
                if writer is not None:
                    for k, v in self._tb_values.items():
                        if k != "iteration":
                            writer.add_scalar(k, v, it)
                self._in_iteration = False
                bar.update(it - bar.n)
                bar.set_postfix_str(self._postfix(metrics), refresh=False)
                if self.checkpoint_every and it % self.checkpoint_every == 0 and not self._reached(it):
                    self.write_checkpoint()
                    if writer is not None:
                        writer.flush()
        except KeyboardInterrupt:
            bar.close()
            if self._in_iteration:  # stopped inside train_iteration: the agent's state is half-updated
                print(f"\n[bcg train] stopped inside iteration {self.agent.iteration + 1}; its state is not saved. "
                      f"Last checkpoint: {self.last_checkpoint or 'none'}", file=sys.stderr)
                if writer is not None:
                    writer.close()
                return 128 + int(self._stop_signal)
            self._stop = True
        finally:
            bar.close()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
        path = self.write_checkpoint()
        if writer is not None:
            writer.close()
        if self._stop:
            print(f"[bcg train] stopped by {_signal_label(self._stop_signal)} at iteration {self.agent.iteration}: "
                  f"checkpoint {path}\n[bcg train] continue with: bcg train --resume {self.run_dir}", file=sys.stderr)
            status = 128 + int(self._stop_signal)
        elif self.export:
            from bcg.agents.export import save_policy

            pol = save_policy(self.run_dir / "policy.pt", self.agent.export_policy())
            print(f"[bcg train] done: {self.agent.iteration} iterations, {self.agent.samples} samples; "
                  f"checkpoint {path}; policy {pol}", file=sys.stderr)
        return status

    def _reached(self, iteration: int) -> bool:
        """Whether ``iteration`` is the last one asked for (never, without an iteration limit)."""
        return self.iterations is not None and iteration >= self.iterations

    @staticmethod
    def _postfix(m: Mapping[str, float]) -> str:
        def g(k: str, fmt: str) -> str:
            v = m.get(k, math.nan)
            return format(float(v), fmt) if v is not None else "nan"

        ev = f"eval={g('eval_tracking_error_cm', '.1f')}cm " if "eval_tracking_error_cm" in m else ""
        return (f"reward={g('reward', '.3f')} track={g('tracking_error_cm', '.1f')}cm {ev}"
                f"trig={g('trigger_rate', '.3f')} gnorm={g('grad_norm', '.3g')} skip={g('skipped_updates', '.0f')}")


# -------------------------------------------------------------------------------------------- train / export


def build_agent(cfg: TrainConfig) -> Any:
    """The agent a TrainConfig describes (a fresh one, seeded with ``cfg.seed``)."""
    add = cfg.add if cfg.reward == "add" else None
    env_cfg = cfg.env_config()
    if cfg.agent == "shac":
        from bcg.agents.shac import SHAC

        return SHAC(cfg.shac, env_cfg, estimator=dataclasses.replace(cfg.estimator), add=add, seed=cfg.seed,
                    update_threads=cfg.update_threads)
    from bcg.agents.ppo import PPOAgent

    return PPOAgent(cfg.ppo, env_cfg, add=add, seed=cfg.seed, update_threads=cfg.update_threads)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did."""

    run_dir: Path
    """The run directory."""
    status: int
    """0: finished; 130 / 143: stopped by Ctrl-C / SIGTERM after a checkpoint."""
    agent: Any
    """The agent at the end."""


def policy_evaluator(cfg: TrainConfig) -> Callable[[Any], dict[str, float]]:
    """``evaluate(agent) -> {EVAL_COLUMNS}``: the agent's exported (deterministic) policy replayed in our simulator
    on ``cfg.eval_episodes`` fixed episodes of at most ``cfg.eval_seconds`` (bcg.evaluation.mujoco_transfer.replay,
    the protocol of `bcg evaluate`, without gradients and with the run's dynamics and action map)."""
    # the replay protocol lives with the evaluation; importing it lazily keeps agents importable without it
    from bcg.agents.export import ExportedPolicy
    from bcg.envs.config import DYNAMICS_FIELDS
    from bcg.evaluation.mujoco_transfer import TransferOptions, replay

    env_cfg = cfg.env_config()
    options = TransferOptions(phases=cfg.eval_episodes, seeds=(0,), seconds=float(cfg.eval_seconds))
    kwargs = {k: getattr(env_cfg, k) for k in ("action_offset", "action_scale", *DYNAMICS_FIELDS)
              if getattr(env_cfg, k) is not None}

    def evaluate(agent: Any) -> dict[str, float]:
        export = agent.export_policy()
        policy = ExportedPolicy(export["meta"], export["tensors"])
        m = replay(policy, cfg.motion, options, simulator="bcg", env_kwargs=kwargs).metrics()
        return {"eval_tracking_error_cm": float(m.e_track_cm), "eval_fall_rate": float(m.fall_rate),
                "eval_episode_s": float(m.mean_episode_seconds)}

    return evaluate


def train(cfg: TrainConfig, *, agent_factory: Callable[[TrainConfig], Any] = build_agent) -> TrainResult:
    """Build the agent of ``cfg`` and train it in a new run directory, or, with ``cfg.resume``, continue that run
    in its own directory (or, with ``cfg.branch``, in a new one).

    Everything that would lose or misplace a result is refused with a :class:`~bcg.errors.UserError` before any file
    is written (see :func:`resolve_run_dir`); so are a device this machine lacks and a motion file that changed since
    the run recorded it."""
    import torch

    from bcg.sim import check_device

    check_device(cfg.device)
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    ckpt = load_checkpoint(cfg.resume) if cfg.resume is not None else None
    run_dir = resolve_run_dir(cfg, ckpt)
    cfg = _record_motion_hash(cfg)
    if cfg.branch or ckpt is None:  # the new directory's own name and folder
        cfg = dataclasses.replace(cfg, out=run_dir.parent, name=run_dir.name)
    agent = agent_factory(cfg)
    _make_run_dir(run_dir)
    trainer = Trainer(agent, run_dir=run_dir, config=config_to_dict(cfg), iterations=cfg.iteration_limit(),
                      checkpoint_every=cfg.checkpoint_every, max_time_s=cfg.max_time_s, resume_from=ckpt,
                      schedule_over_time=cfg.schedule_follows_time(),
                      progress=cfg.progress, tensorboard=cfg.tensorboard,
                      evaluator=policy_evaluator(cfg) if cfg.eval_every else None, eval_every=cfg.eval_every)
    status = trainer.run()
    return TrainResult(run_dir=run_dir, status=status, agent=agent)


def resolve_run_dir(cfg: TrainConfig, ckpt: Checkpoint | None) -> Path:
    """The run directory ``cfg`` trains in; raises :class:`~bcg.errors.UserError` where training there would lose or
    misplace results. Writes nothing.

    * a new run (or ``--branch``): ``OUT/NAME``, which must not exist with files in it, under an ``OUT`` that is not a
      file (a branch's default: beside the run it comes from, ``RUN-from-iterN-TIMESTAMP``);
    * ``--resume``: the run of the checkpoint, which must lie in a run's ``checkpoints/`` folder (else resuming would
      write config.json, metrics.csv and policy.pt beside it) and be the run's latest (else the later checkpoints
      and their metrics rows would be replaced); ``--name`` / ``--out`` other than the run's are refused (they do not
      apply to a run that stays where it is)."""
    if ckpt is None:
        return _new_run_dir(Path(cfg.out), cfg.name or run_name(cfg))
    home = run_dir_of(ckpt.path)
    if cfg.branch:
        out = Path(cfg.out) if str(cfg.out) != str(ckpt.config.get("out")) else home.parent
        name = cfg.name if cfg.name != ckpt.config.get("name") else None
        return _new_run_dir(out, name or f"{home.name}-from-iter{ckpt.iteration}-{_dt.datetime.now():%Y%m%d-%H%M%S}")
    branch_hint = f"continue from iteration {ckpt.iteration} in a new run directory with --branch (and --out / --name)"
    if ckpt.path.resolve().parent.name != "checkpoints":
        raise UserError(f"{ckpt.path} is not in a run's checkpoints/ folder: resuming it in place would write "
                        f"config.json, metrics.csv and policy.pt beside it in {home}; {branch_hint}")
    later = [p.name for it, p in list_checkpoints(ckpt.path.resolve().parent) if it > ckpt.iteration]
    if later:
        raise UserError(f"{ckpt.path} is at iteration {ckpt.iteration} but {home} has later checkpoints "
                        f"({', '.join(later)}): resuming there would replace their results; resume the latest "
                        f"(--resume {home}) or {branch_hint}")
    given = [f"--{key} {getattr(cfg, key)}" for key in ("name", "out")
             if str(getattr(cfg, key)) != str(ckpt.config.get(key))]
    if given:
        raise UserError(f"{' and '.join(given)} would be ignored: a resumed run stays in {home}; {branch_hint}")
    return home


def _new_run_dir(out: Path, name: str) -> Path:
    """``out / name`` for a new run, refusing an ``out`` that is a file and a run directory that has files."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; expected a folder in which the run directory is made")
    run_dir = out / name
    if run_dir.is_dir() and any(run_dir.iterdir()):
        hint = (f"continue it with --resume {run_dir}" if list_checkpoints(run_dir / "checkpoints")
                else "remove it")
        raise UserError(f"run directory {run_dir} exists and is not empty; choose another --name, or {hint}")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file; expected a new run directory there (choose another --name)")
    return run_dir


def _make_run_dir(run_dir: Path) -> None:
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir}/: {exc.strerror or exc} (check --out)") from None


def _record_motion_hash(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the sha256 of its motion file; refuses a file whose hash differs from the one ``cfg`` recorded."""
    from bcg.motion.formats import motion_sha256, resolve_motion_path

    current = motion_sha256(cfg.motion)
    if cfg.motion_sha256 is not None and current != cfg.motion_sha256:
        raise UserError(f"motion file {resolve_motion_path(cfg.motion)} has changed since the run recorded it "
                        f"(sha256 {cfg.motion_sha256[:12]}..., now {current[:12]}...); restore the file, or train a "
                        "new run on the new clip")
    return dataclasses.replace(cfg, motion_sha256=current)


EXPORT_FILES = {"torch": "policy.pt", "onnx": "policy.onnx", "torchscript": "policy_jit.pt"}
"""Default file name in the run directory of each export format."""


def checkpoint_export(path: str | Path) -> dict[str, Any]:
    """The policy export (``{"meta", "tensors"}``, as :func:`bcg.agents.export.save_policy` writes it) of one
    checkpoint file: the agent is rebuilt from the checkpoint's config and loaded with its state."""
    ckpt = load_checkpoint(path)
    agent = build_agent(dataclasses.replace(config_from_dict(ckpt.config), resume=None))
    verify_state_fits(ckpt.agent_state, agent.state_dict(), ckpt.path)
    agent.load_state_dict(ckpt.agent_state)
    return agent.export_policy()


def export_run(run: str | Path, out: str | Path | None = None, fmt: str = "torch") -> Path:
    """Write the policy of a run's latest checkpoint (or of a checkpoint file) to ``out`` (default
    ``RUN/`` + :data:`EXPORT_FILES` ``[fmt]``); rebuilds the agent from the checkpoint's config. ``fmt``: ``"torch"``
    (the self-contained policy file of :mod:`bcg.agents.export`), ``"onnx"`` or ``"torchscript"`` (a deployment
    graph, :mod:`bcg.agents.export_graph`). ``run`` may also be a policy file (``policy.pt``), which is converted.
    Returns the file written; a wrong format, an ``out`` that is a folder or cannot be written raise
    :class:`~bcg.errors.UserError`."""
    from bcg.agents.export import POLICY_FORMAT, ExportedPolicy, load_policy, read_torch_file, save_policy

    if fmt not in EXPORT_FILES:
        raise UserError(f"format must be one of {tuple(EXPORT_FILES)}, got {fmt!r}")
    src = Path(run)
    obj = read_torch_file(src, "policy file") if src.is_file() else None
    if isinstance(obj, dict) and obj.get("format") == POLICY_FORMAT:  # an exported policy: convert it
        if fmt == "torch":
            raise UserError(f"{src} is already a torch policy file; choose --format onnx or torchscript")
        policy, run_dir, export = load_policy(src), src.parent, None
    else:
        ckpt_path = latest_checkpoint(run)
        export, run_dir = checkpoint_export(ckpt_path), run_dir_of(ckpt_path)
        policy = ExportedPolicy(export["meta"], export["tensors"])
    dest = Path(out) if out is not None else run_dir / EXPORT_FILES[fmt]
    if dest.is_dir():
        what = "policy file" if fmt == "torch" else f"{fmt} file"
        raise UserError(f"--out {dest} is a folder; expected the path of the {what} to write, e.g. "
                        f"{dest / EXPORT_FILES[fmt]}")
    try:
        if fmt == "torch":
            return save_policy(dest, export)
        from bcg.agents.export_graph import export_graph

        return export_graph(policy, dest, fmt)
    except OSError as exc:
        raise UserError(f"cannot write {dest}: {exc.strerror or exc}") from None
