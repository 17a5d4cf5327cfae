"""Shared fixtures: the packaged G1 in the simulator and in MuJoCo, and the location of ../shared."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def load_script(path: Path) -> ModuleType:
    """A script outside the package (benchmarks/, examples/) imported as a module, named after its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def g1_model():
    """The packaged G1 as a simulator model on the CPU, default contact parameters (kappa 300)."""
    from bcg.sim import load_model

    return load_model()


@pytest.fixture(scope="session")
def g1_mj():
    """The packaged G1 (no floor) as a compiled MuJoCo model."""
    import mujoco

    from bcg.robots.g1 import MJCF_PATH

    return mujoco.MjModel.from_xml_path(str(MJCF_PATH))


def random_state(nq: int, nv: int, rng: np.random.Generator, height: float = 1.0,
                 joint_scale: float = 1.0, vel_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A random qpos (unit quaternion, joints in [-joint_scale, joint_scale]) and qvel ~ N(0, vel_scale)."""
    q = np.zeros(nq)
    q[:3] = rng.normal(size=3) * 0.3 + np.array([0.0, 0.0, height])
    quat = rng.normal(size=4)
    q[3:7] = quat / np.linalg.norm(quat)
    q[7:] = rng.uniform(-joint_scale, joint_scale, nq - 7)
    return q, rng.normal(size=nv) * vel_scale
