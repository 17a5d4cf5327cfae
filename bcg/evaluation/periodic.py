"""The trainer's periodic evaluation: the policy being trained, replayed with `bcg evaluate`'s protocol.

`bcg train` and `bcg compare` hand :func:`policy_evaluator` to :func:`bcg.agents.train.train`; the agents layer only
sees the callable, so the replay protocol stays here, with the rest of the evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bcg.agents.train_config import TrainConfig

if TYPE_CHECKING:
    from bcg.agents.train import TrainResult


def policy_evaluator(cfg: TrainConfig) -> Callable[[Any], dict[str, float]]:
    """``evaluate(agent) -> {EVAL_COLUMNS}``: the agent's exported (deterministic) policy replayed in our simulator
    on ``cfg.eval_episodes`` fixed episodes of at most ``cfg.eval_seconds`` (:func:`bcg.evaluation.mujoco_transfer.
    replay`, the protocol of `bcg evaluate`, without gradients and with the run's dynamics and action map).
    Columns: ``eval_tracking_error_cm`` [cm], ``eval_fall_rate`` (fraction), ``eval_episode_s`` [s]."""
    from bcg.agents.export import ExportedPolicy
    from bcg.envs.config import REFERENCE_FIELDS
    from bcg.evaluation.mujoco_transfer import TransferOptions, replay

    env_cfg = cfg.env_config()
    options = TransferOptions(phases=cfg.eval_episodes, seeds=(0,), seconds=float(cfg.eval_seconds))
    kwargs = {k: getattr(env_cfg, k) for k in ("action_offset", "action_scale", "dynamics", *REFERENCE_FIELDS)
              if getattr(env_cfg, k) is not None}

    def evaluate(agent: Any) -> dict[str, float]:
        export = agent.export_policy()
        policy = ExportedPolicy(export["meta"], export["tensors"])
        m = replay(policy, cfg.motion, options, simulator="bcg", env_kwargs=kwargs).metrics()
        return {"eval_tracking_error_cm": float(m.e_track_cm), "eval_fall_rate": float(m.fall_rate),
                "eval_episode_s": float(m.mean_episode_seconds)}

    return evaluate


def train_and_evaluate(cfg: TrainConfig, **kwargs: Any) -> TrainResult:
    """:func:`bcg.agents.train.train` with the periodic evaluation of :func:`policy_evaluator` (every
    ``cfg.eval_every`` iterations; none when it is 0); returns its :class:`~bcg.agents.train.TrainResult`."""
    from bcg.agents.train import train

    return train(cfg, evaluator_factory=policy_evaluator, **kwargs)
