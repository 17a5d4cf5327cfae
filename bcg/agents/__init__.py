"""Agents: SHAC (first-order, through a gradient estimator), PPO (stable-baselines3), the ADD reward, training.

Importing this package is cheap: names are resolved from their submodules on first access.
"""

from __future__ import annotations

from bcg._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "Agent": "bcg.agents.base",
    "METRIC_NAMES": "bcg.agents.base",
    "ADDConfig": "bcg.agents.add",
    "ADDReward": "bcg.agents.add",
    "PPOAgent": "bcg.agents.ppo",
    "PPOConfig": "bcg.agents.ppo",
    "ExportedPolicy": "bcg.agents.export",
    "load_policy": "bcg.agents.export",
    "policy_export": "bcg.agents.export",
    "save_policy": "bcg.agents.export",
    "load_checkpoint": "bcg.agents.checkpoint",
    "save_checkpoint": "bcg.agents.checkpoint",
    "TrainConfig": "bcg.agents.train",
    "Trainer": "bcg.agents.train",
    "export_run": "bcg.agents.train",
    "SHAC": "bcg.agents.shac",
    "SHACConfig": "bcg.agents.shac",
    "GaussianActor": "bcg.agents.networks",
    "CriticEnsemble": "bcg.agents.networks",
    "RunningMeanStd": "bcg.agents.normalization",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
