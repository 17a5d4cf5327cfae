"""Gymnasium registration of ``BCG-G1-{Run,Jump,Fight,Dance}-v0``.

:func:`register_envs` is cheap (no Warp, MuJoCo or torch import) and idempotent; ``import bcg`` calls it.
"""

from __future__ import annotations

__all__ = ["ENV_IDS", "register_envs"]

ENV_IDS: dict[str, str] = {
    "BCG-G1-Run-v0": "run",
    "BCG-G1-Jump-v0": "jump",
    "BCG-G1-Fight-v0": "fight",
    "BCG-G1-Dance-v0": "dance",
}
"""Environment id -> packaged motion clip used by default (``motion_file``, or ``config.motion_file``, overrides it)."""


def register_envs() -> None:
    """Register the four ids with Gymnasium (single-env ``entry_point`` and batched ``vector_entry_point``)."""
    from gymnasium.envs.registration import register, registry

    for env_id, clip in ENV_IDS.items():
        if env_id in registry:
            continue
        register(
            id=env_id,
            entry_point="bcg.envs.single_env:G1TrackingEnv",
            vector_entry_point="bcg.envs.vector_env:G1TrackingVectorEnv",
            kwargs={"default_motion": clip},  # not motion_file: a config=EnvConfig(motion_file=...) must win
        )
