"""Choice of MuJoCo's OpenGL back end for offscreen rendering, made before ``mujoco`` is first imported.

MuJoCo reads ``MUJOCO_GL`` once, when it is imported. ``import bcg`` calls :func:`prefer_headless_gl` before any
part of bcg imports mujoco, so that on a machine without a display the software EGL back end is used (Debian packages
``libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0``). A choice the user made (``MUJOCO_GL`` set) is never changed.
Standard library only: importing this module is free.
"""

from __future__ import annotations

import os
import sys

__all__ = ["prefer_headless_gl"]


def prefer_headless_gl() -> str | None:
    """Set ``MUJOCO_GL=egl`` if the user chose nothing, there is no display and mujoco is not imported yet.

    Returns the back end in effect (``None``: MuJoCo's own default, e.g. GLFW with a display).
    """
    if "MUJOCO_GL" in os.environ or "mujoco" in sys.modules:
        return os.environ.get("MUJOCO_GL")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"
    return os.environ.get("MUJOCO_GL")
