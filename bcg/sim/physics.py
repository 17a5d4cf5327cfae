"""Per-environment physical parameters: one row per environment overriding the model's shared values.

Domain randomisation draws these (masses, centres of mass, inertias, armature, damping, PD gains, ground friction,
how the ground gives under the feet) independently for every environment; :func:`bcg.sim.step` takes them as its
``physics`` argument. The step is not differentiable with respect to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from bcg.sim.model import SimModel
from bcg.sim.types import Physics

__all__ = ["Physics", "UNLIMITED_TORQUE", "default_physics", "check_physics", "physics_from_saved"]

UNLIMITED_TORQUE = 1e30
"""Torque limit [N m] that stands for none in a Physics row (the kernels' convention; rows must be finite)."""


def default_physics(model: SimModel, n: int, device: str | torch.device | None = None) -> Physics:
    """The model's own parameters repeated for ``n`` environments (float32)."""
    dev = torch.device(device) if device is not None else torch.device(
        "cuda:0" if model.device == "cuda" else model.device)

    def rep(x) -> torch.Tensor:
        t = torch.as_tensor(x, dtype=torch.float32, device=dev)
        return t.unsqueeze(0).expand(n, *t.shape).contiguous()

    return Physics(
        body_mass=rep(model.body_mass),
        body_com=rep(model.body_com),
        body_inertia=rep(model.body_inertia),
        dof_armature=rep(model.dof_armature),
        dof_damping=rep(model.dof_damping),
        kp=rep(model.kp),
        kd=rep(model.kd),
        mu=torch.full((n,), float(model.params.mu), dtype=torch.float32, device=dev),
        contact_bias=rep(model.params.normal_bias_gains()),
        torque_limit=rep(np.where(np.isfinite(model.torque_limit), model.torque_limit, UNLIMITED_TORQUE)),
        contact_dropout=torch.full((n,), float(model.params.dropout), dtype=torch.float32, device=dev),
    )


def check_physics(model: SimModel, physics: Physics, n: int, device: torch.device) -> None:
    """Raise a ValueError/TypeError that names the field when ``physics`` does not fit ``model`` and ``n``."""
    if not isinstance(physics, Physics):
        raise TypeError(f"physics must be a bcg.sim.Physics, got {type(physics).__name__}")
    shapes = {
        "body_mass": (n, model.nb), "body_com": (n, model.nb, 3), "body_inertia": (n, model.nb, 3, 3),
        "dof_armature": (n, model.nv), "dof_damping": (n, model.nv), "kp": (n, model.nu), "kd": (n, model.nu),
        "mu": (n,), "contact_bias": (n, 3), "torque_limit": (n, model.nu),
        "contact_dropout": (n,),
    }
    for name, shape in shapes.items():
        t = getattr(physics, name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"physics.{name} must be a float32 tensor")
        if tuple(t.shape) != shape:
            raise ValueError(f"physics.{name} must have shape {list(shape)}, got {list(t.shape)}")
        if t.device != device:
            raise ValueError(f"physics.{name} is on {t.device} but the model is on {device}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"physics.{name} contains NaN or inf")
        values = t.diagonal(dim1=-2, dim2=-1) if name == "body_inertia" else t
        if name not in ("body_com", "contact_bias") and bool((values < 0).any()):
            what = "diagonal entries" if name == "body_inertia" else "values"
            raise ValueError(f"physics.{name} must have non-negative {what}")
    if bool((physics.contact_dropout > 1).any()):
        raise ValueError("physics.contact_dropout must lie in [0, 1]")
    if bool((physics.body_mass[:, 0] <= 0).any()):
        raise ValueError("physics.body_mass of the root must be positive")


def physics_from_saved(saved: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], model: SimModel,
                       device: str | torch.device) -> Physics:
    """A :class:`Physics` from its fields as a checkpoint stores them (in field order, or by name), on ``device``.

    Rows saved before the contact gains, torque limits and contact dropouts were per environment lack
    ``contact_bias``, ``torque_limit`` or ``contact_dropout``; they get the model's own."""
    values = dict(saved) if isinstance(saved, Mapping) else dict(zip(Physics._fields, saved))
    values = {k: t.to(device).clone() for k, t in values.items()}
    later = ("contact_bias", "torque_limit", "contact_dropout")  # added after the first checkpoints, in order
    if any(k not in values for k in later) and "mu" in values:
        own = default_physics(model, int(values["mu"].shape[0]), device)
        for k in later:
            values.setdefault(k, getattr(own, k))
    missing = set(Physics._fields) - set(values)
    if missing:
        raise ValueError(f"saved physics rows lack the field(s) {sorted(missing)}")
    return Physics(**values)
