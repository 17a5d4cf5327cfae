"""The environments' instability guard: which rows of a state the simulator would refuse or that diverged.

A row is unstable when it is non-finite, an entry of ``q`` exceeds ``state_limit`` in magnitude, a root position
component exceeds :data:`bcg.sim.MAX_ROOT_POSITION`, the root quaternion is (near) zero, or an entry of ``qd``
exceeds ``min(state_limit, bcg.sim.MAX_SPEED)``. The environment resets such rows before the simulator sees them
and ends rows that become unstable with reward 0 and a blocked gradient (``docs/envs.md``).

On the CPU the check is one Warp launch (:class:`bcg.envs.warp_checks.UnstableCheck`); elsewhere, and for float64 or
empty batches, the torch code below, which flags the same rows (``tests/test_env_perf_invariants.py``). The path is
fixed when the guard is made (``use_warp``); :attr:`InstabilityGuard.use_warp` switches it for the tests that
compare the two.
"""

from __future__ import annotations

import math

import torch

import bcg.sim
from bcg.envs.warp_checks import UnstableCheck

__all__ = ["InstabilityGuard", "simulator_bounds"]


def simulator_bounds() -> tuple[float, float]:
    """(largest |qd| entry [rad/s or m/s], largest |root position| component [m]) the simulator accepts, read at call
    time (tests lower them)."""
    return float(bcg.sim.MAX_SPEED), float(bcg.sim.MAX_ROOT_POSITION)


class InstabilityGuard:
    """``guard(q [M, nq], qd [M, nv]) -> [M] bool``: the unstable rows (see the module docstring).

    Args:
        state_limit: bound on |q| and |qd| entries (EnvConfig.state_limit); settable later.
        nq, nv: state sizes of the model.
        use_warp: check float32 CPU batches in one Warp launch.
    """

    def __init__(self, state_limit: float, nq: int, nv: int, use_warp: bool):
        self.state_limit = float(state_limit)
        self.use_warp = bool(use_warp)
        self._warp = UnstableCheck(nq, nv) if use_warp else None

    def key(self) -> tuple[float, float, float]:
        """The bounds in force now, (state_limit, MAX_SPEED, MAX_ROOT_POSITION): a cache key for what depends on
        them."""
        return (self.state_limit, *simulator_bounds())

    def launch_bounds(self) -> tuple[float, float, float]:
        """(bound on |q|, on |root position|, on |qd|), the constants of the check's launch."""
        max_speed, max_pos = simulator_bounds()
        return self.state_limit, max_pos, min(self.state_limit, max_speed)

    def __call__(self, q: torch.Tensor, qd: torch.Tensor) -> torch.Tensor:
        if self.use_warp and self._warp is not None and UnstableCheck.accepts(q, qd):
            return self._warp(q.detach(), qd.detach(), *self.launch_bounds())
        max_speed, max_pos = simulator_bounds()
        return self.torch_rows(q, qd, max_speed, max_pos)

    def torch_rows(self, q: torch.Tensor, qd: torch.Tensor, max_speed: float, max_pos: float) -> torch.Tensor:
        """The check in torch operations (any device and dtype), with the given simulator bounds."""
        with torch.no_grad():
            q, qd = q.detach(), qd.detach()
            # NaN and inf fail a comparison with a finite bound (amax propagates NaN), so the bounds below check
            # finiteness too; an explicit test is only needed when state_limit itself is infinite
            qa = q.abs()
            ok = (qa.amax(1) <= self.state_limit) & (qa[:, 0:3].amax(1) <= max_pos)
            ok &= q[:, 3:7].norm(dim=1) >= 1e-6
            ok &= qd.abs().amax(1) <= min(self.state_limit, max_speed)
            if not math.isfinite(self.state_limit):
                ok &= torch.isfinite(q).all(1)
            return ~ok
