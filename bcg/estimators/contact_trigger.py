"""What opens a bundle of the ``bcg`` estimator and how many branches it gets (docs/estimators.md).

A trigger rule reads a control step's contact report and gives, per contact body (foot), the quantity it compares
with its threshold: :class:`ForceTrigger` the normal force [N], :class:`ActivationTrigger` the change of the contact
activation sigmoid(kappa d) over the step (dimensionless, 0-1). A rule that needs the previous step (the activation
change) keeps what it needs in the rows' transition memory (:meth:`memory`). :func:`bundle_sizes` turns the
quantity of a new bundle into its number of branches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bcg.sim import ContactReport

__all__ = ["ACTIVATION_KEY", "ActivationTrigger", "ForceTrigger", "bundle_sizes"]

ACTIVATION_KEY = "bcg.act"
"""The memory row :class:`ActivationTrigger` adds: [N, nc + 1], every contact sphere's activation sigmoid(kappa d) at
the end of the step, then 1.0 ("recorded"). A cleared row (all zero) has no record, so the step after a reset or a
replaced state does not read a switch from nothing."""


def _per_foot_max(model, per_sphere: torch.Tensor) -> torch.Tensor:
    """[N, nf] the largest of each contact body's spheres' entries of ``per_sphere`` [N, nc]."""
    foot = torch.as_tensor(model.sphere_foot, dtype=torch.long, device=per_sphere.device)
    per = per_sphere.new_zeros(per_sphere.shape[0], len(model.foot_body))
    return per.scatter_reduce(1, foot[None].expand(per_sphere.shape[0], -1), per_sphere, reduce="amax",
                              include_self=False)


@dataclass(frozen=True)
class ForceTrigger:
    """A bundle where a contact's normal force over the step (the substeps' peak) passes ``tau`` [N]."""

    tau: float
    aggregation: str = "per_point"
    """``per_point``: the largest force of one sphere of the foot; ``per_foot``: the sum over its spheres."""

    @property
    def threshold(self) -> float:
        return self.tau

    def foot_quantity(self, model, contact: ContactReport, memory: dict[str, torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """[N, nf] per contact body (``model.foot_body`` order) its force [N] (detached); ``memory`` is not read."""
        f = contact.peak_force.detach()
        if self.aggregation == "per_foot":
            foot = torch.as_tensor(model.sphere_foot, dtype=torch.long, device=f.device)
            return f.new_zeros(f.shape[0], len(model.foot_body)).index_add(1, foot, f)
        return _per_foot_max(model, f)

    def memory(self, model, contact: ContactReport) -> dict[str, torch.Tensor]:
        """Nothing to carry to the next step."""
        return {}


@dataclass(frozen=True)
class ActivationTrigger:
    """A bundle where a contact switched: one sphere's activation sigmoid(kappa d) changed by more than
    ``activation_change`` over the step. The activation's slope kappa s (1 - s) is the smoothed contact's local
    sensitivity to the penetration; a large change means the step crossed that steep band (a touchdown, a lift-off)."""

    activation_change: float

    @property
    def threshold(self) -> float:
        return self.activation_change

    def foot_quantity(self, model, contact: ContactReport, memory: dict[str, torch.Tensor] | None = None
                      ) -> torch.Tensor:
        """[N, nf] per contact body the largest change of one of its spheres' activations from the one recorded in
        ``memory`` (the incoming rows' :data:`ACTIVATION_KEY`) to the end of this step (detached; 0 for rows without
        a record)."""
        now = self.activations(model, contact)
        recorded = (memory or {}).get(ACTIVATION_KEY)
        if recorded is None:
            return now.new_zeros(now.shape[0], len(model.foot_body))
        change = (now - recorded[:, :-1].to(now.dtype)).abs() * recorded[:, -1:].to(now.dtype)
        return _per_foot_max(model, change)

    def memory(self, model, contact: ContactReport) -> dict[str, torch.Tensor]:
        """``{ACTIVATION_KEY: [N, nc + 1]}``: the step's activations, recorded."""
        act = self.activations(model, contact)
        return {ACTIVATION_KEY: torch.cat([act, torch.ones_like(act[:, :1])], 1)}

    @staticmethod
    def activations(model, contact: ContactReport) -> torch.Tensor:
        """[N, nc] sigmoid(kappa d) of every sphere at the step's end (detached)."""
        return torch.sigmoid(model.params.kappa * contact.penetration.detach())


def bundle_sizes(quantity: torch.Tensor, threshold: float, min_branches: int, branches: int,
                 antithetic: bool = False) -> torch.Tensor:
    """[t] long: the branches of t new bundles whose trigger quantity is ``quantity`` [t]: ceil(min_branches (x /
    threshold)^2), clamped to [min_branches, branches] (rounded up to even with ``antithetic``, so pairs stay whole).
    The mean of B branches has a sampling variance of spread^2 / B, and the spread grows with the contact's
    sensitivity, so B follows its square."""
    ratio = quantity.to(torch.float64) / max(threshold, 1e-12)
    b = torch.ceil(min_branches * ratio * ratio).clamp(min_branches, branches).long()
    return (b + b % 2).clamp(max=branches) if antithetic else b
