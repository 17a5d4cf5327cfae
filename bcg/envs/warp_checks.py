"""The environments' instability check of a state in one Warp launch (no gradient: it only selects rows).

A row is unstable when an entry of ``q`` exceeds ``state_limit`` in magnitude, a root position component exceeds
the simulator's bound, the root quaternion is (near) zero, an entry of ``qd`` exceeds ``min(state_limit, max
speed)``, or, with an infinite ``state_limit``, an entry of ``q`` is not finite. Each bound is tested as
``not (|x| <= bound)``, so NaN fails it the way it fails torch's ``amax`` comparison in the torch check
(``bcg.envs.instability.InstabilityGuard.torch_rows``); the two flag the same rows
(``tests/test_env_perf_invariants.py``).
Two launches per step instead of about 14 torch operations each.
"""

from __future__ import annotations

import math
import threading

import torch
import warp as wp

from bcg.envs.warp_features import bucket

__all__ = ["UnstableCheck"]

wp.set_module_options({"enable_backward": False})


@wp.func
def _unstable_row(
    q: wp.array2d(dtype=wp.float32),  # [N, nq]
    qd: wp.array2d(dtype=wp.float32),  # [N, nv]
    i: int,  # the row
    limit: float,  # bound on |q| (may be inf)
    max_pos: float,  # bound on |q[0:3]|
    max_qd: float,  # bound on |qd|
    check_finite: int,  # 1: also flag non-finite q (needed when limit is inf)
    nq: int,
    nv: int,
) -> int:
    """1 if row ``i`` is unstable, else 0 (also called by the fused step outputs, bcg.envs.warp_step)."""
    bad = int(0)  # noqa: UP018 (Warp: a mutable loop-carried variable)
    for j in range(nq):
        v = q[i, j]
        if not (wp.abs(v) <= limit):
            bad = 1
        if check_finite != 0 and not wp.isfinite(v):
            bad = 1
    for j in range(3):
        if not (wp.abs(q[i, j]) <= max_pos):
            bad = 1
    qw, qx, qy, qz = q[i, 3], q[i, 4], q[i, 5], q[i, 6]
    if not (wp.sqrt(qw * qw + qx * qx + qy * qy + qz * qz) >= 1.0e-6):
        bad = 1
    for j in range(nv):
        if not (wp.abs(qd[i, j]) <= max_qd):
            bad = 1
    return bad


@wp.kernel
def _unstable_rows(
    q: wp.array2d(dtype=wp.float32),
    qd: wp.array2d(dtype=wp.float32),
    limit: float,
    max_pos: float,
    max_qd: float,
    check_finite: int,
    nq: int,
    nv: int,
    out: wp.array(dtype=wp.int32),  # [N] out: 1 unstable, 0 stable
):
    i = wp.tid()
    out[i] = _unstable_row(q, qd, i, limit, max_pos, max_qd, check_finite, nq, nv)


class UnstableCheck:
    """``(q [N, nq], qd [N, nv], limit, max_pos, max_qd) -> [N] bool`` for float32 CPU states (detached)."""

    def __init__(self, nq: int, nv: int):
        self.nq, self.nv = int(nq), int(nv)
        self._pool: dict[int, tuple] = {}
        self.lock = threading.Lock()

    @staticmethod
    def accepts(q: torch.Tensor, qd: torch.Tensor) -> bool:
        return (q.dtype == torch.float32 and qd.dtype == torch.float32 and q.device.type == "cpu"
                and qd.device.type == "cpu" and q.shape[0] > 0)

    def _buffers(self, n: int) -> tuple:
        m = bucket(n)
        buf = self._pool.get(m)
        if buf is None:
            dev = wp.get_device("cpu")
            q = wp.zeros((m, self.nq), dtype=wp.float32, device=dev)
            qd = wp.zeros((m, self.nv), dtype=wp.float32, device=dev)
            out = wp.zeros(m, dtype=wp.int32, device=dev)
            buf = self._pool[m] = (q, qd, out, {})
        return buf

    def __call__(self, q: torch.Tensor, qd: torch.Tensor, limit: float, max_pos: float, max_qd: float
                 ) -> torch.Tensor:
        from bcg.sim import TensorLaunch

        n = q.shape[0]
        key = (float(limit), float(max_pos), float(max_qd))
        with self.lock:
            wq, wqd, wout, launches = self._buffers(n)
            run = launches.get(key)
            if run is None:  # the bounds are launch constants: one packed launch per set of bounds
                cmd = wp.launch(_unstable_rows, dim=wq.shape[0],
                                inputs=[wq, wqd, *key, int(not math.isfinite(key[0])), self.nq, self.nv],
                                outputs=[wout], device=wq.device, record_cmd=True)
                # reads the caller's tensors and writes a fresh one (no copies in or out)
                run = launches[key] = TensorLaunch(cmd, [("q", wq), ("qd", wqd), ("out", wout)], rows=True)
            out = torch.empty(n, dtype=torch.int32)
            run(q, qd, out)
        return out != 0
