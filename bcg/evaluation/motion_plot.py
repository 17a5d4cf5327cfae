"""A picture of a reference motion: its foot-contact schedule, pelvis height and horizontal speed over time, and a
strip of frames rendered by MuJoCo offscreen where a GL backend works (``bcg motions plot`` / ``validate-all``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_motion"]


def _render_strip(motion: Any, times: Sequence[float], size: tuple[int, int] = (150, 190)) -> Any:
    """RGB images of the motion at ``times`` rendered by MuJoCo offscreen (tracking camera), or None without GL."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        import mujoco

        from bcg.robots.g1 import SCENE_PATH

        model = mujoco.MjModel.from_xml_path(str(SCENE_PATH))
        data = mujoco.MjData(model)
        renderer = mujoco.Renderer(model, size[1], size[0])
    except Exception as exc:  # noqa: BLE001 - any GL failure means: no strip
        print(f"(no frame strip: MuJoCo offscreen rendering unavailable: {type(exc).__name__}: {exc})")
        return None
    import numpy as np
    import torch

    cam = mujoco.MjvCamera()
    cam.type = mujoco.mjtCamera.mjCAMERA_FREE
    cam.distance, cam.elevation, cam.azimuth = 2.0, -10.0, 120.0
    qpos = motion.qpos_at(torch.tensor(list(times))).double().numpy()
    imgs = []
    try:
        for q in qpos:
            data.qpos[:] = q
            mujoco.mj_forward(model, data)
            cam.lookat[:] = [q[0], q[1], 0.55]
            renderer.update_scene(data, cam)
            imgs.append(renderer.render().copy())
    finally:
        renderer.close()
    return np.concatenate(imgs, axis=1)


def plot_motion(motion: Any, path: Path, render: bool = True) -> Path:
    """Write a PNG: foot-contact schedule, pelvis height and horizontal speed over time, and (where GL works) a strip of
    six rendered frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    t = np.arange(motion.num_frames) * motion.dt
    feet = motion.foot_contact()
    strip = _render_strip(motion, np.linspace(0.0, motion.duration, 6)[:, None].ravel()) if render else None
    rows = 3 if strip is not None else 2
    fig, axes = plt.subplots(rows, 1, figsize=(7.5, 1.6 * rows + (1.0 if strip is not None else 0.4)),
                             gridspec_kw={"height_ratios": [1.0, 1.4] + ([2.2] if strip is not None else [])})
    ax = axes[0]
    for f in range(2):
        ax.fill_between(t, f + 0.1, f + 0.9, where=feet[:, f], step="mid", color=("C0", "C1")[f], lw=0)
    flight = ~feet.any(1)
    ax.fill_between(t, -0.9, -0.1, where=flight, step="mid", color="C3", lw=0)
    ax.set_yticks([-0.5, 0.5, 1.5], ["flight", "left", "right"])
    ax.set_xlim(t[0], t[-1])
    ax.set_title(f"{motion.name}: contact schedule, pelvis height and speed", fontsize=9)
    ax.tick_params(labelsize=7)
    ax = axes[1]
    q = motion.qpos.detach().cpu().numpy()
    ax.plot(t, q[:, 2], color="k", lw=0.8, label="pelvis z [m]")
    ax.set_ylabel("z [m]", fontsize=7)
    ax.set_xlabel("time [s]", fontsize=7)
    ax.set_xlim(t[0], t[-1])
    ax.tick_params(labelsize=7)
    ax2 = ax.twinx()
    v = np.linalg.norm(motion.qvel[:, :2].detach().cpu().numpy(), axis=-1)
    ax2.plot(t, v, color="C2", lw=0.6)
    ax2.set_ylabel("|v_xy| [m/s]", fontsize=7, color="C2")
    ax2.tick_params(labelsize=7)
    if strip is not None:
        axes[2].imshow(strip)
        axes[2].set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
