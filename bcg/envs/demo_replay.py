"""Demonstration replay (DiffMimic): a row that drifts too far from the reference is put back on it.

After a control step, every row whose tracking error (the mean over the bodies of the distance between simulated
and reference body origins, the env's ``info["tracking_error"]``, [m]) exceeds the threshold gets the reference
state of its current frame: the pose and velocities a reset to that frame gives (no reset noise), while the episode
goes on (frame, episode steps, previous actions, randomisation unchanged). The replaced rows are constants and every
other field of those rows is detached, so no gradient flows from later steps of such a row to its earlier steps:
a differentiable window is cut there, as it is at a window boundary. The episode is not terminated and the reward
of the step that drifted is kept as it was.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

from bcg.envs.state import EnvState

__all__ = ["DemonstrationReplay"]


class DemonstrationReplay:
    """Replace the state of rows whose tracking error exceeds ``threshold_m`` [m] by the reference state.

    DiffMimic uses 0.2 m for run and walk clips and 0.4 m for acrobatic ones (jump, dance, backflip).
    """

    def __init__(self, threshold_m: float):
        if not (isinstance(threshold_m, numbers.Real) and math.isfinite(threshold_m) and threshold_m > 0):
            raise ValueError(f"threshold_m must be a finite number > 0 [m], got {threshold_m!r}")
        self.threshold_m = float(threshold_m)

    def __call__(self, state: EnvState, obs: torch.Tensor, tracking_error: torch.Tensor, done: torch.Tensor,
                 table: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                 ) -> tuple[EnvState, torch.Tensor, torch.Tensor]:
        """Replay the rows that drifted.

        Args:
            state: the state after the step (N rows).
            obs: [N, D] the noise-free observations of ``state``.
            tracking_error: [N] tracking error after the step [m].
            done: [N] bool, rows whose episode ends this step (they are reset instead, never replayed).
            table: ``(q [F, nq], qd [F, nv], obs [F, D])``, the reset state and its noise-free observation at every
                frame of the clip.
        Returns:
            ``(state, obs, replayed [N] bool)`` with the replayed rows replaced (out of place; the others' tensors
            and gradients untouched).
        """
        replayed = (tracking_error.detach() > self.threshold_m) & ~done
        idx = replayed.nonzero().flatten()
        if idx.numel() == 0:
            return state, obs, replayed
        q_t, qd_t, obs_t = table
        rows = state[idx].detach()
        frame = rows.frame.clamp(0, q_t.shape[0] - 1)
        rows = dataclasses.replace(rows, q=q_t[frame], qd=qd_t[frame])
        state = state.scatter(idx, rows).clear_memory(replayed)  # the transition's memory was of the old state
        return state, obs.index_put((idx,), obs_t[frame].to(obs.dtype)), replayed
