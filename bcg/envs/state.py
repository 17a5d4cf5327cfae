"""The per-environment state of the G1 tracking environments: everything one control step reads.

An :class:`EnvState` is a frozen dataclass of tensors whose first dimension is the environment (row). It is gathered
(``state[idx]``), scattered (``state.scatter(idx, rows)``) and repeated (``state.repeat_interleave(B)``, B branches
per environment, branch-major inside each environment) without knowing its fields, so estimators can branch and
restore environments. ``env_id`` records which environment of the vector env a row belongs to and travels with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bcg.sim import Physics

__all__ = ["EnvState"]


def _map(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if x is None:
        return None
    if isinstance(x, Physics):
        return Physics(*(fn(t) for t in x))
    return fn(x)


@dataclass(frozen=True)
class EnvState:
    """State of ``N`` environments (all tensors on one device, first dimension ``N``)."""

    q: torch.Tensor
    """[N, 36] qpos (MuJoCo layout, root quaternion w, x, y, z)."""
    qd: torch.Tensor
    """[N, 35] qvel (root linear velocity world frame, angular velocity body frame, hinge rates)."""
    frame: torch.Tensor
    """[N] long: reference frame index of the current time."""
    episode_steps: torch.Tensor
    """[N] long: control steps since the episode began."""
    prev_actions: torch.Tensor
    """[N, nu] the previous step's policy actions (at a reset: the action that reproduces the reference pose)."""
    delayed_actions: torch.Tensor
    """[N, nu] the action an environment with latency applies next (the previous step's action)."""
    joint_offset: torch.Tensor
    """[N, nu] offset of the default joint position [rad] (domain randomisation)."""
    latency: torch.Tensor
    """[N] bool: the environment applies its actions one control step late."""
    push_countdown: torch.Tensor
    """[N] long: control steps until the next push (-1: pushes off)."""
    push_vel: torch.Tensor
    """[N, 6] the velocity change of the next push (linear world frame [m/s], angular body frame [rad/s])."""
    rng_key: torch.Tensor
    """[N] long in [0, 2^31): per-environment key of the counter-based draws inside the transition (pushes)."""
    env_id: torch.Tensor
    """[N] long: the environment of the vector env each row belongs to."""
    physics: Physics | None = None
    """Per-environment physical parameters (rows [N, ...]), or None for the model's own values."""

    # -------------------------------------------------------------------------------------------- row operations

    @property
    def num_envs(self) -> int:
        return int(self.q.shape[0])

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> EnvState:
        """A state with ``fn`` applied to every tensor (Physics fields included)."""
        return EnvState(**{f.name: _map(getattr(self, f.name), fn) for f in dataclasses.fields(self)})

    def __getitem__(self, idx: torch.Tensor | slice | int) -> EnvState:
        """Gather rows ``idx`` (a long index tensor, a bool mask, a slice or an int; an int keeps the row dimension)."""
        if isinstance(idx, int):
            idx = slice(idx, idx + 1 if idx != -1 else None)
        return self.map(lambda t: t[idx])

    def scatter(self, idx: torch.Tensor, rows: EnvState) -> EnvState:
        """A copy whose rows ``idx`` [K] are replaced by ``rows`` (a state of K rows); out of place, so tensors
        saved for a backward pass are untouched."""
        out = {}
        for f in dataclasses.fields(self):
            cur, new = getattr(self, f.name), getattr(rows, f.name)
            if cur is None and new is None:
                out[f.name] = None
            elif isinstance(cur, Physics) and isinstance(new, Physics):
                out[f.name] = Physics(*(c.index_put((idx,), n.to(c)) for c, n in zip(cur, new, strict=True)))
            elif isinstance(cur, torch.Tensor) and isinstance(new, torch.Tensor):
                out[f.name] = cur.index_put((idx,), new.to(cur.dtype))
            else:
                raise ValueError(f"EnvState.scatter: field {f.name!r} is {type(cur).__name__} here and "
                                 f"{type(new).__name__} in the rows")
        return EnvState(**out)

    def repeat_interleave(self, repeats: int) -> EnvState:
        """Every row repeated ``repeats`` times in place: rows ``[0, 0, ..., 1, 1, ...]`` (branches of each env)."""
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
        return self.map(lambda t: t.repeat_interleave(repeats, dim=0))

    def detach(self) -> EnvState:
        """The same values without autograd history (the start of a new differentiable window)."""
        return self.map(lambda t: t.detach())

    def clone(self) -> EnvState:
        """A deep copy of every tensor (detached)."""
        return self.map(lambda t: t.detach().clone())

    def check_like(self, other: EnvState) -> None:
        """Raise ``ValueError`` unless every field of this state is set where ``other``'s is and has its shape, dtype
        and device (the message names the first field that differs)."""
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if (a is None) != (b is None):
                raise ValueError(f"load_state: field {f.name!r} is {'None' if a is None else 'set'}, this "
                                 f"environment's is {'None' if b is None else 'set'}")
            for x, y in (zip(a, b, strict=True) if isinstance(a, Physics) else [(a, b)] if a is not None else []):
                if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
                    raise ValueError(f"load_state: field {f.name!r} has shape {list(x.shape)} {x.dtype} on "
                                     f"{x.device}, expected {list(y.shape)} {y.dtype} on {y.device}")

    def equal(self, other: EnvState) -> bool:
        """Bit-for-bit equality of every field."""
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if (a is None) != (b is None):
                return False
            if a is None:
                continue
            pairs = zip(a, b, strict=True) if isinstance(a, Physics) else [(a, b)]
            if not all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs):
                return False
        return True
