"""Device names accepted by the simulator."""

from __future__ import annotations

import re

from bcg.errors import UserError

__all__ = ["check_device"]

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_device(device: str) -> str:
    """Validate a device name (``"cpu"``, ``"cuda"``, ``"cuda:K"``) and check that it exists; returns it unchanged.

    Raises:
        UserError (a ValueError): for a malformed name or a CUDA device that this machine does not have.
    """
    name = str(device)
    if not _DEVICE.match(name):
        raise UserError(f"unknown device {device!r}; expected 'cpu', 'cuda' or 'cuda:K'")
    if name.startswith("cuda"):
        import warp as wp

        wp.init()
        if not wp.is_cuda_available():
            raise UserError(f"device {device!r} requested but Warp finds no CUDA device on this machine")
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= wp.get_cuda_device_count():
            raise UserError(f"device {device!r} requested but only {wp.get_cuda_device_count()} CUDA device(s) exist")
    return name
