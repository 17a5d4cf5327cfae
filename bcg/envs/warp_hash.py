"""The counter-based draws of :mod:`bcg.envs.transition` in Warp launches on the CPU, bit for bit.

:func:`bcg.envs.transition.hash_uniform` is three rounds of a 32-bit mixing function written in int64 torch
operations with masks (about 40 operations on an [N, width] int64 tensor: the observation noise draws 849 numbers
per row every step). The same arithmetic in uint32 (multiplication and addition modulo 2^32, which is what the
int64 products do once masked) is one launch. Integer arithmetic is exact, and the final conversion of a 24-bit
integer to float32 times 2^-24 is exact too, so the draws are the same bits (``tests/test_env_warp_features.py``).
"""

from __future__ import annotations

import threading

import torch
import warp as wp

from bcg.envs.warp_features import bucket, head

__all__ = ["WarpHash"]

wp.set_module_options({"enable_backward": False})


@wp.func
def _mix(v: wp.uint32) -> wp.uint32:
    """lowbias32-style mixing of bcg.envs.transition._hash32 (modulo 2^32)."""
    x = v
    x = (x ^ (x >> wp.uint32(16))) * wp.uint32(0x21F0AAAD)
    x = (x ^ (x >> wp.uint32(15))) * wp.uint32(0x735A2D97)
    return x ^ (x >> wp.uint32(15))


@wp.kernel
def _hash_rows(x: wp.array(dtype=wp.int64), add: wp.int64, out: wp.array(dtype=wp.int64)):
    i = wp.tid()
    out[i] = wp.int64(_mix(wp.uint32(x[i] + add)))  # the cast keeps the low 32 bits, as the torch mask does


@wp.kernel
def _uniform(key: wp.array(dtype=wp.int64), counter: wp.array(dtype=wp.int64), stream: wp.uint32, width: int,
             out: wp.array2d(dtype=wp.float32)):
    i = wp.tid()
    a = _mix(wp.uint32(key[i]) * wp.uint32(0x9E37) + stream)
    b = _mix(a ^ wp.uint32(counter[i]))
    for j in range(width):
        c = _mix(b + wp.uint32(j) * wp.uint32(0x632BE5AB))
        out[i, j] = wp.float32(c >> wp.uint32(8)) * (1.0 / 16777216.0)


class WarpHash:
    """``hash32(x)`` and ``uniform(key, counter, width, stream)``: :func:`bcg.envs.transition._hash32` and
    :func:`~bcg.envs.transition.hash_uniform` for int64 CPU tensors, the same bits."""

    def __init__(self) -> None:
        self._pool: dict[tuple, tuple] = {}
        self.lock = threading.Lock()

    @staticmethod
    def accepts(*xs: torch.Tensor) -> bool:
        return all(x.dtype == torch.int64 and x.device.type == "cpu" and x.dim() == 1 for x in xs) and \
            xs[0].shape[0] > 0

    def _arrays(self, kind: str, n: int, width: int = 0) -> tuple:
        key = (kind, bucket(n), width)
        got = self._pool.get(key)
        if got is None:
            dev, m = wp.get_device("cpu"), bucket(n)
            a = wp.zeros(m, dtype=wp.int64, device=dev)
            b = wp.zeros(m, dtype=wp.int64, device=dev)
            out = (wp.zeros(m, dtype=wp.int64, device=dev) if kind == "hash"
                   else wp.zeros((m, width), dtype=wp.float32, device=dev))
            got = self._pool[key] = (a, b, out, wp.to_torch(a), wp.to_torch(b), wp.to_torch(out), {})
        return got

    def hash32(self, x: torch.Tensor, add: int = 0) -> torch.Tensor:
        """``_hash32(x + add)`` [K] int64 (values in [0, 2^32))."""
        from bcg.sim import prepack

        n = x.shape[0]
        with self.lock:
            a, _, out, ta, _, tout, runs = self._arrays("hash", n)
            run = runs.get(add)
            if run is None:
                cmd = wp.launch(_hash_rows, dim=a.shape[0], inputs=[a, wp.int64(add)], outputs=[out], device=a.device,
                                record_cmd=True)
                run = runs[add] = prepack(cmd)
            head(ta, n).copy_(x)
            run()
            return head(tout, n).clone()

    def uniform(self, key: torch.Tensor, counter: torch.Tensor, width: int, stream: int) -> torch.Tensor:
        """``hash_uniform(key, counter, width, stream)`` [K, width] float32."""
        from bcg.sim import prepack

        n = key.shape[0]
        with self.lock:
            a, b, out, ta, tb, tout, runs = self._arrays("uniform", n, int(width))
            run = runs.get(stream)
            if run is None:
                cmd = wp.launch(_uniform, dim=a.shape[0], inputs=[a, b, wp.uint32(stream & 0xFFFF), int(width)],
                                outputs=[out], device=a.device, record_cmd=True)
                run = runs[stream] = prepack(cmd)
            head(ta, n).copy_(key)
            head(tb, n).copy_(counter)
            run()
            return head(tout, n).clone()
