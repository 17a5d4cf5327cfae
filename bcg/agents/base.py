"""What every agent offers the trainer (``bcg train``): one iteration at a time, scalars, and an exact state.

An agent (SHAC in :mod:`bcg.agents.shac`, PPO in :mod:`bcg.agents.ppo`) owns its environment, networks and
optimisers. The trainer (:mod:`bcg.agents.train`) calls :meth:`Agent.train_iteration` in a loop, logs the scalars it
returns, writes :meth:`Agent.state_dict` as a checkpoint and restores it with :meth:`Agent.load_state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Agent", "METRIC_NAMES"]

METRIC_NAMES: dict[str, str] = {
    "reward": "mean per-step reward of the iteration's rollout",
    "tracking_error_cm": "mean per-body position error of the rollout (E_track) [cm]",
    "episode_return": "mean undiscounted return of the episodes that ended in this iteration (NaN if none)",
    "episode_length": "mean length of the episodes that ended in this iteration [control steps] (NaN if none)",
    "trigger_rate": "fraction of environment steps the estimator branched (0 for bptt and PPO)",
    "grad_norm": "actor (policy) gradient norm before clipping",
    "skipped_updates": "updates skipped so far because the gradient norm was non-finite or absurd (cumulative)",
    "nonfinite_resets": "environments reset so far because their state was non-finite or diverged (cumulative)",
    "actor_loss": "actor (policy) loss",
    "critic_loss": "critic (value) loss",
    "lr": "actor (policy) learning rate",
}
"""Scalars every agent reports from :meth:`Agent.train_iteration` (NaN where one does not apply); agents may add
their own. The trainer adds ``iteration``, ``samples`` and ``wall_time_s``."""


@runtime_checkable
class Agent(Protocol):
    """The trainer's view of an agent."""

    iteration: int
    """Iterations completed."""
    samples: int
    """Environment samples consumed so far (environment steps, counting every simulated branch)."""

    def train_iteration(self) -> dict[str, float]:
        """Run one iteration (a rollout and an update); return at least the scalars of :data:`METRIC_NAMES`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: networks, optimisers, normalisers, environment state, random
        generators, counters. Only tensors and plain Python values (int, float, str, bool, None, lists, tuples,
        dicts), so ``torch.load(..., weights_only=True)`` reads it back."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; afterwards the agent repeats the numbers of the run it came from."""
        ...

    def export_policy(self) -> dict[str, Any]:
        """The deterministic policy in the self-contained export format of :mod:`bcg.agents.export`."""
        ...
