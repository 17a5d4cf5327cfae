"""Deployment: the observation function outside the envs, docs/deploy.md's tables against the package, and the
runnable ONNX-in-MuJoCo example (in-process against bcg's own MuJoCo replay, and as a script)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import load_script
from torch import nn

import bcg  # noqa: F401  (registers the env ids)
from bcg.agents.export import ExportedPolicy, policy_export
from bcg.agents.export_graph import export_graph
from bcg.envs import TrackingObservation
from bcg.robots import g1

ROOT = Path(__file__).resolve().parents[1]
DEPLOY_MD = ROOT / "docs" / "deploy.md"
EXAMPLE = ROOT / "examples" / "deploy_onnx_mujoco.py"


@pytest.fixture(scope="module")
def env():
    e = gym.make_vec("BCG-G1-Run-v0", num_envs=3, action_offset="reference").unwrapped
    e.reset(seed=1)
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        e.step(0.5 * torch.randn(3, 29, generator=g))
    return e


def test_tracking_observation_equals_env(env):
    s = env.state
    observe = TrackingObservation(env.motion, env.ref_steps)
    assert observe.layout == [tuple(x) for x in env.observation_layout] and observe.dim == env.obs_dim
    obs = observe(s.q.double().numpy(), s.qd.double().numpy(), s.frame)  # numpy float64, as an MjData holds them
    assert obs.dtype == torch.float32 and obs.shape == (3, 849)
    assert (obs - env.observe()).abs().max() <= 1e-5
    # at the clip's last frame the reference part repeats the last frame (clamped, as in the env)
    last = torch.full((3,), env.num_frames - 1)
    assert (observe(s.q, s.qd, last) - env.observe(dataclasses.replace(s, frame=last))).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="must share N"):
        observe(s.q, s.qd[:2], s.frame)


def _table(heading: str) -> list[list[str]]:
    """Rows (cells stripped) of the first Markdown table after ``heading`` in docs/deploy.md, header excluded."""
    text = DEPLOY_MD.read_text().split(heading, 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    start = text.splitlines().index(rows[0])
    block = []
    for line in text.splitlines()[start:]:
        if not line.startswith("|"):
            break
        block.append([c.strip() for c in line.strip("|").split("|")])
    return block[2:]


def test_deploy_doc_observation_table_is_the_layout(env):
    rows = _table("## The observation")
    got, offset = [], 0
    for entries, term, size, *_ in rows:
        lo, hi = (int(x) for x in entries.split("–"))
        got.append((term.strip("`"), int(size)))
        assert (lo, hi) == (offset, offset + int(size) - 1), term
        offset += int(size)
    assert got == [tuple(x) for x in env.observation_layout]
    assert offset == env.obs_dim == 849


def test_deploy_doc_joint_table_is_the_robot():
    rows = _table("## Joints, gains, limits, default pose")
    assert [r[0].strip("`") for r in rows] == list(g1.JOINT_NAMES)
    values = np.array([[float(x) for x in r[1:5]] for r in rows])
    np.testing.assert_array_equal(values[:, 0], g1.KP)
    np.testing.assert_array_equal(values[:, 1], g1.KD)
    np.testing.assert_array_equal(values[:, 2], g1.TORQUE_LIMITS)
    np.testing.assert_allclose(values[:, 3], g1.DEFAULT_JOINT_POS, atol=5e-3)  # the table rounds to 3 digits


@pytest.fixture(scope="module")
def onnx_policy(tmp_path_factory):
    """A small residual policy (so the robot follows the clip for a while) and its ONNX file."""
    e = gym.make_vec("BCG-G1-Jump-v0", num_envs=1, action_offset="reference").unwrapped
    e.reset(seed=0)
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(e.obs_dim, 64), nn.ELU(), nn.LayerNorm(64), nn.Linear(64, 29))
    with torch.no_grad():
        net[-1].weight.mul_(0.05)
        net[-1].bias.mul_(0.05)
    exp = policy_export(net, torch.zeros(e.obs_dim, dtype=torch.float64), torch.ones(e.obs_dim, dtype=torch.float64),
                        obs_eps=1e-5, obs_clip=5.0, env=e, agent="test")
    pol = ExportedPolicy(exp["meta"], exp["tensors"])
    return pol, export_graph(pol, tmp_path_factory.mktemp("deploy") / "policy.onnx")


def test_example_matches_bcg_mujoco_replay(onnx_policy):
    """The example's loop (onnxruntime, TrackingObservation, MuJoCo's actuators) is bcg evaluate's MuJoCo replay."""
    from bcg.evaluation.mujoco_transfer import TransferOptions, replay

    pol, path = onnx_policy
    example = load_script(EXAMPLE)
    out = example.run(path, seconds=0.5, start_frame=0)  # the replay's single phase starts at frame 0
    ro = replay(pol, "jump", TransferOptions(phases=1, seeds=(0,), seconds=0.5, joint_noise=0.0),
                simulator="mujoco", env_kwargs={"action_offset": "reference",
                                                "action_scale": pol.action_scale.double().numpy()})
    assert out["steps"] == int(ro.length[0]) == 25 and not out["fell"]
    assert np.abs(out["pelvis"] - ro.qpos[:, 0, :3]).max() <= 1e-6
    assert np.abs(out["pelvis"][-1] - out["pelvis"][0]).max() > 1e-2  # the robot moved: the comparison says something


def test_example_runs_as_a_script(onnx_policy):
    _, path = onnx_policy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(EXAMPLE), str(path), "--seconds", "0.2"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert re.search(r"ran 10 control steps \(0\.20 s\), still up; final pelvis height 0\.\d+ m", res.stdout)
