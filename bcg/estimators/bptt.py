"""``bptt``: plain backpropagation through time, one branch per environment (the inner transition, untouched)."""

from __future__ import annotations

from dataclasses import dataclass

from bcg.estimators.base import Estimator, EstimatorStats
from bcg.estimators.registry import register

__all__ = ["BPTT"]


@register("bptt")
@dataclass(frozen=True)
class BPTT(Estimator):
    """Exact pathwise gradient of the single nominal rollout: the env with this estimator is bit-identical to the
    env without one (values and gradients)."""

    def _transition(self, model, q, qd, targets, physics, *, env_ids, memory):
        q1, qd1, contact, mem = self.inner(model, q, qd, targets, physics, env_ids=env_ids, memory=memory)
        n = int(q.shape[0])
        return q1, qd1, contact, mem, EstimatorStats(calls=1, envs=n, branches_simulated=n)
