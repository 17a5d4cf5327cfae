"""Deployment graphs of an exported policy: ONNX and TorchScript files that a G1 deployment stack runs without `bcg`.

:func:`export_graph` turns a loaded :class:`~bcg.agents.export.ExportedPolicy` into one graph that holds the whole
observation-to-target path, :class:`PolicyGraph`:

* inputs: ``obs`` [B, D] float32 (the environments' raw observation, D = 849 for the G1) and, for a policy whose
  actions are residuals on the reference (``action_offset == "reference"``), ``reference_joint_pos`` [B, 29] [rad]
  (the clip's joint positions at the frame the control step lands on);
* outputs: ``joint_pos_targets`` [B, 29] [rad], the PD targets, and ``actions`` [B, 29], the raw action before the
  tanh (what the training environments take).

Inside: the observation normaliser (its float64 statistics folded into float32 constants, the numbers
:class:`~bcg.agents.export.ExportedPolicy` uses), the clip, the mean network, then the action map
``base + action_scale * tanh(a)`` with base the default pose or the reference input.

Metadata (:func:`graph_metadata`) goes into ONNX ``metadata_props`` and into the TorchScript archive's extra file
:data:`METADATA_FILE`. ONNX gets one entry per key: lists of numbers or names as comma-separated text (the convention
of mjlab and BeyondMimic exporters, full float precision), everything else as JSON, plus the whole dict as JSON under
``bcg``. ONNX files are written with torch's TorchScript-based exporter (``dynamo=False``) at opset
:data:`ONNX_OPSET`: it needs neither onnxscript nor a network, and gives the same bytes for the same policy.
"""

from __future__ import annotations

import copy
import io
import json
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from bcg.agents.export import ExportedPolicy

__all__ = ["GRAPH_FORMAT", "GRAPH_FORMATS", "METADATA_FILE", "ONNX_OPSET", "PolicyGraph", "export_graph",
           "graph_metadata"]

GRAPH_FORMAT = "bcg-policy-graph"
"""Format tag stored in every graph's metadata (key ``format``)."""
GRAPH_FORMAT_VERSION = 1
"""Version of the metadata layout this module writes."""
GRAPH_FORMATS = ("onnx", "torchscript")
"""The graph formats :func:`export_graph` writes."""
ONNX_OPSET = 17
"""ONNX opset of the exported graphs (the first with LayerNormalization; tested with onnxruntime 1.32)."""
METADATA_FILE = "bcg_policy.json"
"""Name of the JSON metadata inside a TorchScript archive (``torch.jit.load(..., _extra_files=...)``)."""

GraphFormat = Literal["onnx", "torchscript"]


