"""Training checkpoints: atomic writes, a format tag, safe (weights-only) reads and errors that say what is wrong.

A checkpoint is ``torch.save`` of a dict::

    {"format": "bcg-checkpoint", "version": 1,
     "agent": agent.state_dict(),                  # tensors and plain Python values only
     "trainer": {"iteration": int, "run_id": str, "config_json": str (the resolved TrainConfig as JSON),
                 "metrics_header": [str, ...], "metrics_rows": [[float, ...], ...]}}   # rows written so far

It is written atomically (:func:`atomic_torch_save`: a temporary file in the same folder, flush, fsync, rename over
the target, fsync of the folder), so a crash or Ctrl-C during a write leaves the previous checkpoint intact, never a
half-written one under the final name. It is read with ``torch.load(..., weights_only=True)``
(:func:`load_checkpoint`): a file holding a pickled arbitrary object is refused before anything in it runs.
:func:`check_compatible` compares a checkpoint's config with the one a resumed run asks for and names the fields
that differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bcg.agents.torch_files import atomic_torch_save, read_torch_file
from bcg.errors import UserError

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "Checkpoint", "CheckpointError", "atomic_torch_save",
           "check_compatible", "config_differences", "latest_checkpoint", "list_checkpoints", "load_checkpoint",
           "save_checkpoint", "verify_agent_fits", "verify_state_fits"]

CHECKPOINT_FORMAT = "bcg-checkpoint"
"""Format tag stored in every checkpoint."""
CHECKPOINT_VERSION = 1
"""Checkpoint layout version this module writes and reads."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used: missing, truncated, corrupt, unsafe, of another format or incompatible."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back by :func:`load_checkpoint`."""

    path: Path
    """The file it came from."""
    agent_state: dict[str, Any]
    """The agent's ``state_dict()``."""
    iteration: int
    """Iterations completed when it was written."""
    run_id: str
    """The run directory's name."""
    config: dict[str, Any]
    """The resolved training config (decoded from its JSON)."""
    metrics_header: list[str]
    """Columns of metrics.csv."""
    metrics_rows: list[list[float]]
    """The metrics.csv rows written up to ``iteration`` (one per iteration)."""


def save_checkpoint(path: str | Path, *, agent_state: Mapping[str, Any], iteration: int, run_id: str,
                    config: Mapping[str, Any], metrics_header: Iterable[str] = (),
                    metrics_rows: Iterable[Iterable[float]] = ()) -> Path:
    """Write a checkpoint atomically (see the module docstring for the layout); returns the path."""
    payload = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "agent": dict(agent_state),
        "trainer": {"iteration": int(iteration), "run_id": str(run_id),
                    "config_json": json.dumps(config, sort_keys=True),
                    "metrics_header": [str(h) for h in metrics_header],
                    "metrics_rows": [[float(v) for v in row] for row in metrics_rows]},
    }
    return atomic_torch_save(payload, path)


