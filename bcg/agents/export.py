"""The self-contained policy file: a deterministic policy that MuJoCo evaluation loads without the training code.

An agent's :meth:`~bcg.agents.base.Agent.export_policy` calls :func:`policy_export` with its policy *mean* network
(an ``nn.Sequential`` of ``Linear``, ``LayerNorm``, ``ELU`` / ``ReLU`` / ``Tanh`` / ``SiLU`` / ``Identity``), its
observation normaliser and its environment; :func:`save_policy` writes the result and :func:`load_policy` reads it
back as an :class:`ExportedPolicy`, a small ``torch.nn.Module``:

* ``policy(obs)``: observation [..., 849] (the env's raw observation) -> raw action a [..., 29], i.e.
  ``mean_net(clip((obs - obs_mean) * rsqrt(obs_var + obs_eps), -obs_clip, obs_clip))``, before the env's tanh;
* ``policy.action_to_target(a)``: PD joint targets [..., 29] [rad] = q_default + s_a tanh(a) (no domain-randomisation
  offset), the env's action map; for a policy trained with ``action_offset="reference"`` (``policy.action_offset``)
  the targets are q_ref + s_a tanh(a) and ``action_to_target(a, reference_joint_pos)`` needs the reference's joint
  positions at the frame the step lands on;
* metadata: ``observation_layout`` (term, size), ``mjcf_sha256`` (sha256 of the robot MJCF the env simulated),
  ``motion`` (clip name, source and the source file's sha256), ``agent``, ``bcg_version``, the env options that
  change the dynamics.

File format (version :data:`POLICY_FORMAT_VERSION`): ``torch.save`` of a dict holding only a format tag, a JSON string
of the metadata (including the layer list) and a flat ``{name: tensor}`` dict, so ``torch.load(..., weights_only=True)``
reads it and a policy file cannot execute code when loaded. This module imports only torch, the standard library,
:mod:`bcg.errors` and :mod:`bcg.files`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bcg.agents.torch_files import atomic_torch_save, read_torch_file
from bcg.errors import UserError
from bcg.files import file_sha256

__all__ = ["POLICY_FORMAT", "POLICY_FORMAT_VERSION", "ExportedPolicy", "PolicyFileError", "check_mjcf_hash",
           "file_sha256", "load_policy", "policy_export", "save_policy"]

POLICY_FORMAT = "bcg-policy"
"""Format tag stored in every policy file."""
POLICY_FORMAT_VERSION = 1
"""Version of the policy file layout this module writes and reads."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {"ELU": nn.ELU, "ReLU": nn.ReLU, "Tanh": nn.Tanh, "SiLU": nn.SiLU,
                                            "Identity": nn.Identity}


class PolicyFileError(UserError):
    """A policy file that is not one, is damaged, or holds something this loader refuses to build."""


# -------------------------------------------------------------------------------------------- encoding the network