class PolicyGraph(nn.Module):
    """``(obs [B, D], reference_joint_pos [B, A] only for residual policies) -> (joint_pos_targets [B, A] [rad],
    actions [B, A])`` of an :class:`ExportedPolicy`, in operations ONNX and TorchScript both export."""

    def __init__(self, policy: ExportedPolicy):
        super().__init__()
        self.mean_net = _copy_net(policy.mean_net)
        # the same float32 numbers as ExportedPolicy.normalize: mean cast, rsqrt taken in float64 then cast
        self.register_buffer("obs_mean", policy.obs_mean.to(torch.float32).clone())
        self.register_buffer("obs_inv_std", torch.rsqrt(policy.obs_var + policy.obs_eps).to(torch.float32))
        self.obs_clip = policy.obs_clip
        self.residual = policy.action_offset == "reference"
        self.register_buffer("default_joint_pos", policy.default_joint_pos.to(torch.float32).clone())
        self.register_buffer("action_scale", policy.action_scale.to(torch.float32).clone())

    def forward(self, obs: torch.Tensor, reference_joint_pos: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = (obs - self.obs_mean) * self.obs_inv_std
        if self.obs_clip is not None:
            x = x.clamp(-self.obs_clip, self.obs_clip)
        actions = self.mean_net(x)
        base = reference_joint_pos if self.residual else self.default_joint_pos
        return base + self.action_scale * torch.tanh(actions), actions


def _copy_net(net: nn.Sequential) -> nn.Sequential:
    """A detached copy of the mean network (the export must not change the loaded policy)."""
    out = copy.deepcopy(net).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


def graph_metadata(policy: ExportedPolicy) -> dict[str, Any]:
    """Everything a deployment stack needs besides the graph: joint order, PD gains, torque limits, default pose,
    action scale and map, control rate, observation layout, input and output names, MJCF hash, clip, provenance."""
    from bcg.robots import g1
    from bcg.sim import ContactParams

    meta = policy.meta
    env = dict(meta.get("env", {}))
    # None in the env options means the simulator's default: write the numbers a deployment loop steps with
    substeps = int(env.get("substeps") or ContactParams().substeps)
    sim_dt = float(env.get("sim_dt") or ContactParams().dt)
    a = int(meta["action_dim"])
    inputs = [{"name": "obs", "shape": ["batch", int(meta["obs_dim"])], "dtype": "float32"}]
    if policy.action_offset == "reference":
        inputs.append({"name": "reference_joint_pos", "shape": ["batch", a], "dtype": "float32", "unit": "rad"})
    return {
        "format": GRAPH_FORMAT,
        "format_version": GRAPH_FORMAT_VERSION,
        "inputs": inputs,
        "outputs": [{"name": "joint_pos_targets", "shape": ["batch", a], "dtype": "float32", "unit": "rad"},
                    {"name": "actions", "shape": ["batch", a], "dtype": "float32", "unit": "raw action, pre-tanh"}],
        "joint_names": list(meta["joint_names"]),
        "joint_stiffness": [float(x) for x in g1.KP],
        "joint_damping": [float(x) for x in g1.KD],
        "torque_limits": [float(x) for x in g1.TORQUE_LIMITS],
        "default_joint_pos": [float(x) for x in policy.default_joint_pos],
        "action_scale": [float(x) for x in policy.action_scale],
        "action_offset": policy.action_offset,
        "action_map": str(meta.get("action_map", "")),
        "control_dt": float(meta["control_dt"]),
        "control_rate_hz": 1.0 / float(meta["control_dt"]),
        "sim_dt": sim_dt,
        "substeps": substeps,
        "obs_dim": int(meta["obs_dim"]),
        "observation_names": [str(n) for n, _ in policy.observation_layout],
        "observation_sizes": [int(s) for _, s in policy.observation_layout],
        "ref_steps": env.get("ref_steps"),
        "mjcf_file": str(meta.get("mjcf_file", "")),
        "mjcf_sha256": policy.mjcf_sha256,
        "motion": dict(policy.motion),
        "agent": policy.agent,
        "bcg_version": policy.bcg_version,
        "env": env,
        "onnx_opset": ONNX_OPSET,
    }


def _example_inputs(graph: PolicyGraph, batch: int = 2) -> tuple[torch.Tensor, ...]:
    d, a = int(graph.obs_mean.shape[0]), int(graph.action_scale.shape[0])
    obs = torch.zeros(batch, d)
    return (obs, torch.zeros(batch, a)) if graph.residual else (obs,)


def _onnx_value(value: Any) -> str:
    """A metadata value as ONNX text: a flat list of numbers or names comma-separated, anything else JSON."""
    if isinstance(value, list) and value and all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                                                 for v in value):
        return ",".join(repr(v) if isinstance(v, float) else str(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _write_onnx(graph: PolicyGraph, meta: dict[str, Any], path: Path) -> None:
    import onnx

    names = ["obs", "reference_joint_pos"] if graph.residual else ["obs"]
    outputs = ["joint_pos_targets", "actions"]
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript-based exporter is deprecated in favour of dynamo (see above)
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, _example_inputs(graph), buf, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=names, output_names=outputs, do_constant_folding=True,
                          dynamic_axes={n: {0: "batch"} for n in names + outputs})
    model = onnx.load_from_string(buf.getvalue())
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, _onnx_value(value)
    entry = model.metadata_props.add()
    entry.key, entry.value = "bcg", json.dumps(meta, sort_keys=True)
    model.producer_name, model.doc_string = "bcg", "bcg policy: observation -> PD joint targets"
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _write_torchscript(graph: PolicyGraph, meta: dict[str, Any], path: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():  # torch.jit is deprecated, and still what deployment stacks load
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(graph, _example_inputs(graph), check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(meta, sort_keys=True)})


def export_graph(policy: ExportedPolicy, path: str | Path, fmt: GraphFormat = "onnx") -> Path:
    """Write ``policy`` as a deployment graph (``fmt``: ``"onnx"`` or ``"torchscript"``) with its metadata; returns
    the path. The file is written to a temporary name and renamed, so a reader never sees half a file."""
    if fmt not in GRAPH_FORMATS:
        raise ValueError(f"format must be one of {GRAPH_FORMATS}, got {fmt!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = PolicyGraph(policy).eval()
    meta = graph_metadata(policy)
    tmp = path.with_name(path.name + ".tmp")
    try:
        (_write_onnx if fmt == "onnx" else _write_torchscript)(graph, meta, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
