"""Differentiable articulated-body simulator in NVIDIA Warp (floating base + hinges, smoothed stiff contact).

Public API (docs/design.md): :func:`load_model`, :func:`mass_matrix`, :func:`bias_forces`, :func:`step`.
State layout is MuJoCo's ``qpos`` / ``qvel``. The plain-torch oracle of the same algorithm is
:mod:`bcg.sim.reference`. Importing this package does not initialise Warp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bcg.sim.model import MAX_SPEED, ContactParams, SimModel, UnsupportedModelError, load_model, model_from_mujoco
from bcg.sim.physics import Physics, default_physics
from bcg.sim.reference import ContactReport

if TYPE_CHECKING:
    import torch

__all__ = [
    "ContactParams",
    "ContactReport",
    "MAX_SPEED",
    "Physics",
    "SimModel",
    "UnsupportedModelError",
    "bias_forces",
    "default_physics",
    "load_model",
    "mass_matrix",
    "model_from_mujoco",
    "step",
]


def step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor, physics: Physics | None = None
         ) -> tuple[torch.Tensor, torch.Tensor, ContactReport]:
    """Differentiable control step; see :func:`bcg.sim.bridge.step`."""
    from bcg.sim.bridge import step as _step

    return _step(model, q, qd, targets, physics)


def mass_matrix(model: SimModel, q: torch.Tensor) -> torch.Tensor:
    """Mass matrix [N, nv, nv] (armature included); see :func:`bcg.sim.bridge.mass_matrix`."""
    from bcg.sim.bridge import mass_matrix as _mass_matrix

    return _mass_matrix(model, q)


def bias_forces(model: SimModel, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
    """Bias forces [N, nv]; see :func:`bcg.sim.bridge.bias_forces`."""
    from bcg.sim.bridge import bias_forces as _bias_forces

    return _bias_forces(model, q, qd)


def __getattr__(name: str) -> Any:
    raise AttributeError(f"module 'bcg.sim' has no attribute {name!r}")
