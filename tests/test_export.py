"""The self-contained policy file: round trip of a random MLP, the env's action map, layout, MJCF hash, and refusals."""

from __future__ import annotations

import pickle
import subprocess
import sys

import gymnasium as gym
import pytest
import torch
from torch import nn

import bcg  # noqa: F401  (registers the env ids)
from bcg.agents.export import PolicyFileError, file_sha256, load_policy, policy_export, save_policy
from bcg.robots.g1 import MJCF_PATH


@pytest.fixture(scope="module")
def env():
    e = gym.make_vec("BCG-G1-Jump-v0", num_envs=3).unwrapped
    e.reset(seed=0)
    return e


def _mlp(d: int, a: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 64), nn.ELU(alpha=0.7), nn.LayerNorm(64), nn.Linear(64, 32), nn.ReLU(),
                        nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, a))
    with torch.no_grad():  # non-trivial LayerNorm parameters, so that a swapped weight/bias would show
        net[2].weight.uniform_(0.5, 1.5)
        net[2].bias.uniform_(-0.5, 0.5)
    return net


def _export(env, net, obs_clip=5.0):
    g = torch.Generator().manual_seed(1)
    mean = torch.randn(env.obs_dim, generator=g, dtype=torch.float64)
    var = torch.rand(env.obs_dim, generator=g, dtype=torch.float64) + 0.1
    return policy_export(net, mean, var, obs_eps=1e-5, obs_clip=obs_clip, env=env, agent="test"), mean, var


def test_round_trip_same_outputs(env, tmp_path):
    net = _mlp(env.obs_dim, 29)
    exp, mean, var = _export(env, net)
    path = save_policy(tmp_path / "policy.pt", exp)
    pol = load_policy(path)
    obs = 3.0 * torch.randn(7, env.obs_dim)
    # the formula of the agents' FrozenNormalizer (bcg.agents.normalization): float64 statistics, cast to float32
    expected = net(((obs - mean.float()) * torch.rsqrt(var + 1e-5).float()).clamp(-5.0, 5.0))
    got = pol(obs)
    assert torch.equal(got, expected.detach())  # same float32 operations in the same order: bit for bit
    assert pol(obs[None]).shape == (1, 7, 29)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the atomic write left no temporary


def test_no_clip_and_env_observation(env, tmp_path):
    net = _mlp(env.obs_dim, 29, seed=3)
    exp, mean, var = _export(env, net, obs_clip=None)
    pol = load_policy(save_policy(tmp_path / "p.pt", exp))
    obs = env.observe()
    ref = net((obs - mean.float()) / torch.sqrt(var + 1e-5).float()).detach()
    assert torch.allclose(pol(obs), ref, rtol=1e-5, atol=1e-6)


def test_action_map_layout_hash(env, tmp_path):
    exp, _, _ = _export(env, _mlp(env.obs_dim, 29))
    pol = load_policy(save_policy(tmp_path / "p.pt", exp))
    a = 2.0 * torch.randn(3, 29)
    assert torch.equal(pol.action_to_target(a), env.action_to_target(a))  # no randomisation: zero offsets
    assert pol.observation_layout == [(n, s) for n, s in env.observation_layout]
    assert sum(s for _, s in pol.observation_layout) == 849
    assert pol.mjcf_sha256 == file_sha256(MJCF_PATH)
    pol.check_mjcf(MJCF_PATH)
    with pytest.raises(PolicyFileError, match="differs from the policy's MJCF"):
        pol.check_mjcf(MJCF_PATH.parent / "scene.xml")
    assert pol.motion["name"] == env.motion.name == "jump"
    assert pol.agent == "test" and pol.bcg_version == bcg.__version__


