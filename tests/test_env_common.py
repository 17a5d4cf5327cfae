"""Helpers shared by the environment tests (imported as `test_env_common`): a small synthetic reference clip, so
that the tests do not depend on packaged data."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def synthetic_qpos(seconds: float = 1.0, dt: float = 0.02) -> np.ndarray:
    """Standing G1 swaying its arms and bending its knees a little, [T, 36] float64 at ``dt``."""
    from bcg.robots.g1 import JOINT_NAMES, default_qpos

    t = np.arange(round(seconds / dt) + 1) * dt
    q = np.repeat(default_qpos()[None], len(t), 0)
    j = {n: 7 + i for i, n in enumerate(JOINT_NAMES)}
    q[:, j["left_shoulder_pitch_joint"]] += 0.4 * np.sin(2 * np.pi * t)
    q[:, j["right_shoulder_pitch_joint"]] -= 0.4 * np.sin(2 * np.pi * t)
    q[:, j["left_elbow_joint"]] -= 0.3 * np.sin(2 * np.pi * t)
    q[:, j["waist_yaw_joint"]] += 0.2 * np.sin(np.pi * t)
    q[:, 0] += 0.1 * t  # slow drift forward
    return q


def write_synthetic_motion(path: Path, seconds: float = 1.0) -> Path:
    """Save the synthetic clip as a bcg motion ``.npz`` at 50 Hz and return its path."""
    from bcg.motion import Motion

    m = Motion.from_qpos(synthetic_qpos(seconds), 0.02, name="synthetic")
    return m.save(path)


def test_synthetic_motion_roundtrip(tmp_path: Path) -> None:
    from bcg.motion import load_motion

    path = write_synthetic_motion(tmp_path / "syn.npz", seconds=0.5)
    m = load_motion(path)
    assert m.num_frames == 26 and abs(m.dt - 0.02) < 1e-12
    np.testing.assert_allclose(m.qpos.numpy(), synthetic_qpos(0.5), atol=1e-6)
