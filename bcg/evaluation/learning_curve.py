"""Learning curves in MuJoCo: every checkpoint of a run replayed with ``bcg evaluate``'s protocol.

The trainer's own periodic evaluation (``metrics.csv``'s ``eval_*`` columns) runs short episodes in our simulator,
where a policy can look finished long before it stands in MuJoCo. ``bcg curve RUN`` rebuilds the policy of each
checkpoint in ``RUN/checkpoints/`` and scores it in both simulators (falls, mean episode length, E_track), so that
progress is read where it counts. Output, in ``RUN/eval/curve-CLIP[-HASH]/``:

* ``iter_NNNNNN.json``: the :class:`~bcg.evaluation.mujoco_transfer.TransferReport` of one checkpoint (kept, so a
  later call after more training only replays the new checkpoints);
* ``curve.csv``: one row per checkpoint: iteration, samples, training wall time [s], and per simulator the falls,
  the number of episodes, the mean episode length [s] and E_track [cm];
* ``curve.png``: those three measures against samples (top row) and training wall time (bottom row).

``HASH`` (8 hex digits) names non-default options, as ``bcg evaluate`` does.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from bcg.errors import InputNotFoundError, UserError
from bcg.evaluation.transfer_protocol import TransferOptions

__all__ = ["CURVE_COLUMNS", "MEASURES", "SIMULATORS", "Curve", "CurvePoint", "checkpoint_report", "curve_dir",
           "learning_curve", "plot_curve", "plot_lines", "read_curve", "write_curve"]

SIMULATORS: tuple[str, ...] = ("mujoco", "bcg")

CURVE_COLUMNS: tuple[str, ...] = (
    "iteration", "samples", "wall_time_s",
    *(f"{sim}_{m}" for sim in SIMULATORS for m in ("falls", "episodes", "mean_episode_s", "e_track_cm")))
"""Columns of ``curve.csv``."""


@dataclass(frozen=True)
class CurvePoint:
    """One checkpoint's scores. ``samples``: environment steps trained on; ``wall_time_s``: training wall time [s]
    (both from the run's ``metrics.csv``); per simulator (``mujoco``, ``bcg``): falls and episodes (counts), mean
    episode length [s] and E_track [cm]."""

    iteration: int
    samples: int
    wall_time_s: float
    mujoco_falls: int
    mujoco_episodes: int
    mujoco_mean_episode_s: float
    mujoco_e_track_cm: float
    bcg_falls: int
    bcg_episodes: int
    bcg_mean_episode_s: float
    bcg_e_track_cm: float

    @classmethod
    def from_report(cls, iteration: int, samples: int, wall_time_s: float, report: dict[str, Any]) -> CurvePoint:
        """The point of a checkpoint from its report dict (``TransferReport.to_dict()``)."""
        values: dict[str, Any] = {}
        for sim in SIMULATORS:
            m = report[sim]
            values.update({f"{sim}_falls": int(m["falls"]), f"{sim}_episodes": int(m["episodes"]),
                           f"{sim}_mean_episode_s": float(m["mean_episode_seconds"]),
                           f"{sim}_e_track_cm": float(m["e_track_cm"])})
        return cls(iteration=iteration, samples=samples, wall_time_s=wall_time_s, **values)


def curve_dir(run_dir: Path, motion: str, options: TransferOptions) -> Path:
    """``RUN/eval/curve-CLIP`` with the default transfer options, ``RUN/eval/curve-CLIP-HASH`` otherwise."""
    name = "curve-" + Path(motion).stem
    if options != TransferOptions():
        digest = hashlib.sha256(json.dumps({**options.digest_fields(), "motion": motion}, sort_keys=True).encode())
        name += f"-{digest.hexdigest()[:8]}"
    return run_dir / "eval" / name


def _training_progress(run_dir: Path) -> dict[int, tuple[int, float]]:
    """``{iteration: (samples, wall_time_s)}`` from the run's ``metrics.csv`` (a resumed run's later rows win)."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        raise InputNotFoundError(f"{run_dir} has no metrics.csv (not a run directory of bcg train)")
    out: dict[int, tuple[int, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out[int(row["iteration"])] = (int(float(row["samples"])), float(row["wall_time_s"]))
    return out


def checkpoint_report(checkpoint: Path, motion: str | None, options: Any, *, progress: bool = False
                      ) -> dict[str, Any]:
    """The report dict (``TransferReport.to_dict()``) of one checkpoint replayed in both simulators under ``options``;
    ``motion`` None: the policy's own clip."""
    from bcg.agents.export import ExportedPolicy
    from bcg.agents.train import checkpoint_export
    from bcg.evaluation.evaluate_cli import policy_env_kwargs, policy_motion
    from bcg.evaluation.mujoco_transfer import evaluate_transfer
    from bcg.robots.g1 import MJCF_PATH

    export = checkpoint_export(checkpoint)
    policy = ExportedPolicy(export["meta"], export["tensors"])
    policy.check_mjcf(MJCF_PATH)
    clip = motion if motion is not None else policy_motion(policy.motion)
    report, _ = evaluate_transfer(policy, clip, options, label=str(checkpoint), progress=progress,
                                  env_kwargs=policy_env_kwargs(policy))
    return report.to_dict()


def check_checkpoint_choice(every: int, log_points: int | None) -> None:
    """Refuse a stride or a log-spaced count that chooses no checkpoints, or both at once (:class:`UserError`, one
    line naming the option)."""
    if isinstance(every, bool) or int(every) != every or every < 1:
        raise UserError(f"every must be an integer >= 1, got {every!r}")
    if log_points is None:
        return
    if isinstance(log_points, bool) or int(log_points) != log_points or log_points < 2:
        raise UserError(f"log-points must be an integer >= 2, got {log_points!r}")
    if every != 1:
        raise UserError(f"--every {every} and --log-points {log_points} both choose the checkpoints; give one")


def choose_checkpoints(checkpoints: list[tuple[int, Path]], every: int = 1,
                       log_points: int | None = None) -> list[tuple[int, Path]]:
    """The checkpoints (``(iteration, path)`` in iteration order) a curve scores: every ``every``-th, or, with
    ``log_points``, those nearest (in the logarithm of the iteration) to ``log_points`` iterations spaced evenly in
    its logarithm from the first checkpoint to the last: a constant relative resolution, fine early where a curve
    moves fast and where a run first reaches another's final point, sparse late. The last is always scored."""
    if log_points is None:
        return [c for k, c in enumerate(checkpoints) if k % every == 0 or k == len(checkpoints) - 1]
    logs = [math.log(max(it, 1)) for it, _ in checkpoints]
    lo, hi = logs[0], logs[-1]
    targets = [lo + (hi - lo) * k / max(log_points - 1, 1) for k in range(log_points)]
    picked = {min(range(len(logs)), key=lambda i, t=t: abs(logs[i] - t)) for t in targets}
    return [checkpoints[i] for i in sorted(picked | {len(checkpoints) - 1})]


def learning_curve(run_dir: str | Path, options: Any = None, *, motion: str | None = None, every: int = 1,
                   log_points: int | None = None, progress: bool = True) -> tuple[list[CurvePoint], Path]:
    """Score every ``every``-th checkpoint of a run (or about ``log_points`` of them spaced in the logarithm of the
    iteration, :func:`choose_checkpoints`; the last always) in MuJoCo and our simulator; returns the points in
    iteration order and the output folder (:func:`curve_dir`), where each checkpoint's report is cached as
    ``iter_NNNNNN.json`` and reused by later calls. ``options``: a
    :class:`~bcg.evaluation.transfer_protocol.TransferOptions` (None: ``bcg evaluate``'s default protocol)."""
    from bcg.agents.checkpoint import list_checkpoints

    run = Path(run_dir)
    if not (run / "checkpoints").is_dir():
        raise InputNotFoundError(f"{run} has no checkpoints/ folder (not a run directory of bcg train)")
    check_checkpoint_choice(every, log_points)
    checkpoints = list_checkpoints(run / "checkpoints")
    if not checkpoints:
        raise InputNotFoundError(f"{run / 'checkpoints'} holds no checkpoint yet")
    options = options or TransferOptions()
    chosen = choose_checkpoints(checkpoints, every, log_points)
    progress_of = _training_progress(run)
    clip = motion or json.loads((run / "config.json").read_text())["motion"]  # names the output folder only
    out = curve_dir(run, clip, options)
    out.mkdir(parents=True, exist_ok=True)
    points = []
    bar = _bar(len(chosen), run.name, progress)
    for iteration, path in chosen:
        cache = out / f"iter_{iteration:06d}.json"
        if cache.is_file():
            report = json.loads(cache.read_text())
        else:
            report = checkpoint_report(path, motion, options)
            cache.write_text(json.dumps(report, indent=2) + "\n")
        samples, wall = progress_of.get(iteration, (0, float("nan")))
        points.append(CurvePoint.from_report(iteration, samples, wall, report))
        bar.update(1)
        bar.set_postfix_str(f"it {iteration}: MuJoCo falls {points[-1].mujoco_falls}/{points[-1].mujoco_episodes}, "
                            f"E_track {points[-1].mujoco_e_track_cm:.1f} cm")
    bar.close()
    return points, out


def _bar(total: int, name: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"curve {name[:30]}", unit="ckpt", disable=not enabled, dynamic_ncols=True)


def write_curve(points: list[CurvePoint], path: Path) -> Path:
    """Write ``curve.csv`` (:data:`CURVE_COLUMNS`)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CURVE_COLUMNS)
        for p in points:
            w.writerow([getattr(p, c) for c in CURVE_COLUMNS])
    return path


def read_curve(path: str | Path) -> list[CurvePoint]:
    """The points of a ``curve.csv`` written by :func:`write_curve`."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    types = {c: (int if c in ("iteration", "samples") or c.endswith(("_falls", "_episodes")) else float)
             for c in CURVE_COLUMNS}
    return [CurvePoint(**{c: types[c](float(r[c])) for c in CURVE_COLUMNS}) for r in rows]


MEASURES: tuple[tuple[str, Callable[[CurvePoint, str], float]], ...] = (
    ("fall rate", lambda p, sim: getattr(p, f"{sim}_falls") / max(getattr(p, f"{sim}_episodes"), 1)),
    ("mean episode [s]", lambda p, sim: getattr(p, f"{sim}_mean_episode_s")),
    ("E_track [cm]", lambda p, sim: getattr(p, f"{sim}_e_track_cm")))
"""The plotted measures: (axis label, the value of a point in a simulator, ``mujoco`` or ``bcg``)."""


X_AXES: dict[str, str] = {"samples": "environment samples", "wall_time_s": "training wall time [s]"}
"""The x axes a curve can be drawn against: a :class:`CurvePoint` field and its axis label."""


def plot_lines(ax: Any, label: str, points: list[CurvePoint], xname: str, value: Callable[[CurvePoint, str], float],
               color: str, sims: tuple[str, ...] = SIMULATORS) -> None:
    """One run's curve of one measure on ``ax`` against ``xname`` (a :class:`CurvePoint` field): solid with markers
    for MuJoCo, dashed for our simulator; the legend names the simulator when both are drawn."""
    x = [getattr(p, xname) for p in points]
    for sim in sims:
        name = f"{label} ({'MuJoCo' if sim == 'mujoco' else 'ours'})" if len(sims) > 1 else label
        style = {"marker": "."} if sim == "mujoco" else {"alpha": 0.6}
        ax.plot(x, [value(p, sim) for p in points], "-" if sim == "mujoco" else "--", color=color, label=name,
                **style)


def plot_curve(curves: dict[str, list[CurvePoint]], path: Path, title: str = "") -> Path:
    """One figure of any number of labelled curves: the :data:`MEASURES` against samples (top row) and training
    wall time (bottom row); solid lines MuJoCo, dashed our simulator."""
    from bcg.evaluation.report import pyplot, save_figure, style_axis

    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (xname, xlabel) in enumerate(X_AXES.items()):
        for col, (ylabel, value) in enumerate(MEASURES):
            ax = axes[row][col]
            for k, (label, pts) in enumerate(curves.items()):
                plot_lines(ax, label, pts, xname, value, colors[k % len(colors)])
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            style_axis(ax)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path)


