"""The numpy view for Gymnasium's vector wrappers, and headless rendering that never takes the process down."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from test_env_common import write_synthetic_motion

from bcg.envs.numpy_env import NumpyVectorEnv, make_numpy_vec


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=0.3)


def test_record_episode_statistics_and_normalize_observation(motion_path: Path) -> None:
    from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics

    venv = make_numpy_vec("BCG-G1-Run-v0", num_envs=3, motion_file=str(motion_path), max_episode_steps=5)
    env = RecordEpisodeStatistics(NormalizeObservation(venv))
    obs, _ = env.reset(seed=0)
    assert isinstance(obs, np.ndarray) and obs.shape == (3, 849)
    rng = np.random.default_rng(0)
    finished, pending, total = [], np.zeros(3, bool), np.zeros(3)
    for _ in range(13):
        obs, rew, term, trunc, info = env.step(rng.uniform(-1, 1, (3, 29)).astype(np.float32))
        assert isinstance(rew, np.ndarray) and np.isfinite(obs).all()
        assert (rew[pending] == 0).all() and not (term | trunc)[pending].any()  # NEXT_STEP: the reset step
        total = np.where(pending, 0.0, total + rew)
        if "episode" in info:
            for i in np.flatnonzero(info["_episode"]):
                finished.append((info["episode"]["l"][i], info["episode"]["r"][i], total[i]))
        pending = term | trunc
    assert len(finished) >= 6  # episodes of at most 5 steps (or to the clip's end), 3 environments, 13 steps
    for length, ret, ours in finished:
        assert 1 <= length <= 5 and ret == pytest.approx(ours, rel=1e-5) and 0 <= ret <= length
    assert abs(float(obs.mean())) < 3.0  # normalised


def test_numpy_view_refuses_an_autoresetting_env(motion_path: Path) -> None:
    from bcg.envs.vector_env import G1TrackingVectorEnv

    with pytest.raises(ValueError, match="autoreset=False"):
        NumpyVectorEnv(G1TrackingVectorEnv(2, str(motion_path)))


def _run(code: str, cwd: Path, **env_vars: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter without MUJOCO_GL or a display (in ``cwd``: MuJoCo may write a log)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def test_headless_rendering_without_mujoco_gl(tmp_path: Path) -> None:
    """No MUJOCO_GL set, no display: check_env with rendering, two rgb_array envs rendering twice, make_vec."""
    r = _run("""
        import sys
        import gymnasium as gym, bcg
        from gymnasium.utils.env_checker import check_env
        from bcg.envs.rendering import GhostRenderer, RenderingUnavailableError
        try:
            GhostRenderer(64, 48).close()
        except RenderingUnavailableError as e:
            print("UNAVAILABLE", e)
            sys.exit(0)
        check_env(gym.make("BCG-G1-Run-v0", render_mode="rgb_array").unwrapped)
        a = gym.make("BCG-G1-Run-v0", render_mode="rgb_array"); a.reset(seed=0)
        b = gym.make("BCG-G1-Jump-v0", render_mode="rgb_array"); b.reset(seed=0)
        frames = [a.render(), b.render(), a.render(), b.render()]
        v = gym.make_vec("BCG-G1-Run-v0", num_envs=2, render_mode="rgb_array"); v.reset(seed=0)
        frames.append(v.render())
        assert min(float(f.std()) for f in frames) > 1  # not blank
        print("OK", [f.shape for f in frames], min(float(f.std()) for f in frames))
    """, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    if r.stdout.startswith("UNAVAILABLE"):
        pytest.skip(f"no headless OpenGL on this machine: {r.stdout[:300]}")
    assert "OK [(480, 640, 3)" in r.stdout


def test_failed_gl_context_raises_every_time_instead_of_aborting(tmp_path: Path) -> None:
    """mujoco imported before bcg with no usable back end: each render raises RenderingUnavailableError; a second
    context attempt used to abort the process (__cxa_guard_acquire)."""
    r = _run("""
        import mujoco  # before bcg: bcg cannot choose the back end any more
        import gymnasium as gym, bcg
        from bcg.envs.rendering import RenderingUnavailableError
        n = 0
        for env_id in ("BCG-G1-Run-v0", "BCG-G1-Jump-v0", "BCG-G1-Run-v0"):
            env = gym.make(env_id, render_mode="rgb_array"); env.reset(seed=0)
            try:
                env.render()
            except RenderingUnavailableError as e:
                n += 1
                assert "MUJOCO_GL=egl" in str(e)
        print("survived", n)
    """, tmp_path, MUJOCO_GL="glfw")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "survived 3" in r.stdout