def test_loads_without_training_code(env, tmp_path):
    """A fresh interpreter loads the file without importing the agents, the env, the simulator, Warp or MuJoCo
    (``import bcg`` itself only registers the env ids)."""
    path = save_policy(tmp_path / "p.pt", _export(env, _mlp(env.obs_dim, 29))[0])
    code = ("import sys, torch; from bcg.agents.export import load_policy; p = load_policy(sys.argv[1]); "
            "print(p(torch.zeros(2, 849)).shape); "
            "bad = [m for m in sys.modules if m.startswith(('bcg.agents.shac', 'bcg.agents.ppo', 'bcg.agents.train',"
            " 'bcg.envs.vector_env', 'bcg.sim', 'mujoco', 'stable_baselines3', 'warp'))]; print(bad); assert not bad")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "torch.Size([2, 29])" in out.stdout


def test_file_is_weights_only(env, tmp_path):
    path = save_policy(tmp_path / "p.pt", _export(env, _mlp(env.obs_dim, 29))[0])
    obj = torch.load(path, weights_only=True)
    assert obj["format"] == "bcg-policy" and isinstance(obj["meta_json"], str)


def test_unsupported_layer_refused(env):
    net = nn.Sequential(nn.Linear(env.obs_dim, 8), nn.Dropout(0.1), nn.Linear(8, 29))
    with pytest.raises(TypeError, match="layer 1 is a Dropout"):
        policy_export(net, torch.zeros(env.obs_dim), torch.ones(env.obs_dim), obs_eps=1e-5, obs_clip=None, env=env,
                      agent="x")
    with pytest.raises(ValueError, match="must map"):
        policy_export(nn.Sequential(nn.Linear(env.obs_dim, 28)), torch.zeros(env.obs_dim), torch.ones(env.obs_dim),
                      obs_eps=1e-5, obs_clip=None, env=env, agent="x")
    with pytest.raises(ValueError, match="shape"):
        policy_export(_mlp(env.obs_dim, 29), torch.zeros(5), torch.ones(env.obs_dim), obs_eps=1e-5, obs_clip=None,
                      env=env, agent="x")


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_bad_files_refused(env, tmp_path):
    good = save_policy(tmp_path / "p.pt", _export(env, _mlp(env.obs_dim, 29))[0])
    data = good.read_bytes()
    trunc = tmp_path / "trunc.pt"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(PolicyFileError, match="truncated or corrupt"):
        load_policy(trunc)
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"format": "bcg-policy", "x": _Evil()}, protocol=2))
    with pytest.raises(PolicyFileError, match="pickled Python object") as err:
        load_policy(evil)
    assert "global 'print'" in str(err.value)  # the message names the object it refused to build
    other = tmp_path / "other.pt"
    torch.save({"format": "bcg-checkpoint"}, other)
    with pytest.raises(PolicyFileError, match="bcg export"):
        load_policy(other)
    with pytest.raises(PolicyFileError, match="does not exist"):
        load_policy(tmp_path / "missing.pt")


def test_the_reference_joint_margin_travels_with_the_policy_to_its_replay(tmp_path):
    from bcg.envs import G1TrackingVectorEnv
    from bcg.evaluation.evaluate_cli import policy_env_kwargs
    from bcg.evaluation.mujoco_transfer import make_env

    e = G1TrackingVectorEnv(2, "run", reference_joint_margin=0.05, action_offset="reference")
    plain = G1TrackingVectorEnv(2, "run", action_offset="reference")
    assert not torch.equal(e.motion.qpos, plain.motion.qpos)  # run's clip comes nearer than 0.05 rad to a stop
    exp, _, _ = _export(e, _mlp(e.obs_dim, 29))
    pol = load_policy(save_policy(tmp_path / "p.pt", exp))
    assert pol.meta["env"]["reference_joint_margin"] == 0.05
    kwargs = policy_env_kwargs(pol)
    assert kwargs["reference_joint_margin"] == 0.05
    for simulator in ("bcg", "mujoco"):  # the residual actions land on the reference the policy was trained on
        assert torch.equal(make_env("run", 2, simulator=simulator, **kwargs).motion.qpos, e.motion.qpos)
    with pytest.raises(ValueError, match=r"reference_joint_margin must be a number in \[0, 0.2\]"):
        G1TrackingVectorEnv(1, "run", reference_joint_margin=0.3)
