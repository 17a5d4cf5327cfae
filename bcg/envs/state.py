"""The per-environment state of the G1 tracking environments: everything one control step reads.

An :class:`EnvState` is a frozen dataclass of tensors whose first dimension is the environment (row). It is gathered
(``state[idx]``), scattered (``state.scatter(idx, rows)``) and repeated (``state.repeat_interleave(B)``, B branches
per environment, branch-major inside each environment) without knowing its fields, so estimators can branch and
restore environments. ``env_id`` records which environment of the vector env a row belongs to and travels with it.

``memory`` holds the transition function's own per-row state (an estimator's open bundles, a MuJoCo row's step
token), named ``"owner.key"``: tensors of N rows that travel with their rows through every operation above, are
detached by :meth:`EnvState.detach` and are zero in a row that starts an episode or whose state was replaced
(:meth:`EnvState.clear_memory`). A transition function never has to guess from the values of ``q`` whether a row is
the one it returned: zero memory says "nothing carried over".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bcg.sim import Physics

__all__ = ["EnvState", "cleared_memory"]


def _map(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if x is None:
        return None
    if isinstance(x, Physics):
        return Physics(*(fn(t) for t in x))
    if isinstance(x, dict):
        return {k: fn(t) for k, t in x.items()}
    return fn(x)


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors of a field (none, one, a Physics' or a memory dict's, in key order)."""
    if x is None:
        return []
    if isinstance(x, Physics):
        return list(x)
    if isinstance(x, dict):
        return [x[k] for k in sorted(x)]
    return [x]


def _scatter_memory(cur: dict[str, torch.Tensor], n: int, idx: torch.Tensor, new: dict[str, torch.Tensor],
                    k: int) -> dict[str, torch.Tensor]:
    """``cur`` (n rows) with rows ``idx`` replaced by ``new`` (k rows); a key on one side only is zero on the other."""
    out = {}
    for key in sorted(set(cur) | set(new)):
        c, r = cur.get(key), new.get(key)
        if c is None:
            c = r.new_zeros((n, *r.shape[1:]))
        if r is None:
            r = c.new_zeros((k, *c.shape[1:]))
        out[key] = c.index_put((idx,), r.to(c.dtype))
    return out


def cleared_memory(memory: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """``memory`` with every entry zero in ``rows`` ([N] bool)."""
    keep = ~rows.to(torch.bool)
    return {k: torch.where(keep.view(-1, *([1] * (t.dim() - 1))), t, torch.zeros_like(t)) for k, t in memory.items()}


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
    memory: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """The transition function's per-row state, ``{"owner.key": [N, ...]}`` (empty for the simulator alone); zero in a
    row means nothing carries over into that row's next step (see the module docstring)."""

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
        saved for a backward pass are untouched. A memory key that only one side has is zero on the other (fresh
        episode rows carry no memory)."""
        out = {}
        for f in dataclasses.fields(self):
            cur, new = getattr(self, f.name), getattr(rows, f.name)
            if cur is None and new is None:
                out[f.name] = None
            elif isinstance(cur, Physics) and isinstance(new, Physics):
                out[f.name] = Physics(*(c.index_put((idx,), n.to(c)) for c, n in zip(cur, new, strict=True)))
            elif isinstance(cur, dict) and isinstance(new, dict):
                out[f.name] = _scatter_memory(cur, self.num_envs, idx, new, rows.num_envs)
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

    def clear_memory(self, rows: torch.Tensor) -> EnvState:
        """A copy whose transition memory is zero in ``rows`` ([N] bool): rows whose state was replaced (a reset, the
        instability guard's safe pose, a demonstration replay) carry nothing of their previous steps forward."""
        return dataclasses.replace(self, memory=cleared_memory(self.memory, rows)) if self.memory else self

    def saved(self) -> dict[str, Any]:
        """The state as a checkpoint stores it (detached clones; ``torch.load(..., weights_only=True)`` reads it):
        ``{field: tensor | None}``, the Physics rows as a list in field order, the memory as a dict."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = (None if v is None else [t.detach().clone() for t in v] if isinstance(v, Physics)
                           else {k: t.detach().clone() for k, t in v.items()} if isinstance(v, dict)
                           else v.detach().clone())
        return out

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any], model: Any, device: torch.device | str) -> EnvState:
        """The state :meth:`saved` stored, on ``device``. Physics rows may be stored by name (as earlier PPO
        checkpoints did); a checkpoint written before states had a memory gets an empty one."""
        from bcg.sim import physics_from_saved

        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "memory":
                kw[f.name] = {k: t.to(device).clone() for k, t in saved.get("memory", {}).items()}
                continue
            v = saved[f.name]
            if f.name == "physics":
                kw[f.name] = None if v is None else physics_from_saved(v, model, device)
            else:
                kw[f.name] = v.to(device).clone()
        return cls(**kw)

    def check_like(self, other: EnvState) -> None:
        """Raise ``ValueError`` unless every field of this state is set where ``other``'s is and has its shape, dtype
        and device (the message names the first field that differs)."""
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "memory":  # the transition function's own layout: only its rows must match
                for k, t in a.items():
                    if t.shape[:1] != other.q.shape[:1] or t.device != other.q.device:
                        raise ValueError(f"load_state: memory {k!r} has shape {list(t.shape)} on {t.device}, expected "
                                         f"{other.num_envs} rows on {other.q.device}")
                continue
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
            if isinstance(a, dict) and sorted(a) != sorted(b):
                return False
            pairs = zip(_tensors(a), _tensors(b), strict=True)
            if not all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs):
                return False
        return True
