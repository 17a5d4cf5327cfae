"""Pre-packed Warp CPU launches: a recorded launch turned into one ctypes call.

``wp.Launch.launch()`` on the CPU rebuilds the kernel's argument struct on every call (a ``setattr`` per argument,
about 15-25 us for the simulator's kernels). A control step replays 28 forward and 28 adjoint launches, and with
the batch split across threads this Python time is serialised by the GIL while the kernels themselves run in
parallel. :func:`prepack` builds the struct once: the returned callable is a direct call of the compiled kernel on
the same struct Warp would build (Warp's own ``_build_cpu_args_structs``), so results are the same bits.

Anything this cannot prove equivalent (a CUDA launch, a cooperative CPU launch with ``block_dim > 1``, a Warp
without the helper) falls back to ``cmd.launch``.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

__all__ = ["prepack"]


def prepack(cmd: Any) -> Callable[[], None]:
    """A zero-argument callable that runs the recorded launch ``cmd`` (from ``wp.launch(..., record_cmd=True)``).

    The arrays ``cmd`` was recorded with must stay alive and in place (the struct holds their pointers), which is the
    same requirement replaying ``cmd`` itself has.
    """
    try:
        from warp._src.context import _build_cpu_args_structs
    except ImportError:  # a Warp that moved the helper: keep its own replay
        return cmd.launch
    device = getattr(cmd, "device", None)
    if device is None or not device.is_cpu or getattr(cmd, "block_dim", 1) > 1:
        return cmd.launch
    args, adj_args = _build_cpu_args_structs(cmd.kernel, cmd.hooks, cmd.params, cmd.adjoint)
    bounds = ctypes.byref(cmd.params[0])
    if cmd.adjoint:
        if cmd.hooks.backward is None:
            return cmd.launch  # Warp raises its own error on launch
        # byref keeps a reference to the structs, so they live as long as the partial
        return functools.partial(cmd.hooks.backward, bounds, ctypes.byref(args), ctypes.byref(adj_args))
    if cmd.hooks.forward is None:
        return cmd.launch
    return functools.partial(cmd.hooks.forward, bounds, ctypes.byref(args))
