"""Gymnasium environments of the G1 tracking task (reference motions come from :mod:`bcg.motion`).

Importing this package is cheap: every name below is resolved from its submodule on first access.
"""

from __future__ import annotations

from bcg._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "Dynamics": "bcg.envs.dynamics",
    "EpisodeLayers": "bcg.envs.episode_layers",
    "EnvConfig": "bcg.envs.config",
    "ObservationNoise": "bcg.envs.config",
    "EnvState": "bcg.envs.state",
    "TransitionFn": "bcg.envs.transition",
    "simulator_step": "bcg.envs.transition",
    "NumpyVectorEnv": "bcg.envs.numpy_env",
    "make_numpy_vec": "bcg.envs.numpy_env",
    "G1TrackingVectorEnv": "bcg.envs.vector_env",
    "G1TrackingEnv": "bcg.envs.single_env",
    "SB3VecEnv": "bcg.envs.sb3",
    "make_sb3_vec_env": "bcg.envs.sb3",
    "DomainRandomization": "bcg.envs.randomization",
    "TrackingReward": "bcg.envs.rewards",
    "TrackingObservation": "bcg.envs.observations",
    "StepContext": "bcg.envs.rewards",
    "ENV_IDS": "bcg.envs.registration",
    "register_envs": "bcg.envs.registration",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