def _encode_layers(net: nn.Sequential) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Layer specs (JSON) and tensors ``layers.{i}.{weight,bias}`` of an ``nn.Sequential`` of supported modules."""
    if not isinstance(net, nn.Sequential):
        raise TypeError(f"mean_net must be a torch.nn.Sequential, got {type(net).__name__}")
    specs: list[dict[str, Any]] = []
    tensors: dict[str, torch.Tensor] = {}
    for i, m in enumerate(net):
        key = f"layers.{i}"
        if isinstance(m, nn.Linear):
            specs.append({"type": "Linear", "in_features": m.in_features, "out_features": m.out_features,
                          "bias": m.bias is not None})
        elif isinstance(m, nn.LayerNorm):
            specs.append({"type": "LayerNorm", "normalized_shape": list(m.normalized_shape), "eps": float(m.eps),
                          "elementwise_affine": bool(m.elementwise_affine),
                          "bias": getattr(m, "bias", None) is not None})
        elif isinstance(m, nn.ELU):
            specs.append({"type": "ELU", "alpha": float(m.alpha)})
        elif type(m).__name__ in _ACTIVATIONS and type(m) is _ACTIVATIONS[type(m).__name__]:
            specs.append({"type": type(m).__name__})
        else:
            raise TypeError(f"mean_net layer {i} is a {type(m).__name__}; the policy export encodes only "
                            f"Linear, LayerNorm and {', '.join(_ACTIVATIONS)} (build the mean network from these)")
        for name in ("weight", "bias"):
            p = getattr(m, name, None)
            if isinstance(p, torch.Tensor):
                tensors[f"{key}.{name}"] = p.detach().to("cpu", torch.float32).clone()
    return specs, tensors


def _build_layers(specs: list[dict[str, Any]]) -> nn.Sequential:
    """The ``nn.Sequential`` that :func:`_encode_layers` described (weights uninitialised until loaded)."""
    layers: list[nn.Module] = []
    for i, s in enumerate(specs):
        t = s.get("type")
        if t == "Linear":
            layers.append(nn.Linear(int(s["in_features"]), int(s["out_features"]), bias=bool(s["bias"])))
        elif t == "LayerNorm":
            kw: dict[str, Any] = {"eps": float(s["eps"]), "elementwise_affine": bool(s["elementwise_affine"])}
            if s["elementwise_affine"] and not s.get("bias", True):
                kw["bias"] = False
            layers.append(nn.LayerNorm(tuple(int(d) for d in s["normalized_shape"]), **kw))
        elif t == "ELU":
            layers.append(nn.ELU(alpha=float(s.get("alpha", 1.0))))
        elif t in _ACTIVATIONS:
            layers.append(_ACTIVATIONS[t]())
        else:
            raise PolicyFileError(f"layer {i} has unknown type {t!r}; supported: Linear, LayerNorm, "
                                  f"{', '.join(_ACTIVATIONS)}")
    return nn.Sequential(*layers)


# -------------------------------------------------------------------------------------------- export


def policy_export(mean_net: nn.Sequential, obs_mean: torch.Tensor, obs_var: torch.Tensor, *, obs_eps: float,
                  obs_clip: float | None, env: Any, agent: str) -> dict[str, Any]:
    """The deterministic policy of an agent as a plain dict (tensors + JSON-able values) for :func:`save_policy`.

    Args:
        mean_net: observation normalised [..., D] -> raw action a [..., A] (before the env's tanh); an
            ``nn.Sequential`` of Linear / LayerNorm / ELU / ReLU / Tanh / SiLU / Identity.
        obs_mean, obs_var: [D] running mean and variance of the observations (the normaliser's statistics; kept in
            float64).
        obs_eps: added to the variance: the policy sees ``(obs - obs_mean) * rsqrt(obs_var + obs_eps)`` (mean and
            rsqrt in float64, cast to the observation's dtype: the same numbers as
            :class:`bcg.agents.normalization.FrozenNormalizer`).
        obs_clip: the normalised observation is clipped to [-obs_clip, obs_clip] (None: no clipping).
        env: the :class:`bcg.envs.G1TrackingVectorEnv` the agent trained on (action map, observation layout, model).
        agent: the agent's name ("shac", "ppo", ...).
    """
    import bcg
    from bcg.envs.config import REFERENCE_FIELDS
    from bcg.robots.g1 import JOINT_NAMES, MJCF_PATH

    specs, tensors = _encode_layers(mean_net)
    d, a = int(env.obs_dim), int(env.single_action_space.shape[0])
    # float64, as the running normalisers keep them: the loaded policy normalises exactly as the agent did
    obs_mean = torch.as_tensor(obs_mean).detach().to("cpu", torch.float64).reshape(-1).clone()
    obs_var = torch.as_tensor(obs_var).detach().to("cpu", torch.float64).reshape(-1).clone()
    if obs_mean.shape != (d,) or obs_var.shape != (d,):
        raise ValueError(f"obs_mean and obs_var must have shape [{d}] (the env's observation), got "
                         f"{tuple(obs_mean.shape)} and {tuple(obs_var.shape)}")
    if not (torch.isfinite(obs_mean).all() and torch.isfinite(obs_var).all() and (obs_var >= 0).all()):
        raise ValueError("obs_mean and obs_var must be finite and obs_var >= 0")
    if not (math.isfinite(obs_eps) and obs_eps >= 0):
        raise ValueError(f"obs_eps must be a finite number >= 0, got {obs_eps!r}")
    if obs_clip is not None and not (math.isfinite(obs_clip) and obs_clip > 0):
        raise ValueError(f"obs_clip must be a finite number > 0 or None, got {obs_clip!r}")
    lin = [s for s in specs if s["type"] == "Linear"]
    if not lin or lin[0]["in_features"] != d or lin[-1]["out_features"] != a:
        raise ValueError(f"mean_net must map [{d}] observations to [{a}] actions; its Linear layers go "
                         f"{[(s['in_features'], s['out_features']) for s in lin]}")
    cfg = env.config
    meta = {
        "agent": str(agent),
        "bcg_version": bcg.__version__,
        "layers": specs,
        "obs_dim": d,
        "action_dim": a,
        "obs_eps": float(obs_eps),
        "obs_clip": None if obs_clip is None else float(obs_clip),
        "observation_layout": [[str(n), int(s)] for n, s in env.observation_layout],
        "joint_names": list(JOINT_NAMES),
        "action_map": ("q_des = default_joint_pos + action_scale * tanh(a)" if env.action_offset == "default" else
                       "q_des = reference_joint_pos(t + 1) + action_scale * tanh(a)"),
        "action_offset": str(env.action_offset),
        "mjcf_file": MJCF_PATH.name,
        "mjcf_sha256": file_sha256(MJCF_PATH),
        "motion": {"name": env.motion.name, "source": str(env.motion.source), "num_frames": int(env.num_frames),
                   "sha256": file_sha256(env.motion.source) if Path(env.motion.source).is_file() else None},
        "control_dt": float(env.control_dt),
        "env": {**cfg.dynamics.as_dict(), **{name: getattr(cfg, name) for name in REFERENCE_FIELDS},
                "ref_steps": cfg.ref_steps,
                "domain_randomization": cfg.domain_randomization is not False},
    }
    tensors.update({"obs_mean": obs_mean, "obs_var": obs_var,
                    "default_joint_pos": env.default_joint_pos.detach().to("cpu", torch.float32).clone(),
                    "action_scale": env.action_scale.detach().to("cpu", torch.float32).clone()})
    return {"format": POLICY_FORMAT, "version": POLICY_FORMAT_VERSION, "meta": meta, "tensors": tensors}


def save_policy(path: str | Path, export: Mapping[str, Any]) -> Path:
    """Write :func:`policy_export`'s dict to ``path`` atomically (temporary file, fsync, rename); returns the path."""

    if export.get("format") != POLICY_FORMAT or "meta" not in export or "tensors" not in export:
        raise ValueError("save_policy expects the dict of bcg.agents.export.policy_export")
    payload = {"format": POLICY_FORMAT, "version": int(export["version"]),
               "meta_json": json.dumps(export["meta"], sort_keys=True), "tensors": dict(export["tensors"])}
    return atomic_torch_save(payload, path)


# -------------------------------------------------------------------------------------------- loading


class ExportedPolicy(nn.Module):
    """A loaded policy: ``forward(obs [..., D]) -> a [..., A]`` (raw, before tanh) and :meth:`action_to_target`.

    Attributes: ``meta`` (the whole metadata dict), ``observation_layout`` (list of (term, size)), ``mjcf_sha256``,
    ``motion`` (name, source, frames), ``agent``, ``bcg_version``, ``obs_eps``, ``obs_clip``; buffers ``obs_mean``,
    ``obs_var`` [D] (float64), ``default_joint_pos``, ``action_scale`` [A]; the network ``mean_net``.
    """

    def __init__(self, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]):
        super().__init__()
        self.meta = dict(meta)
        self.mean_net = _build_layers(list(meta["layers"]))
        net_sd = {k[len("layers."):]: v for k, v in tensors.items() if k.startswith("layers.")}
        try:
            self.mean_net.load_state_dict(net_sd, strict=True)
        except RuntimeError as exc:
            raise PolicyFileError(f"the network tensors do not fit the stored layer list: {exc}") from None
        d, a = int(meta["obs_dim"]), int(meta["action_dim"])
        for name, size in (("obs_mean", d), ("obs_var", d), ("default_joint_pos", a), ("action_scale", a)):
            t = tensors.get(name)
            if not isinstance(t, torch.Tensor) or t.shape != (size,):
                raise PolicyFileError(f"tensor {name!r} must have shape [{size}], got "
                                      f"{None if not isinstance(t, torch.Tensor) else tuple(t.shape)}")
            self.register_buffer(name, t if name.startswith("obs_") else t.to(torch.float32))
        self.obs_eps = float(meta["obs_eps"])
        self.obs_clip = None if meta["obs_clip"] is None else float(meta["obs_clip"])
        self.observation_layout = [(str(n), int(s)) for n, s in meta["observation_layout"]]
        self.mjcf_sha256 = str(meta["mjcf_sha256"])
        self.motion = dict(meta["motion"])
        self.agent = str(meta["agent"])
        self.bcg_version = str(meta["bcg_version"])
        self.action_offset = str(meta.get("action_offset", "default"))  # files before the option: "default"
        if self.action_offset not in ("default", "reference"):
            raise PolicyFileError(f"action_offset {self.action_offset!r} is neither 'default' nor 'reference'")
        self.eval()

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalised observation [..., D] (float32): (obs - mean) * rsqrt(var + eps), clipped to +-obs_clip."""
        obs = obs.to(torch.float32)
        x = (obs - self.obs_mean.to(obs.dtype)) * torch.rsqrt(self.obs_var + self.obs_eps).to(obs.dtype)
        return x if self.obs_clip is None else x.clamp(-self.obs_clip, self.obs_clip)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Raw action a [..., A] of observations [..., D] (the env applies tanh and the action map)."""
        if obs.shape[-1] != self.obs_mean.shape[0]:
            raise ValueError(f"observation must have {self.obs_mean.shape[0]} entries in its last dimension, got "
                             f"shape {tuple(obs.shape)}")
        return self.mean_net(self.normalize(obs))

    def action_to_target(self, actions: torch.Tensor, reference_joint_pos: torch.Tensor | None = None) -> torch.Tensor:
        """PD joint targets [..., A] [rad] of raw actions [..., A]: default_joint_pos + action_scale * tanh(a), or for
        ``action_offset == "reference"`` reference_joint_pos + action_scale * tanh(a), where ``reference_joint_pos``
        [..., A] [rad] are the clip's joint positions at the frame the control step lands on."""
        delta = self.action_scale * torch.tanh(actions.to(self.action_scale))
        if self.action_offset == "default":
            return self.default_joint_pos + delta
        if reference_joint_pos is None:
            raise ValueError("this policy's actions are residuals on the reference (action_offset='reference'): pass "
                             "reference_joint_pos, the clip's joint positions at the frame the step lands on")
        return reference_joint_pos.to(delta) + delta

    def check_mjcf(self, path: str | Path) -> None:
        """Raise :class:`PolicyFileError` unless the MJCF at ``path`` is the one the policy was trained on."""
        check_mjcf_hash(path, self.mjcf_sha256, self.meta.get("mjcf_file"))


