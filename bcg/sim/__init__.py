"""Differentiable articulated-body simulator in NVIDIA Warp (floating base + hinges, smoothed stiff contact).

Everything outside ``bcg.sim`` imports from this package only (``tests/test_import_graph.py`` holds the rule), so the
modules behind it can move. Public API (docs/design.md):

* the model: :func:`load_model`, :func:`model_from_mujoco`, :class:`SimModel`, :class:`ContactParams`, the state
  limits :data:`MAX_SPEED` and :data:`MAX_ROOT_POSITION`;
* the step and its companions: :func:`step`, :func:`mass_matrix`, :func:`bias_forces`; the value types
  :class:`Physics` (per-environment parameters, :func:`default_physics`) and :class:`ContactReport`;
* the float64 oracle's kinematics (:func:`forward_kinematics`, :class:`Kinematics`) and quaternion helpers;
* the runtime (:class:`Runtime`, :func:`default_runtime`): how a step executes (CPU threads, checkpointing;
  :class:`ExecutionOptions`) and what it keeps between calls (per-model arrays and pools: :func:`clear_pool`;
  bytes held for backward passes: :func:`kept_bytes`). Every function taking a model also takes ``runtime=``;
  without it the process's runtime is used;
* for the environments' own fused kernels: :class:`TensorLaunch` and :func:`prepack` (launches recorded once).

State layout is MuJoCo's ``qpos`` / ``qvel``. The plain-torch oracle of the same algorithm is
:mod:`bcg.sim.reference`. Importing this package does not initialise Warp: the names that need it load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bcg.sim.device import check_device
from bcg.sim.execution import ExecutionOptions, available_cores, thread_count
from bcg.sim.model import (
    MAX_ROOT_POSITION,
    MAX_SPEED,
    ContactParams,
    SimModel,
    UnsupportedModelError,
    load_model,
    model_from_mujoco,
)
from bcg.sim.physics import check_physics, default_physics, physics_from_saved
from bcg.sim.reference import Kinematics, forward_kinematics, quat_mul_wxyz, quat_to_matrix_wxyz
from bcg.sim.runtime import (
    Runtime,
    clear_pool,
    default_runtime,
    execution_options,
    execution_options_set,
    kept_bytes,
    parallel,
    set_execution_options,
)
from bcg.sim.types import ContactReport, Physics

if TYPE_CHECKING:
    import torch

    from bcg.sim.replay import TensorLaunch, prepack

__all__ = [
    "ContactParams",
    "ContactReport",
    "ExecutionOptions",
    "Kinematics",
    "MAX_ROOT_POSITION",
    "MAX_SPEED",
    "Physics",
    "Runtime",
    "SimModel",
    "TensorLaunch",
    "UnsupportedModelError",
    "available_cores",
    "bias_forces",
    "check_device",
    "check_physics",
    "clear_pool",
    "default_physics",
    "default_runtime",
    "execution_options",
    "execution_options_set",
    "forward_kinematics",
    "kept_bytes",
    "load_model",
    "mass_matrix",
    "model_from_mujoco",
    "parallel",
    "physics_from_saved",
    "prepack",
    "quat_mul_wxyz",
    "quat_to_matrix_wxyz",
    "set_execution_options",
    "step",
    "thread_count",
]

_NEEDS_WARP = {
    "TensorLaunch": "bcg.sim.replay",
    "prepack": "bcg.sim.replay",
}
"""Public names whose modules import Warp, loaded on first access."""


def step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor, physics: Physics | None = None,
         runtime: Runtime | None = None) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
    """Differentiable control step; see :func:`bcg.sim.bridge.step`."""
    from bcg.sim.bridge import step as _step

    return _step(model, q, qd, targets, physics, runtime)


def mass_matrix(model: SimModel, q: torch.Tensor, runtime: Runtime | None = None) -> torch.Tensor:
    """Mass matrix [N, nv, nv] (armature included); see :func:`bcg.sim.bridge.mass_matrix`."""
    from bcg.sim.bridge import mass_matrix as _mass_matrix

    return _mass_matrix(model, q, runtime)


def bias_forces(model: SimModel, q: torch.Tensor, qd: torch.Tensor, runtime: Runtime | None = None) -> torch.Tensor:
    """Bias forces [N, nv]; see :func:`bcg.sim.bridge.bias_forces`."""
    from bcg.sim.bridge import bias_forces as _bias_forces

    return _bias_forces(model, q, qd, runtime)


def __getattr__(name: str) -> Any:
    module = _NEEDS_WARP.get(name)
    if module is None:
        raise AttributeError(f"module 'bcg.sim' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