@dataclass(frozen=True)
class Curve:
    """Learning curve of a run in MuJoCo: every checkpoint replayed as by `bcg evaluate` (curve.csv, curve.png)."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory (its checkpoints/ folder)."""
    every: int = 1
    """Score every this many checkpoints (the last one always)."""
    log_points: int | None = None
    """Instead of --every: score about this many checkpoints, spaced evenly in the logarithm of their iteration
    (the first and last always), fine early where a curve moves fast, sparse late."""
    motion: str | None = None
    """Clip to track (packaged name or file); default: the run's own clip."""
    protocol: Annotated[TransferOptions, tyro.conf.OmitArgPrefixes] = TransferOptions()
    """The replay of every checkpoint, as `bcg evaluate`'s: start phases, seeds, episode length, initial joint
    noise, our simulator's kappa."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        check_checkpoint_choice(self.every, self.log_points)

    def run(self) -> int:
        if self.motion is not None:
            from bcg.motion.formats import resolve_motion_path

            resolve_motion_path(self.motion)  # a wrong clip is refused before any replay
        points, out = learning_curve(self.run_dir, self.protocol, motion=self.motion, every=self.every,
                                     log_points=self.log_points, progress=self.progress)
        replacing = (out / "curve.csv").exists()
        csv_path = write_curve(points, out / "curve.csv")
        png = plot_curve({self.run_dir.name: points}, out / "curve.png", title=str(self.run_dir))
        print(f"{'iteration':>9} {'samples':>9} {'time [s]':>8} | MuJoCo falls, episode [s], E_track [cm] | ours")
        for p in points:
            print(f"{p.iteration:>9} {p.samples:>9} {p.wall_time_s:>8.0f} | {p.mujoco_falls}/{p.mujoco_episodes}, "
                  f"{p.mujoco_mean_episode_s:.1f}, {p.mujoco_e_track_cm:.1f} | {p.bcg_falls}/{p.bcg_episodes}, "
                  f"{p.bcg_mean_episode_s:.1f}, {p.bcg_e_track_cm:.1f}")
        print(f"wrote {csv_path} and {png}" + (" (replacing the earlier ones; every scored checkpoint's report is kept "
                                                 "beside them)" if replacing else ""))
        return 0