def check_mjcf_hash(path: str | Path, expected_sha256: str, name: Any = None) -> None:
    """Raise :class:`PolicyFileError` unless the file at ``path`` has the sha256 ``expected_sha256`` (hex) that a
    policy recorded for its MJCF (``name``: the MJCF's file name, for the message)."""
    h = file_sha256(path)
    if h != expected_sha256:
        raise PolicyFileError(f"{path}: sha256 {h[:12]}... differs from the policy's MJCF "
                              f"{expected_sha256[:12]}... ({name})")


def load_policy(path: str | Path) -> ExportedPolicy:
    """Read a policy file written by :func:`save_policy` (weights-only, no unpickling of arbitrary objects)."""
    obj = read_torch_file(path, "policy file", PolicyFileError)
    if not isinstance(obj, dict) or obj.get("format") != POLICY_FORMAT:
        tag = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        hint = " (a training checkpoint: turn it into a policy with `bcg export RUN`)" \
            if tag == "bcg-checkpoint" else ""
        raise PolicyFileError(f"{path} is not a bcg policy file (format tag {tag!r}, expected {POLICY_FORMAT!r})"
                              + hint)
    if obj.get("version") != POLICY_FORMAT_VERSION:
        raise PolicyFileError(f"{path}: policy format version {obj.get('version')!r}; this bcg reads version "
                              f"{POLICY_FORMAT_VERSION}")
    try:
        meta = json.loads(obj["meta_json"])
        tensors = obj["tensors"]
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise PolicyFileError(f"{path}: damaged metadata ({type(exc).__name__}: {exc})") from None
    return ExportedPolicy(meta, tensors)