def latest_checkpoint(path: str | Path) -> Path:
    """``path`` itself if it is a file; for a run directory (or its ``checkpoints/`` folder) the checkpoint of the
    highest iteration in ``checkpoints/``. Raises :class:`CheckpointError` if there is none."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.exists():
        raise CheckpointError(f"{p} does not exist (expected a checkpoint file or a run directory)")
    folder = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    found = list_checkpoints(folder)
    if not found:
        raise CheckpointError(f"no checkpoint (iter_NNNNNN.pt) in {folder}")
    return found[-1][1]


def list_checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """(iteration, file) of every ``iter_NNNNNN.pt`` in ``folder``, by iteration (empty if none; other files and
    names that are not a number after ``iter_`` are ignored)."""
    found = []
    for f in Path(folder).glob("iter_*.pt"):
        try:
            found.append((int(f.stem.split("_", 1)[1]), f))
        except ValueError:
            continue
    return sorted(found)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file (or a run directory's latest) with ``torch.load(..., weights_only=True)``.

    Raises :class:`CheckpointError` naming what is wrong: missing/empty/truncated/corrupt file, a pickled Python
    object (refused by the weights-only loader, never executed), a file of another format (e.g. a policy export)
    or version, or missing entries."""
    p = latest_checkpoint(path)
    obj = read_torch_file(p, "checkpoint", CheckpointError)
    if not isinstance(obj, dict) or "format" not in obj:
        kind = type(obj).__name__ if not isinstance(obj, dict) else f"dict with keys {sorted(map(str, obj))[:8]}"
        raise CheckpointError(f"{p} is not a bcg checkpoint: it holds a {kind} without the format tag "
                              f"{CHECKPOINT_FORMAT!r}")
    if obj["format"] != CHECKPOINT_FORMAT:
        hint = " (a policy export: it holds no optimiser or trainer state to resume from)" \
            if obj["format"] == "bcg-policy" else ""
        raise CheckpointError(f"{p} has format {obj['format']!r}, expected {CHECKPOINT_FORMAT!r}{hint}")
    if obj.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{p}: checkpoint version {obj.get('version')!r}; this bcg reads version "
                              f"{CHECKPOINT_VERSION}")
    try:
        tr = obj["trainer"]
        return Checkpoint(path=p, agent_state=obj["agent"], iteration=int(tr["iteration"]), run_id=str(tr["run_id"]),
                          config=json.loads(tr["config_json"]), metrics_header=list(tr["metrics_header"]),
                          metrics_rows=[list(r) for r in tr["metrics_rows"]])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{p}: damaged checkpoint, trainer entry unreadable ({type(exc).__name__}: {exc})"
                              ) from None


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_differences(saved: Mapping[str, Any], requested: Mapping[str, Any],
                       ignore: Iterable[str] = ()) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, requested value)`` for every (dotted, nested) config field that differs, except the
    fields in ``ignore`` and anything below them (``"out"`` ignores ``out`` and ``out.*``)."""
    ig = tuple(ignore)
    a, b = _flatten(saved), _flatten(requested)
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == i or key.startswith(i + ".") for i in ig):
            continue
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if va != vb:
            diffs.append((key, va, vb))
    return diffs


def check_compatible(ckpt: Checkpoint, config: Mapping[str, Any], ignore: Iterable[str] = ()) -> None:
    """Raise :class:`CheckpointError` listing the config fields in which ``config`` differs from the checkpoint's
    (except ``ignore``): resuming with another agent, estimator, reward, motion or network would not fit or would not
    continue the same run."""
    diffs = config_differences(ckpt.config, config, ignore)
    # another estimator (or any other named choice) brings its own fields: name the choice, not each field it adds
    renamed = {k[: -len("name")] for k, _, _ in diffs if k.endswith(".name")}
    diffs = [d for d in diffs if not (any(d[0].startswith(r) for r in renamed) and "<absent>" in d[1:])]
    if diffs:
        lines = "; ".join(f"{k}: checkpoint {va!r}, requested {vb!r}" for k, va, vb in diffs)
        raise CheckpointError(f"{ckpt.path} was written by a run with another configuration; resume it with the "
                              f"same settings (differing fields): {lines}")


def verify_state_fits(ckpt_state: Mapping[str, Any], fresh_state: Mapping[str, Any], path: Path | str,
                      later: Iterable[str] = ()) -> None:
    """Raise :class:`CheckpointError` where the checkpoint's agent state has other top-level entries or other tensor
    shapes than a freshly built agent's (the networks do not fit, whatever the config says). Entries below the top
    level that a fresh agent does not have yet (optimiser moments, open estimator bundles) are not compared, nor
    top-level entries named in ``later`` (added to the agent's state after checkpoints were first written; its
    ``load_state_dict`` supplies them when absent)."""
    missing = sorted(set(fresh_state) - set(ckpt_state) - set(later))
    extra = sorted(set(ckpt_state) - set(fresh_state))
    a, b = _flatten(ckpt_state), _flatten(fresh_state)
    shapes = [(k, tuple(a[k].shape), tuple(b[k].shape)) for k in sorted(set(a) & set(b))
              if isinstance(a[k], torch.Tensor) and isinstance(b[k], torch.Tensor) and a[k].shape != b[k].shape]
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"missing entries {missing[:6]}{' ...' if len(missing) > 6 else ''}")
        if extra:
            parts.append(f"unexpected entries {extra[:6]}{' ...' if len(extra) > 6 else ''}")
        if shapes:
            parts.append("shape mismatches " + ", ".join(f"{k}: checkpoint {sa}, agent {sb}"
                                                         for k, sa, sb in shapes[:6]))
        raise CheckpointError(f"{path}: the agent state does not fit the agent being built: " + "; ".join(parts))


def verify_agent_fits(ckpt: Checkpoint, agent: Any) -> None:
    """:func:`verify_state_fits` of ``ckpt``'s agent state against ``agent``'s own, leaving out the entries the
    agent names as added after checkpoints were first written (its ``LATER_STATE_KEYS``)."""
    verify_state_fits(ckpt.agent_state, agent.state_dict(), ckpt.path, later=getattr(agent, "LATER_STATE_KEYS", ()))
