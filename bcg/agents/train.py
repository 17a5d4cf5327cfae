"""``bcg train`` and ``bcg export``: build the agent a :class:`TrainConfig` describes and run it.

:func:`train` builds the agent and runs a :class:`~bcg.agents.trainer.Trainer` in a run directory
(:mod:`bcg.agents.run_dir`); :class:`TrainConfig`, the presets and :func:`parse_train_args` live in
:mod:`bcg.agents.train_config` (the preset is applied first, then every field of the nested agent config can be
overridden). The names of those modules that callers use are importable from here too. A run directory::

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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcg.agents.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    verify_agent_fits,
)
from bcg.agents.run_dir import (
    collect_versions,
    make_run_dir,
    record_motion_hash,
    resolve_run_dir,
    run_dir_of,
    run_name,
)
from bcg.agents.train_config import (
    DEFAULT_ITERATIONS,
    LEGACY_DEFAULTS,
    RUN_CONTROL_FIELDS,
    TrainConfig,
    check_motion,
    config_from_dict,
    config_to_dict,
    default_config,
    parse_train_args,
)
from bcg.agents.trainer import EVAL_COLUMNS, FIXED_COLUMNS, Trainer
from bcg.errors import UserError

__all__ = [
    "DEFAULT_ITERATIONS", "EVAL_COLUMNS", "EXPORT_FILES", "FIXED_COLUMNS", "LEGACY_DEFAULTS",
    "RUN_CONTROL_FIELDS", "TrainConfig", "TrainResult", "Trainer", "build_agent", "check_motion",
    "checkpoint_export", "collect_versions", "config_from_dict", "config_to_dict", "default_config", "export_run",
    "parse_train_args", "run_name", "train",
]


def build_agent(cfg: TrainConfig) -> Any:
    """The agent a TrainConfig describes (a fresh one, seeded with ``cfg.seed``), handed the env it trains on."""
    add = cfg.add if cfg.reward == "add" else None
    env_cfg = cfg.env_config()
    if cfg.agent == "shac":
        from bcg.agents.shac import SHAC, make_env

        return SHAC(cfg.shac, env=make_env(cfg.shac, env_cfg), estimator=dataclasses.replace(cfg.estimator), add=add,
                    seed=cfg.seed, update_threads=cfg.update_threads, overlap_critic_fit=cfg.overlap_critic_fit,
                    critic_fit_worker=cfg.critic_fit_worker)
    from bcg.agents.ppo import PPOAgent
    from bcg.agents.ppo import make_env as make_ppo_env

    return PPOAgent(cfg.ppo, env=make_ppo_env(cfg.ppo, env_cfg), add=add, seed=cfg.seed,
                    update_threads=cfg.update_threads)


EvaluatorFactory = Callable[[TrainConfig], Callable[[Any], dict[str, float]]]
"""``factory(cfg) -> evaluate(agent) -> {column: value}`` for the trainer's periodic evaluation columns."""


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did."""

    run_dir: Path
    """The run directory."""
    status: int
    """0: finished; 130 / 143: stopped by Ctrl-C / SIGTERM after a checkpoint."""
    agent: Any
    """The agent at the end."""


def train(cfg: TrainConfig, *, agent_factory: Callable[[TrainConfig], Any] = build_agent,
          evaluator_factory: EvaluatorFactory | None = None) -> TrainResult:
    """Build the agent of ``cfg`` and train it in a new run directory, or, with ``cfg.resume``, continue that run
    in its own directory (or, with ``cfg.branch``, in a new one).

    ``evaluator_factory(cfg) -> evaluate(agent) -> {EVAL_COLUMNS}`` runs every ``cfg.eval_every`` iterations; `bcg
    train` and `bcg compare` pass :func:`bcg.evaluation.periodic.policy_evaluator` (the policy replayed with `bcg
    evaluate`'s protocol). Without one the run has no periodic evaluation, whatever ``cfg.eval_every`` says: the
    replay protocol belongs to the evaluation layer, above the agents.

    Everything that would lose or misplace a result is refused with a :class:`~bcg.errors.UserError` before any file
    is written (see :func:`resolve_run_dir`); so are a device this machine lacks and a motion file that changed since
    the run recorded it."""
    import torch

    from bcg.sim import check_device

    check_device(cfg.device)
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    ckpt = load_checkpoint(cfg.resume) if cfg.resume is not None else None
    if ckpt is not None:
        # a checkpoint written before a config field existed is compared as it is read (the field at the value it
        # ran with, LEGACY_DEFAULTS), not as '<absent>'
        ckpt = dataclasses.replace(ckpt, config=config_to_dict(config_from_dict(ckpt.config)))
    run_dir = resolve_run_dir(cfg, ckpt)
    cfg = record_motion_hash(cfg)
    if cfg.branch or ckpt is None:  # the new directory's own name and folder
        cfg = dataclasses.replace(cfg, out=run_dir.parent, name=run_dir.name)
    agent = agent_factory(cfg)
    make_run_dir(run_dir)
    trainer = Trainer(agent, run_dir=run_dir, config=config_to_dict(cfg), iterations=cfg.iteration_limit(),
                      checkpoint_every=cfg.checkpoint_every, max_time_s=cfg.max_time_s, resume_from=ckpt,
                      schedule_over_time=cfg.schedule_follows_time(),
                      progress=cfg.progress, tensorboard=cfg.tensorboard,
                      evaluator=evaluator_factory(cfg) if cfg.eval_every and evaluator_factory else None,
                      eval_every=cfg.eval_every)
    try:
        status = trainer.run()
    finally:
        stop = getattr(agent, "stop_workers", None)  # SHAC's critic fit worker, if it started one
        if stop is not None:
            stop()
    return TrainResult(run_dir=run_dir, status=status, agent=agent)


EXPORT_FILES = {"torch": "policy.pt", "onnx": "policy.onnx", "torchscript": "policy_jit.pt"}
"""Default file name in the run directory of each export format."""


def checkpoint_export(path: str | Path) -> dict[str, Any]:
    """The policy export (``{"meta", "tensors"}``, as :func:`bcg.agents.export.save_policy` writes it) of one
    checkpoint file: the agent is rebuilt from the checkpoint's config and loaded with its state."""
    ckpt = load_checkpoint(path)
    # the run's config without how it was started (a branched run's config says --branch, which needs --resume)
    agent = build_agent(dataclasses.replace(config_from_dict(ckpt.config), resume=None, branch=False))
    verify_agent_fits(ckpt, agent)
    agent.load_state_dict(ckpt.agent_state)
    return agent.export_policy()


def export_run(run: str | Path, out: str | Path | None = None, fmt: str = "torch") -> Path:
    """Write the policy of a run's latest checkpoint (or of a checkpoint file) to ``out`` (default
    ``RUN/`` + :data:`EXPORT_FILES` ``[fmt]``); rebuilds the agent from the checkpoint's config. ``fmt``: ``"torch"``
    (the self-contained policy file of :mod:`bcg.agents.export`), ``"onnx"`` or ``"torchscript"`` (a deployment
    graph, :mod:`bcg.agents.export_graph`). ``run`` may also be a policy file (``policy.pt``), which is converted.
    Returns the file written; a wrong format, an ``out`` that is a folder or cannot be written raise
    :class:`~bcg.errors.UserError`."""
    from bcg.agents.export import POLICY_FORMAT, ExportedPolicy, PolicyFileError, load_policy, save_policy
    from bcg.agents.torch_files import read_torch_file

    if fmt not in EXPORT_FILES:
        raise UserError(f"format must be one of {tuple(EXPORT_FILES)}, got {fmt!r}")
    src = Path(run)
    obj = read_torch_file(src, "policy file", PolicyFileError) if src.is_file() else None
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
