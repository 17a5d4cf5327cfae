"""ONNX and TorchScript policy graphs: the same outputs as the torch policy (random and real observations, both action
maps), the metadata a deployment stack reads, `bcg export --format`, and `bcg evaluate` on a graph giving the torch
file's metrics."""

from __future__ import annotations

import json
import warnings
import zipfile

import gymnasium as gym
import numpy as np
import onnx
import pytest
import torch
from torch import nn

import bcg  # noqa: F401  (registers the env ids)
from bcg.agents.export import ExportedPolicy, PolicyFileError, file_sha256, load_policy, policy_export, save_policy
from bcg.agents.export_graph import METADATA_FILE, export_graph
from bcg.agents.graph_policy import is_graph_file, load_graph_policy
from bcg.robots import g1

TOL = 1e-5


def _policy(env, seed: int = 0, out_scale: float = 1.0) -> tuple[ExportedPolicy, dict]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(env.obs_dim, 64), nn.ELU(), nn.LayerNorm(64), nn.Linear(64, 32), nn.Tanh(),
                        nn.Linear(32, 29))
    with torch.no_grad():
        net[2].weight.uniform_(0.5, 1.5)  # non-trivial LayerNorm parameters
        net[2].bias.uniform_(-0.5, 0.5)
        net[-1].weight.mul_(out_scale)
        net[-1].bias.mul_(out_scale)
    g = torch.Generator().manual_seed(seed + 1)
    mean = torch.randn(env.obs_dim, generator=g, dtype=torch.float64)
    var = torch.rand(env.obs_dim, generator=g, dtype=torch.float64) + 0.1
    exp = policy_export(net, mean, var, obs_eps=1e-5, obs_clip=5.0, env=env, agent="test")
    return ExportedPolicy(exp["meta"], exp["tensors"]), exp


@pytest.fixture(scope="module", params=["default", "reference"])
def setup(request, tmp_path_factory):
    """(env after a few random steps, torch policy, {format: loaded graph}) for one action map."""
    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=4, action_offset=request.param).unwrapped
    env.reset(seed=0)
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        env.step(0.3 * torch.randn(4, 29, generator=g))
    pol, _ = _policy(env)
    d = tmp_path_factory.mktemp(f"graph-{request.param}")
    graphs = {fmt: load_graph_policy(export_graph(pol, d / name, fmt))
              for fmt, name in (("onnx", "policy.onnx"), ("torchscript", "policy_jit.pt"))}
    return env, pol, graphs


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_graph_outputs_equal_torch_policy(setup, fmt):
    env, pol, graphs = setup
    graph = graphs[fmt]
    g = torch.Generator().manual_seed(5)
    obs_random = 3.0 * torch.randn(16, env.obs_dim, generator=g)
    obs_real = env.observe()
    ref = env.motion.qpos[(env.state.frame + 1).clamp(max=env.num_frames - 1), 7:]
    for obs, ref_pos in ((obs_random, 0.3 * torch.randn(16, 29, generator=g)), (obs_real, ref)):
        ref_in = ref_pos if pol.action_offset == "reference" else None
        targets, actions = graph(obs, ref_in)
        with torch.no_grad():
            a = pol(obs)
        assert (actions - a).abs().max() <= TOL
        assert (targets - pol.action_to_target(a, ref_in)).abs().max() <= TOL
    # on the env's own state the targets are the env's action map of the same actions
    _, actions = graph(obs_real, ref if pol.action_offset == "reference" else None)
    targets, _ = graph(obs_real, ref if pol.action_offset == "reference" else None)
    assert (targets - env.action_to_target(actions)).abs().max() <= TOL
    # a graph that ignored its reference input would not move with it
    if pol.action_offset == "reference":
        shifted, _ = graph(obs_real, ref + 0.1)
        assert torch.allclose(shifted - targets, torch.full_like(targets, 0.1), atol=TOL)


def _csv(value: str) -> list[float]:
    return [float(x) for x in value.split(",")]


def test_onnx_metadata(setup):
    env, pol, graphs = setup
    model = onnx.load(str(graphs["onnx"].path))
    props = {p.key: p.value for p in model.metadata_props}
    assert props["joint_names"].split(",") == list(g1.JOINT_NAMES)
    np.testing.assert_array_equal(_csv(props["joint_stiffness"]), g1.KP)
    np.testing.assert_array_equal(_csv(props["joint_damping"]), g1.KD)
    np.testing.assert_array_equal(np.float32(_csv(props["default_joint_pos"])), pol.default_joint_pos.numpy())
    np.testing.assert_array_equal(np.float32(_csv(props["action_scale"])), pol.action_scale.numpy())
    assert float(props["control_rate_hz"]) == pytest.approx(50.0)
    assert int(props["substeps"]) * float(props["sim_dt"]) == pytest.approx(float(props["control_dt"]))
    assert (int(props["substeps"]), float(props["sim_dt"])) == (4, 0.005)  # the simulator's defaults, written out
    assert props["mjcf_sha256"] == file_sha256(g1.MJCF_PATH)
    assert props["action_offset"] == pol.action_offset
    layout = list(zip(props["observation_names"].split(","), map(int, props["observation_sizes"].split(",")),
                      strict=True))
    assert layout == [tuple(x) for x in env.observation_layout] and sum(s for _, s in layout) == 849
    meta = json.loads(props["bcg"])
    assert meta["joint_names"] == list(g1.JOINT_NAMES) and meta["motion"]["name"] == "jump"
    names = [i.name for i in model.graph.input]
    assert names == (["obs", "reference_joint_pos"] if pol.action_offset == "reference" else ["obs"])
    assert [o.name for o in model.graph.output] == ["joint_pos_targets", "actions"]


