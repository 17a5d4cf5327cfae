"""The seam between the environments and whatever advances the physics: the transition-function protocol, and the
counter-based random draws that keep the environments' transition free of hidden randomness.

A *transition function* has the signature of :func:`bcg.sim.step` plus two keyword arguments, and returns its own
per-row memory besides the next state::

    fn(model, q, qd, targets, physics=None, *, env_ids, memory) -> (q_next, qd_next, contact, memory_next)

``env_ids`` [N] long says which environment of the vector env each row belongs to (rows of a branched state
repeat their environment's id). ``memory`` is the rows' :attr:`~bcg.envs.state.EnvState.memory` (``{"owner.key":
[N, ...]}``; None or empty for rows that carry nothing, e.g. a direct call), and ``memory_next`` the memory of the
returned rows, which the environment stores in the next state. Whatever a transition function keeps between steps
lives there, so it is gathered, branched, detached, checkpointed and restored with its rows, and zero wherever the
environment started or replaced a row. Estimators (bundled or smoothed gradients) plug in here; the environments
never import one.
"""

from __future__ import annotations

from typing import Protocol

import torch

from bcg.sim import ContactReport, Physics, SimModel

__all__ = ["Memory", "TransitionFn", "hash_uniform", "simulator_step"]

Memory = dict[str, torch.Tensor]
"""A transition function's per-row state: ``{"owner.key": [N, ...]}``."""


class TransitionFn(Protocol):
    """One control step of the physics for a batch of rows (see the module docstring)."""

    def __call__(self, model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                 physics: Physics | None = None, *, env_ids: torch.Tensor, memory: Memory | None
                 ) -> tuple[torch.Tensor, torch.Tensor, ContactReport, Memory]: ...


def simulator_step(model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor,
                   physics: Physics | None = None, *, env_ids: torch.Tensor | None = None,
                   memory: Memory | None = None) -> tuple[torch.Tensor, torch.Tensor, ContactReport, Memory]:
    """The default transition function: :func:`bcg.sim.step` (looked up at call time); it keeps no memory."""
    import bcg.sim

    return (*bcg.sim.step(model, q, qd, targets, physics), {})


_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function on int64 tensors holding values in [0, 2^32) (Wellons' lowbias32 style;
    every product stays below 2^63, so int64 arithmetic never overflows)."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x21F0AAAD) & _MASK32
    x = ((x ^ (x >> 15)) * 0x735A2D97) & _MASK32  # second multiplier < 2^31: product < 2^63
    return x ^ (x >> 15)


def hash_uniform(key: torch.Tensor, counter: torch.Tensor, width: int, stream: int = 0) -> torch.Tensor:
    """Deterministic U(0, 1) draws [N, width] (float32) of per-row ``key`` [N] and ``counter`` [N] (long).

    The same (key, counter, stream) always gives the same numbers, whatever the batch around it: a row copied into
    B branches draws the same values in each branch, and a restored state repeats its draws bit for bit.
    """
    j = torch.arange(width, device=key.device, dtype=torch.long)
    x = _hash32(key[:, None] * 0x9E37 + (stream & 0xFFFF))
    x = _hash32(x ^ (counter[:, None] & _MASK32))
    x = _hash32(x + j[None] * 0x632BE5AB)
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 random bits: exact in float32, in [0, 1)
