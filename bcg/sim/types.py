"""The simulator's shared value types: what :func:`bcg.sim.step` takes besides the state, and what it reports.

Plain named tuples of torch tensors, with no Warp dependency, so that environments, estimators and agents can name
them without importing the engine.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["ContactReport", "Physics"]


class Physics(NamedTuple):
    """Per-environment parameters, float32 tensors on the model's device (N environments)."""

    body_mass: torch.Tensor
    """[N, nb] body masses [kg]."""
    body_com: torch.Tensor
    """[N, nb, 3] centres of mass in the body frames [m]."""
    body_inertia: torch.Tensor
    """[N, nb, 3, 3] rotational inertias about the COM, body frames [kg m^2]."""
    dof_armature: torch.Tensor
    """[N, nv] armature added to the mass-matrix diagonal."""
    dof_damping: torch.Tensor
    """[N, nv] viscous joint damping [N m s/rad]."""
    kp: torch.Tensor
    """[N, nu] PD position gains [N m/rad]."""
    kd: torch.Tensor
    """[N, nu] PD velocity gains [N m s/rad]."""
    mu: torch.Tensor
    """[N] ground friction coefficients."""
    contact_bias: torch.Tensor
    """[N, 3] gains (g_free, g_start, g_depth) of the normal contact rows' velocity bias: how the ground gives
    (``ContactParams.normal_bias_gains``; Baumgarte contact (1, 0, beta), soft contact (i, 2 h / T - i, beta))."""
    torque_limit: torch.Tensor
    """[N, nu] actuator torque limits [N m] (the soft saturation's level; 1e30 for an actuator without one)."""
    contact_dropout: torch.Tensor
    """[N] probability in [0, 1] that a foot sphere near the ground has no contact in a substep
    (``ContactParams.dropout``)."""

    def index_put(self, env_ids: torch.Tensor, rows: Physics) -> Physics:
        """A copy whose rows ``env_ids`` are replaced by ``rows`` (a Physics of len(env_ids) environments)."""
        out = []
        for cur, new in zip(self, rows):
            t = cur.clone()
            t[env_ids] = new.to(t)
            out.append(t)
        return Physics(*out)


class ContactReport(NamedTuple):
    """Per-sphere contact quantities of one control step. All [N, nc]."""

    impulse: torch.Tensor
    """Normal impulse summed over the substeps [N s]."""
    peak_force: torch.Tensor
    """Largest normal force over the substeps, impulse / h [N] (the BCG trigger quantity)."""
    penetration: torch.Tensor
    """Penetration d = radius - z_centre at the last substep [m] (positive when penetrating)."""