def test_torchscript_metadata(setup):
    _, pol, graphs = setup
    extra = {METADATA_FILE: ""}
    with warnings.catch_warnings():  # torch.jit is deprecated, and still what deployment stacks load
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.load(str(graphs["torchscript"].path), _extra_files=extra)
    meta = json.loads(extra[METADATA_FILE])
    assert meta == graphs["onnx"].meta  # one metadata dict for both formats
    assert meta["joint_stiffness"] == [float(x) for x in g1.KP] and meta["control_dt"] == pytest.approx(0.02)


def test_detection_and_refusals(setup, tmp_path):
    env, _, graphs = setup
    assert is_graph_file(graphs["onnx"].path) and is_graph_file(graphs["torchscript"].path)
    _, exp = _policy(env)
    pt = save_policy(tmp_path / "policy.pt", exp)
    assert zipfile.is_zipfile(pt) and not is_graph_file(pt)  # a torch policy file is a zip too, but not a graph
    bare = tmp_path / "bare.onnx"
    model = onnx.load(str(graphs["onnx"].path))
    del model.metadata_props[:]  # a plain ONNX model of the same network
    onnx.save(model, str(bare))
    with pytest.raises(PolicyFileError, match="without bcg policy metadata"):
        load_graph_policy(bare)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(PolicyFileError, match="not a loadable ONNX model"):
        load_graph_policy(junk)
    with pytest.raises(ValueError, match="format must be one of"):
        export_graph(load_policy(pt), tmp_path / "x.bin", "tflite")  # type: ignore[arg-type]


def test_cli_export_and_evaluate_same_metrics(tmp_path):
    """`bcg export POLICY --format onnx|torchscript`, then `bcg evaluate` on each file: the metrics of the torch file
    (same episodes; the actions agree to float32 rounding, so the rollouts do too)."""
    from bcg.cli import main

    env = gym.make_vec("BCG-G1-Jump-v0", num_envs=1, action_offset="reference").unwrapped
    env.reset(seed=0)
    _, exp = _policy(env, seed=2, out_scale=0.05)  # small residuals: the robot follows the clip for a while
    pt = save_policy(tmp_path / "policy.pt", exp)
    assert main(["export", str(pt), "--format", "onnx"]) == 0
    assert main(["export", str(pt), "--format", "torchscript"]) == 0
    assert main(["export", str(pt)]) == 2  # already a torch file
    metrics = {}
    for name in ("policy.pt", "policy.onnx", "policy_jit.pt"):
        out = tmp_path / f"eval-{name}"
        assert main(["evaluate", str(tmp_path / name), "--phases", "2", "--seeds", "0", "--seconds", "0.6",
                     "--no-progress", "--out-dir", str(out)]) == 0
        metrics[name] = json.loads((out / "metrics.json").read_text())
    ref = metrics["policy.pt"]
    for name in ("policy.onnx", "policy_jit.pt"):
        got = metrics[name]
        for sim in ("mujoco", "bcg"):
            for key, value in ref[sim].items():
                if isinstance(value, float):
                    assert got[sim][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, sim, key)
                else:
                    assert got[sim][key] == value, (name, sim, key)
        assert [e["length"] for e in got["episodes"]["mujoco"]] == [e["length"] for e in ref["episodes"]["mujoco"]]


def test_onnx_export_is_deterministic(setup, tmp_path):
    _, pol, graphs = setup
    again = export_graph(pol, tmp_path / "again.onnx")
    assert again.read_bytes() == graphs["onnx"].path.read_bytes()


def test_policy_without_observation_clip(setup, tmp_path):
    """A normaliser without a clip exports too (no clamp in the graph): large observations pass unclipped."""
    env, _, _ = setup
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(env.obs_dim, 16), nn.ELU(), nn.Linear(16, 29))
    zeros, ones = torch.zeros(env.obs_dim, dtype=torch.float64), torch.ones(env.obs_dim, dtype=torch.float64)
    exp = policy_export(net, zeros, ones, obs_eps=0.0, obs_clip=None, env=env, agent="test")
    pol = ExportedPolicy(exp["meta"], exp["tensors"])
    obs = 50.0 * torch.randn(8, env.obs_dim)
    ref = torch.zeros(8, 29) if pol.action_offset == "reference" else None
    for fmt, name in (("onnx", "p.onnx"), ("torchscript", "p_jit.pt")):
        _, actions = load_graph_policy(export_graph(pol, tmp_path / name, fmt))(obs, ref)
        with torch.no_grad():
            assert (actions - pol(obs)).abs().max() <= TOL * max(1.0, float(pol(obs).abs().max()))
