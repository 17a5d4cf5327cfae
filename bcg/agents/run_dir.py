"""The run directory of ``bcg train``: its name, where a new or resumed run writes (refusing anything that would
lose or misplace a result), the recorded motion hash, and the software versions written beside the config.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bcg.agents.checkpoint import (
    Checkpoint,
    list_checkpoints,
)
from bcg.agents.train_config import TrainConfig, motion_name
from bcg.errors import UserError

__all__ = [
    "collect_versions", "make_run_dir", "record_motion_hash", "resolve_run_dir", "run_dir_of", "run_name",
    "write_text_atomic",
]


def run_name(cfg: TrainConfig, now: _dt.datetime | None = None) -> str:
    """``MOTION-AGENT[-ESTIMATOR][-add]-PRESET-sSEED-YYYYmmdd-HHMMSS`` (the estimator only for SHAC)."""
    now = now or _dt.datetime.now()
    parts = [motion_name(cfg.motion), cfg.agent]
    if cfg.agent == "shac":
        parts.append(cfg.estimator.name)
    if cfg.reward == "add":
        parts.append("add")
    parts += [cfg.preset, f"s{cfg.seed}", now.strftime("%Y%m%d-%H%M%S")]
    return "-".join(parts)


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint file belongs to (``RUN/checkpoints/iter_N.pt`` -> ``RUN``)."""
    parent = Path(checkpoint).resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def _dist_version(*names: str) -> str | None:
    import importlib.metadata

    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def collect_versions() -> dict[str, Any]:
    """Versions of Python, the libraries a run depends on, bcg, and the git commit of the checkout (if any)."""
    import torch

    import bcg

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "warp": _dist_version("warp-lang", "warp"),
        "mujoco": _dist_version("mujoco"),
        "gymnasium": _dist_version("gymnasium"),
        "stable_baselines3": _dist_version("stable-baselines3", "stable_baselines3"),
        "tyro": _dist_version("tyro"),
        "numpy": _dist_version("numpy"),
        "bcg": bcg.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
    root = Path(bcg.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode == 0:
            out["git_commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            out["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resolve_run_dir(cfg: TrainConfig, ckpt: Checkpoint | None) -> Path:
    """The run directory ``cfg`` trains in; raises :class:`~bcg.errors.UserError` where training there would lose or
    misplace results. Writes nothing.

    * a new run (or ``--branch``): ``OUT/NAME``, which must not exist with files in it, under an ``OUT`` that is not a
      file (a branch's default: beside the run it comes from, ``RUN-from-iterN-TIMESTAMP``);
    * ``--resume``: the run of the checkpoint, which must lie in a run's ``checkpoints/`` folder (else resuming would
      write config.json, metrics.csv and policy.pt beside it) and be the run's latest (else the later checkpoints
      and their metrics rows would be replaced); ``--name`` / ``--out`` other than the run's are refused (they do not
      apply to a run that stays where it is)."""
    if ckpt is None:
        return _new_run_dir(Path(cfg.out), cfg.name or run_name(cfg))
    home = run_dir_of(ckpt.path)
    if cfg.branch:
        out = Path(cfg.out) if str(cfg.out) != str(ckpt.config.get("out")) else home.parent
        name = cfg.name if cfg.name != ckpt.config.get("name") else None
        return _new_run_dir(out, name or f"{home.name}-from-iter{ckpt.iteration}-{_dt.datetime.now():%Y%m%d-%H%M%S}")
    branch_hint = f"continue from iteration {ckpt.iteration} in a new run directory with --branch (and --out / --name)"
    if ckpt.path.resolve().parent.name != "checkpoints":
        raise UserError(f"{ckpt.path} is not in a run's checkpoints/ folder: resuming it in place would write "
                        f"config.json, metrics.csv and policy.pt beside it in {home}; {branch_hint}")
    later = [p.name for it, p in list_checkpoints(ckpt.path.resolve().parent) if it > ckpt.iteration]
    if later:
        raise UserError(f"{ckpt.path} is at iteration {ckpt.iteration} but {home} has later checkpoints "
                        f"({', '.join(later)}): resuming there would replace their results; resume the latest "
                        f"(--resume {home}) or {branch_hint}")
    given = [f"--{key} {getattr(cfg, key)}" for key in ("name", "out")
             if str(getattr(cfg, key)) != str(ckpt.config.get(key))]
    if given:
        raise UserError(f"{' and '.join(given)} would be ignored: a resumed run stays in {home}; {branch_hint}")
    return home


def _new_run_dir(out: Path, name: str) -> Path:
    """``out / name`` for a new run, refusing an ``out`` that is a file and a run directory that has files."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; expected a folder in which the run directory is made")
    run_dir = out / name
    if run_dir.is_dir() and any(run_dir.iterdir()):
        hint = (f"continue it with --resume {run_dir}" if list_checkpoints(run_dir / "checkpoints")
                else "remove it")
        raise UserError(f"run directory {run_dir} exists and is not empty; choose another --name, or {hint}")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file; expected a new run directory there (choose another --name)")
    return run_dir


def make_run_dir(run_dir: Path) -> None:
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir}/: {exc.strerror or exc} (check --out)") from None


def record_motion_hash(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the sha256 of its motion file; refuses a file whose hash differs from the one ``cfg`` recorded."""
    from bcg.motion.formats import motion_sha256, resolve_motion_path

    current = motion_sha256(cfg.motion)
    if cfg.motion_sha256 is not None and current != cfg.motion_sha256:
        raise UserError(f"motion file {resolve_motion_path(cfg.motion)} has changed since the run recorded it "
                        f"(sha256 {cfg.motion_sha256[:12]}..., now {current[:12]}...); restore the file, or train a "
                        "new run on the new clip")
    return dataclasses.replace(cfg, motion_sha256=current)

