"""Offscreen rendering of the G1 and a translucent reference ghost with MuJoCo.

On a machine without a display, MuJoCo needs ``MUJOCO_GL=egl`` (Mesa's software EGL: Debian packages ``libegl1
libegl-mesa0 libgl1-mesa-dri libopengl0``) or ``MUJOCO_GL=osmesa`` (``libosmesa6``), set **before** ``mujoco`` is
imported; ``import bcg`` does that (:func:`bcg.envs.gl.prefer_headless_gl`) unless the user chose a back end.

When no OpenGL context can be made, :class:`GhostRenderer` raises :class:`RenderingUnavailableError`, and every
later attempt in the same process raises it again *without* calling MuJoCo: a second context creation after a
failed one aborts the whole process inside MuJoCo's GL loader (``__cxa_guard_acquire detected recursive
initialization``), and the GL state that causes it is process-wide.
"""

from __future__ import annotations

import os

import numpy as np

from bcg.envs.gl import prefer_headless_gl

__all__ = ["GhostRenderer", "RenderingUnavailableError", "prefer_headless_gl"]

GHOST_ALPHA = 0.35


class RenderingUnavailableError(RuntimeError):
    """No OpenGL backend could create an offscreen context."""


class GhostRenderer:
    """Renders a robot state and a reference state (ghost) from the scene MJCF, camera following the pelvis."""

    _gl_failure: str | None = None
    """Why the first offscreen context of this process failed (process-wide, see the module docstring)."""

    def __init__(self, width: int = 640, height: int = 480, fast: bool = True):
        if GhostRenderer._gl_failure is not None:
            raise RenderingUnavailableError(GhostRenderer._gl_failure)
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
            GhostRenderer._gl_failure = (
                f"MuJoCo could not create an offscreen OpenGL context (MUJOCO_GL={backend}): {e}. On a machine "
                "without a display set MUJOCO_GL=egl (packages libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0) or "
                "MUJOCO_GL=osmesa (libosmesa6) before importing mujoco (import bcg first, or set it yourself); "
                "restart the process after fixing it")
            raise RenderingUnavailableError(GhostRenderer._gl_failure) from e
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
