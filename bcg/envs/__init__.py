"""Gymnasium environments of the G1 tracking task, and the motion library they read references from.

Importing this package is cheap: every name below is resolved from its submodule on first access
(:func:`load_motion` and :class:`Motion` from :mod:`bcg.envs.motion`; the environments from
:mod:`bcg.envs.vector_env`, :mod:`bcg.envs.single_env` and :mod:`bcg.envs.sb3`).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "Motion": "bcg.envs.motion",
    "load_motion": "bcg.envs.motion",
    "G1TrackingVectorEnv": "bcg.envs.vector_env",
    "G1TrackingEnv": "bcg.envs.single_env",
    "SB3VecEnv": "bcg.envs.sb3",
    "make_sb3_vec_env": "bcg.envs.sb3",
    "DomainRandomization": "bcg.envs.randomization",
    "TrackingReward": "bcg.envs.rewards",
    "StepContext": "bcg.envs.rewards",
    "Features": "bcg.envs.observations",
    "ENV_IDS": "bcg.envs.registration",
    "register_envs": "bcg.envs.registration",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bcg.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
