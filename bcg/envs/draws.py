"""The environments' counter-based random draws: per-row keys and counters in, the same bits on every path out.

Every random number a step or a reset uses (observation noise, pushes, start frames, the keys of new episodes) is a
function of a row's ``rng_key`` and a counter (:func:`bcg.envs.transition.hash_uniform`), so a restored state
repeats its draws and a row copied into branches draws the same values in each. On the CPU the draws run as one Warp
launch each (:class:`bcg.envs.warp_hash.WarpHash`); elsewhere, or with the Warp paths off, the torch functions give
the same bits.
"""

from __future__ import annotations

import torch

from bcg.envs.transition import _hash32, hash_uniform
from bcg.envs.warp_hash import WarpHash

__all__ = ["NEXT_KEY_ADD", "STREAM_NOISE", "STREAM_PUSH", "STREAM_RESET", "STREAM_START", "CounterDraws"]

# streams of the draws (the ``stream`` argument of hash_uniform): one per use, so the uses never share numbers
STREAM_PUSH, STREAM_NOISE, STREAM_RESET, STREAM_START = 1, 2, 3, 4
NEXT_KEY_ADD = 0x5BD1E995
"""The constant of :meth:`CounterDraws.next_keys` (the one-launch Warp reset repeats it)."""


class CounterDraws:
    """``hash32``, ``uniform`` and ``next_keys`` on int64 tensors, by Warp launches on the CPU when ``use_warp``.

    Args:
        use_warp: take the Warp launches where they apply (CPU int64 vectors); settable later (tests compare both).
    """

    def __init__(self, use_warp: bool) -> None:
        self.use_warp = bool(use_warp)
        self._warp: WarpHash | None = None  # made on first use

    def _warp_for(self, *xs: torch.Tensor) -> WarpHash | None:
        if not (self.use_warp and WarpHash.accepts(*xs)):
            return None
        if self._warp is None:
            self._warp = WarpHash()
        return self._warp

    def hash32(self, x: torch.Tensor, add: int = 0) -> torch.Tensor:
        """``_hash32(x + add)`` [K] int64, values in [0, 2^32)."""
        warp = self._warp_for(x)
        if warp is not None:
            return warp.hash32(x, add)
        return _hash32(x + add if add else x)

    def uniform(self, key: torch.Tensor, counter: torch.Tensor, width: int, stream: int) -> torch.Tensor:
        """``hash_uniform(key, counter, width, stream)``: U(0, 1) draws [K, width] float32 of keys and counters [K]."""
        warp = self._warp_for(key, counter)
        if warp is not None:
            return warp.uniform(key, counter, width, stream)
        return hash_uniform(key, counter, width, stream)

    def next_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """New keys [K] for rows starting a new episode: a deterministic function of their old ``keys`` [K]."""
        return self.hash32(keys, NEXT_KEY_ADD) & 0x7FFFFFFF
