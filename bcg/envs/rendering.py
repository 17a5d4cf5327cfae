"""Offscreen rendering of the G1 and a translucent reference ghost with MuJoCo (RENDERING_AND_PPO_COST.md).

On a machine without a display, MuJoCo needs ``MUJOCO_GL=egl`` (Mesa's software EGL: Debian packages ``libegl1
libegl-mesa0 libgl1-mesa-dri libopengl0``) or ``MUJOCO_GL=osmesa`` (``libosmesa6``), set **before** ``mujoco`` is
imported. :func:`prefer_headless_gl` sets ``egl`` when nothing is chosen and no display exists.
"""

from __future__ import annotations

import os
import sys

import numpy as np

__all__ = ["GhostRenderer", "RenderingUnavailableError", "prefer_headless_gl"]

GHOST_ALPHA = 0.35


class RenderingUnavailableError(RuntimeError):
    """No OpenGL backend could create an offscreen context."""


def prefer_headless_gl() -> None:
    """Choose ``MUJOCO_GL=egl`` if the user chose nothing, there is no display and mujoco is not imported yet."""
    if "MUJOCO_GL" in os.environ or "mujoco" in sys.modules:
        return
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"


class GhostRenderer:
    """Renders a robot state and a reference state (ghost) from the scene MJCF, camera following the pelvis."""

    def __init__(self, width: int = 640, height: int = 480, fast: bool = True):
        prefer_headless_gl()
        import mujoco

        from bcg.robots.g1 import SCENE_PATH

        self._mujoco = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(SCENE_PATH))
        self.model.vis.global_.offwidth = max(self.model.vis.global_.offwidth, width)
        self.model.vis.global_.offheight = max(self.model.vis.global_.offheight, height)
        if fast:
            self.model.vis.quality.offsamples = 0
            self.model.vis.quality.shadowsize = 1024
        self.data = mujoco.MjData(self.model)
        self.ghost = mujoco.MjData(self.model)
        try:
            self.renderer = mujoco.Renderer(self.model, height=height, width=width)
        except Exception as e:  # mujoco raises a variety of errors when no GL context can be made
            backend = os.environ.get("MUJOCO_GL", "<unset>")
            raise RenderingUnavailableError(
                f"MuJoCo could not create an offscreen OpenGL context (MUJOCO_GL={backend}): {e}. On a machine "
                "without a display set MUJOCO_GL=egl (packages libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0) or "
                "MUJOCO_GL=osmesa (libosmesa6) before importing mujoco or bcg.") from e
        self.camera = mujoco.MjvCamera()
        self.camera.type = mujoco.mjtCamera.mjCAMERA_FREE
        self.camera.distance, self.camera.azimuth, self.camera.elevation = 3.0, 135.0, -15.0
        self.option = mujoco.MjvOption()

    def render(self, qpos: np.ndarray, ref_qpos: np.ndarray | None = None) -> np.ndarray:
        """RGB image [H, W, 3] uint8 of ``qpos`` [36] with the ghost at ``ref_qpos`` [36]."""
        mj = self._mujoco
        self.data.qpos[:] = qpos
        mj.mj_forward(self.model, self.data)
        self.camera.lookat[:] = self.data.qpos[:3]
        self.renderer.update_scene(self.data, camera=self.camera, scene_option=self.option)
        if ref_qpos is not None:
            self.ghost.qpos[:] = ref_qpos
            mj.mj_kinematics(self.model, self.ghost)
            scn = self.renderer.scene
            start = scn.ngeom
            mj.mjv_addGeoms(self.model, self.ghost, self.option, mj.MjvPerturb(), mj.mjtCatBit.mjCAT_DYNAMIC, scn)
            for i in range(start, scn.ngeom):
                scn.geoms[i].rgba[3] = GHOST_ALPHA
        return self.renderer.render().copy()

    def close(self) -> None:
        r = getattr(self, "renderer", None)
        if r is not None:
            r.close()
            self.renderer = None
