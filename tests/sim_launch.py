"""Kernel-level test helpers: a control step launched directly on a :class:`~bcg.sim.engine.StepArrays` (own
gradient arrays, so that ``wp.Tape`` can record it), and the regression kernel of the loop-carried-variable trap.

The package runs its steps through :mod:`bcg.sim.bridge` (recorded once, replayed, pooled gradients); these are
the plain launches the kernel tests differentiate.
"""

from __future__ import annotations

import warp as wp

from bcg.sim.engine import StepArrays, substep_launches
from bcg.sim.model import SimModel


def run_control_step(model: SimModel, arrs: StepArrays) -> None:
    """Launch the S substeps of one control step on ``arrs`` (inputs already in q[0], qd[0], targets)."""
    for k in range(model.params.substeps):
        for launch in substep_launches(model, arrs, k):
            wp.launch(launch.kernel, dim=arrs.n, inputs=launch.inputs, outputs=launch.outputs, device=model.device)


# The loop-carried-variable trap (docs/simulator.md, "Warp autodiff rules"): y = (sum x)^2 with the store-and-reload
# pattern the engine's kernels use throughout.
@wp.kernel
def sum_squares_reloaded(x: wp.array(dtype=float), n: int, tmp: wp.array(dtype=float), y: wp.array(dtype=float)):
    """Store the carried value, re-load it, then use it non-linearly: the adjoint is then 2 sum(x)."""
    s = float(0.0)
    for k in range(n):
        s = s + x[k]
    tmp[0] = s
    v = tmp[0]
    y[0] = v * v
