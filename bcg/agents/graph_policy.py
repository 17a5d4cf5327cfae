"""Running a deployment graph (:mod:`bcg.agents.export_graph`): an ONNX file through onnxruntime or a TorchScript
file through ``torch.jit``, behind the interface ``bcg evaluate`` replays (:class:`GraphPolicy`).

``policy(obs [B, D], reference_joint_pos [B, A] | None) -> (joint_pos_targets [B, A] [rad], actions [B, A])``;
:meth:`GraphPolicy.bind` gives the replay's ``obs -> actions`` callable for an environment, feeding a residual
policy the reference joint positions of the frame each step lands on.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bcg.agents.export import PolicyFileError, check_mjcf_hash
from bcg.agents.export_graph import GRAPH_FORMAT, METADATA_FILE

if TYPE_CHECKING:  # pragma: no cover
    from bcg.envs import G1TrackingVectorEnv

__all__ = ["GraphPolicy", "is_graph_file", "load_graph_policy"]

Runner = Callable[[np.ndarray, "np.ndarray | None"], tuple[np.ndarray, np.ndarray]]
"""``(obs [B, D] float32, reference_joint_pos [B, A] float32 or None) -> (targets [B, A], actions [B, A])``."""


def _torchscript_metadata_name(path: Path) -> str | None:
    """The archive member holding the metadata of a TorchScript policy graph, or None for any other file."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        return next((n for n in z.namelist() if n.endswith(f"/extra/{METADATA_FILE}")), None)


def is_graph_file(path: str | Path) -> bool:
    """True for an ONNX file (by its ``.onnx`` suffix) or a TorchScript archive carrying policy-graph metadata."""
    p = Path(path)
    return p.suffix.lower() == ".onnx" or (p.is_file() and _torchscript_metadata_name(p) is not None)


class GraphPolicy:
    """A policy graph and its metadata (:func:`bcg.agents.export_graph.graph_metadata`), run by ``runner``.

    Attributes: ``meta`` (the metadata dict, with the env options under ``"env"``), ``observation_layout`` (list of
    (term, size)), ``action_offset``, ``action_scale`` and ``default_joint_pos`` ([A] float32 tensors), ``motion``,
    ``mjcf_sha256``, ``agent``, ``path``.
    """

    def __init__(self, runner: Runner, meta: dict[str, Any], path: Path):
        if meta.get("format") != GRAPH_FORMAT:
            raise PolicyFileError(f"{path}: metadata format {meta.get('format')!r}, expected {GRAPH_FORMAT!r}")
        self._run = runner
        self.meta = meta
        self.path = path
        self.observation_layout = [(str(n), int(s)) for n, s in zip(meta["observation_names"],
                                                                     meta["observation_sizes"], strict=True)]
        self.action_offset = str(meta["action_offset"])
        self.action_scale = torch.tensor(meta["action_scale"], dtype=torch.float32)
        self.default_joint_pos = torch.tensor(meta["default_joint_pos"], dtype=torch.float32)
        self.motion = dict(meta["motion"])
        self.mjcf_sha256 = str(meta["mjcf_sha256"])
        self.agent = str(meta.get("agent", ""))

    @property
    def residual(self) -> bool:
        """Whether the graph takes the reference joint positions (actions are residuals on the reference)."""
        return self.action_offset == "reference"

    def __call__(self, obs: torch.Tensor, reference_joint_pos: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(joint_pos_targets [B, A] [rad], actions [B, A])`` of observations [B, D] (float32 torch)."""
        if self.residual and reference_joint_pos is None:
            raise ValueError(f"{self.path} is a residual policy: pass reference_joint_pos [B, A], the clip's joint "
                             "positions at the frame the step lands on")
        x = obs.detach().to("cpu", torch.float32).numpy()
        ref = None if not self.residual else reference_joint_pos.detach().to("cpu", torch.float32).numpy()
        targets, actions = self._run(np.ascontiguousarray(x), None if ref is None else np.ascontiguousarray(ref))
        return torch.from_numpy(np.asarray(targets)), torch.from_numpy(np.asarray(actions))

    def check_mjcf(self, path: str | Path) -> None:
        """Raise :class:`~bcg.agents.export.PolicyFileError` unless ``path`` is the MJCF the policy was trained on."""
        check_mjcf_hash(path, self.mjcf_sha256, self.meta.get("mjcf_file"))

    def bind(self, env: G1TrackingVectorEnv) -> Callable[[torch.Tensor], torch.Tensor]:
        """The replay's ``obs [E, D] -> raw actions [E, A]`` for ``env`` (reads the reference at each row's next
        frame from the env's state when the policy is residual)."""
        qpos = env.motion.qpos

        def act(obs: torch.Tensor) -> torch.Tensor:
            ref = None
            if self.residual:
                frame = (env.state.frame + 1).clamp(0, env.num_frames - 1)
                ref = qpos[frame.to(qpos.device), 7:]
            return self(obs, ref)[1].to(obs.device)

        return act


def _onnx_runner(path: Path) -> tuple[Runner, dict[str, Any]]:
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - part of the install requirements
        raise ImportError("running an ONNX policy needs onnxruntime: pip install onnxruntime") from exc
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for a damaged file
        raise PolicyFileError(f"{path} is not a loadable ONNX model ({type(exc).__name__}: {exc})") from None
    props = session.get_modelmeta().custom_metadata_map
    if "bcg" not in props:
        raise PolicyFileError(f"{path} is an ONNX model without bcg policy metadata (write one with "
                              "`bcg export RUN --format onnx`)")
    names = [i.name for i in session.get_inputs()]

    def run(obs: np.ndarray, ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        feed = {"obs": obs} if ref is None else {"obs": obs, "reference_joint_pos": ref}
        targets, actions = session.run(["joint_pos_targets", "actions"], {k: feed[k] for k in names})
        return targets, actions

    return run, json.loads(props["bcg"])


def _torchscript_runner(path: Path) -> tuple[Runner, dict[str, Any]]:
    extra = {METADATA_FILE: ""}
    with warnings.catch_warnings():  # torch.jit is deprecated, and still what deployment stacks load
        warnings.simplefilter("ignore", DeprecationWarning)
        module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
    module.eval()

    def run(obs: np.ndarray, ref: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        args = (torch.from_numpy(obs),) if ref is None else (torch.from_numpy(obs), torch.from_numpy(ref))
        with torch.no_grad():
            targets, actions = module(*args)
        return targets.numpy(), actions.numpy()

    return run, json.loads(extra[METADATA_FILE])


def load_graph_policy(path: str | Path) -> GraphPolicy:
    """Load an ONNX (``.onnx``) or TorchScript policy graph written by :func:`bcg.agents.export_graph.export_graph`."""
    p = Path(path)
    if not p.is_file():
        raise PolicyFileError(f"policy graph {p} does not exist (or is not a file)")
    if p.suffix.lower() == ".onnx":
        runner, meta = _onnx_runner(p)
    elif _torchscript_metadata_name(p) is not None:
        runner, meta = _torchscript_runner(p)
    else:
        raise PolicyFileError(f"{p} is neither an ONNX file nor a TorchScript policy graph")
    return GraphPolicy(runner, meta, p)
