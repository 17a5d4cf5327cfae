"""Reference motions of the G1: file formats and loaders, resampling, the :class:`Motion` clip, the features shared
with the environments, and the rotation helpers. Layer: above :mod:`bcg.sim` (its kinematics), below
:mod:`bcg.envs`.

Importing this package is cheap: names are resolved from their submodules on first access.
"""

from __future__ import annotations

from bcg._lazy import lazy_getattr

_LAZY: dict[str, str] = {
    "FORMAT_FPS": "bcg.motion.formats",
    "MotionFormatError": "bcg.motion.formats",
    "PACKAGED_MOTIONS": "bcg.motion.formats",
    "packaged_motion_path": "bcg.motion.formats",
    "read_motion_file": "bcg.motion.formats",
    "resample_qpos": "bcg.motion.resample",
    "finite_difference_qvel": "bcg.motion.resample",
    "Motion": "bcg.motion.clip",
    "load_motion": "bcg.motion.clip",
    "Features": "bcg.motion.features",
    "FeatureFn": "bcg.motion.features",
    "disc_features": "bcg.motion.features",
    "features": "bcg.motion.features",
    "Kinematics": "bcg.motion.kinematics",
    "KinematicsFn": "bcg.motion.kinematics",
    "KeyPoints": "bcg.motion.kinematics",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
