"""The clip an environment tracks: loaded from a packaged name, a path or a :class:`bcg.motion.Motion`, and checked
against the control period."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from bcg.envs.config import EnvConfig
from bcg.motion import Motion
from bcg.sim import SimModel

__all__ = ["env_motion"]


def env_motion(source: Any, cfg: EnvConfig, model: SimModel, device: torch.device) -> Motion:
    """The :class:`Motion` of ``source`` (a packaged clip name, a path, or a Motion) on ``device``, sampled at the
    model's control period ``model.params.control_dt`` [s] (``cfg.motion_fps`` / ``cfg.motion_format`` say how to
    read a file), its joints kept ``cfg.reference_joint_margin`` inside their ranges. Raises a one-line error for
    another type, a clip at another frame period, or fewer than 2 frames."""
    from bcg.motion import load_motion

    control_dt = model.params.control_dt
    if isinstance(source, Motion):
        motion = source.to(device)
    elif isinstance(source, (str, Path)):
        motion = load_motion(source, fps=cfg.motion_fps, format=cfg.motion_format, control_dt=control_dt,
                             device=str(device), model=model)
    else:
        raise TypeError("motion_file must be a packaged clip name, a path or a bcg.motion.Motion, got "
                        f"{type(source).__name__}")
    if not math.isclose(motion.dt, control_dt, rel_tol=1e-6):
        raise ValueError(f"the motion's frame period {motion.dt} s differs from the control period {control_dt} s; "
                         f"load it with load_motion(..., control_dt={control_dt})")
    if motion.num_frames < 2:
        raise ValueError(f"the motion has {motion.num_frames} frames; at least 2 are needed")
    return motion.inside_joint_limits(cfg.reference_joint_margin)
