"""``bcg study methods`` (paper Q3 and Q4): SHAC+BCG, SHAC and PPO compared on finished runs, in MuJoCo.

Input: run directories trained with ``bcg train`` and replayed with ``bcg evaluate RUN`` (8 episodes through the
whole clip), ideally with their learning curve in MuJoCo (``bcg curve RUN``: every k-th checkpoint replayed the same
way); runs kept in ``benchmarks/results`` (``config.json``, ``metrics.csv``, ``eval_CLIP.json``,
``curve_CLIP.csv``) work as well.

* **Q4, tracking after transfer**: per clip and method, falls, mean episode length and E_track in MuJoCo (mean and
  standard deviation over seeds) and E_track in our simulator, beside the paper's E_track. A policy that falls early
  averages its error over its easiest seconds, so the episode length stands beside every E_track.
* **Q3, samples against PPO**: the target is PPO's final MuJoCo point on the clip (the mean over PPO's seeds of its
  E_track and of its mean episode length, at its final number of samples). A run *reaches* it at the first
  checkpoint of its curve whose E_track is at or below the target's **and** whose mean episode is at least as long
  (it stays up as long, or longer, and tracks as well); the ratio is PPO's samples over the run's samples there.
  Since PPO's final point can be worse than its middle, a second table takes every checkpoint of PPO's curves at least
  as good as its run's final point as a target in turn and keeps the one each run gains least against
  (:func:`hardest_rows`).

Writes ``results.json``, ``methods.md``, ``study_methods.png`` (per clip: fall rate, mean episode and E_track in
MuJoCo against samples, PPO's final point as a star, each run's reaching checkpoint as a circle) and
``study_methods_wall_time.png`` (the same against training wall time).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcg.evaluation.learning_curve import X_AXES, CurvePoint, read_curve
from bcg.evaluation.report import PAPER_E_TRACK, pyplot, save_figure, style_axis

__all__ = ["MethodRun", "StudyMethods", "hardest_rows", "methods_markdown", "methods_plot", "read_runs",
           "samples_rows", "transfer_rows"]

ORDER: tuple[str, ...] = ("SHAC+BCG", "SHAC (bptt)", "PPO")
"""Methods in the order tables and plots show them (others after them, by name)."""


@dataclass(frozen=True)
class MethodRun:
    """One finished run: ``label`` (``SHAC+BCG``, ``SHAC (bptt)``, ``PPO``, ...), ``clip``, ``seed``, ``samples``
    trained on, its final replay in MuJoCo (``falls`` of ``episodes``, ``episode_s`` [s], ``e_track_cm``) and in our
    simulator (``bcg_e_track_cm``), and its curve in MuJoCo (empty without ``bcg curve``)."""

    name: str
    label: str
    clip: str
    seed: int
    samples: int
    falls: int
    episodes: int
    episode_s: float
    e_track_cm: float
    bcg_e_track_cm: float
    curve: tuple[CurvePoint, ...]
    wall_time_s: float = math.nan
    """Training wall time [s] at the end of the run."""
    iterations: int = 0
    """Training iterations the run completed (the last row of its metrics)."""
    settings: tuple[tuple[str, Any], ...] = ()
    """The run's training config, flattened (``shac.horizon``, ``estimator.tau``, ...), without the fields that do
    not change what it computes (seed, paths, threads, progress); runs of one method that differ here are labelled
    apart (:func:`label_by_settings`)."""


def _curve_file(run: Path, clip: str) -> Path | None:
    for path in (run / "eval" / f"curve-{clip}" / "curve.csv", run / f"curve_{clip}.csv"):
        if path.is_file():
            return path
    return None


def read_runs(dirs: Sequence[str | Path]) -> list[MethodRun]:
    """The runs of ``dirs`` (see the module docstring); raises a one-line ``FileNotFoundError`` / ``ValueError`` for a
    folder that is not a finished, evaluated run."""
    from bcg.evaluation.compare import run_result

    out = []
    for d in dirs:
        run = Path(d)
        res = run_result(run)
        tr = res["transfer"]
        metrics = res["curve"]  # metrics.csv's columns
        curve_path = _curve_file(run, res["motion"])
        cfg = json.loads((run / "config.json").read_text())
        out.append(MethodRun(
            name=run.name, label=res["label"], clip=res["motion"], seed=res["seed"],
            samples=int(_last(metrics, "samples", 0)),
            falls=int(tr["falls"]), episodes=int(tr["episodes"]), episode_s=float(tr["mean_episode_seconds"]),
            e_track_cm=_float(tr["e_track_cm"]), bcg_e_track_cm=_float(tr["bcg_e_track_cm"]),
            curve=tuple(read_curve(curve_path)) if curve_path else (),
            wall_time_s=_last(metrics, "wall_time_s", math.nan),
            iterations=int(_last(metrics, "iteration", 0)),
            settings=_settings(cfg)))
    return label_by_settings(out)


def _float(x: float | None) -> float:
    """A result's number (None: not finite, as the results write NaN) as a float."""
    return math.nan if x is None else float(x)


def _last(columns: dict[str, list[float | None]], name: str, default: float) -> float:
    """The last value of column ``name`` of a run's metrics, or ``default`` when it has none."""
    values = columns.get(name) or [None]
    return default if values[-1] is None else float(values[-1])


_NOT_SETTINGS = frozenset({"seed", "motion", "estimator.seed"})
"""Config fields that tell runs of one setting apart (seeds and the clip) rather than the setting itself."""


def _settings(cfg: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``config.json`` as flat ``(key, value)`` pairs, read the way ``bcg train`` reads it (a run written before a
    field existed gets the value it ran with), without run-control and recorded fields (the budget is kept)."""
    from bcg.agents.train_config import RECORDED_FIELDS, RUN_CONTROL_FIELDS, config_from_dict, config_to_dict
    from bcg.envs.config import FLAT_GROUPS

    skip = (set(RUN_CONTROL_FIELDS) - {"iterations", "max_time_s"}) | set(RECORDED_FIELDS) | _NOT_SETTINGS
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():  # the flat-flag groups' fields by their flag names (kappa, adaptive_start)
                walk(prefix if not prefix and k in FLAT_GROUPS else f"{prefix}{k}.", v)
        else:
            flat[prefix[:-1]] = tuple(value) if isinstance(value, list) else value

    walk("", config_to_dict(config_from_dict(cfg)))
    return tuple(sorted((k, v) for k, v in flat.items() if k not in skip))


_BUDGET_FIELDS = ("iterations", "max_time_s")
"""The settings that say when training stops; two runs that completed the same iterations had the same budget
whichever way it was written (``--iterations 3251`` against a ``--max-time-s 3600`` run that stopped there)."""


def _requested_budget(settings: dict[str, Any]) -> str:
    """How a run's budget was asked for (``max_time_s=3600.0``, ``iterations=3251``)."""
    asked = [f"{k}={settings[k]}" for k in _BUDGET_FIELDS if settings.get(k) is not None]
    return ", ".join(asked) or "iterations=default"


def _budget_classes(runs: Sequence[MethodRun]) -> list[int]:
    """For each run, the index of its budget class: runs asked for the same budget, or that completed the same
    number of iterations, share one (transitively)."""
    parent = list(range(len(runs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    asked = [_requested_budget(dict(r.settings)) for r in runs]
    for i in range(len(runs)):
        for j in range(i):
            same_done = runs[i].iterations > 0 and runs[i].iterations == runs[j].iterations
            if asked[i] == asked[j] or same_done:
                parent[root(i)] = root(j)
    return [root(i) for i in range(len(runs))]


def label_by_settings(runs: Sequence[MethodRun]) -> list[MethodRun]:
    """``runs`` with the labels of runs of one clip and method that differ in their settings extended by the
    differences (``SHAC+BCG [adaptive_start_credit=start]``), so that tables never average unlike runs. Budgets
    count as different only between runs that neither asked for the same one nor completed the same iterations
    (:func:`_budget_classes`); such a label names every way its class's budget was asked for
    (``PPO [iterations=3251 / max_time_s=3600.0]``)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault((r.clip, r.label), []).append(i)
    out = list(runs)
    for idx in groups.values():
        dicts = [dict(runs[i].settings) for i in idx]
        keys = sorted({k for d in dicts for k in d
                       if k not in _BUDGET_FIELDS and len({repr(e.get(k)) for e in dicts}) > 1})
        classes = _budget_classes([runs[i] for i in idx])
        asked: dict[int, set[str]] = {}
        for c, d in zip(classes, dicts, strict=True):
            asked.setdefault(c, set()).add(_requested_budget(d))
        for i, d, c in zip(idx, dicts, classes, strict=True):
            parts = [f"{k}={d.get(k)}" for k in keys] + ([" / ".join(sorted(asked[c]))] if len(asked) > 1 else [])
            if parts:
                out[i] = dataclasses.replace(runs[i], label=f"{runs[i].label} [{', '.join(parts)}]")
    return out


def _grouped(runs: Sequence[MethodRun]) -> dict[str, dict[str, list[MethodRun]]]:
    """``{clip: {label: runs}}`` with the clips and methods in display order."""
    clips: dict[str, dict[str, list[MethodRun]]] = {}
    for r in runs:
        clips.setdefault(r.clip, {}).setdefault(r.label, []).append(r)
    return {c: {m: sorted(clips[c][m], key=lambda r: r.seed) for m in sorted(clips[c], key=_method_key)}
            for c in sorted(clips, key=_clip_key)}


def _clip_key(clip: str) -> tuple[int, str]:
    """The packaged clips in the paper's order, then the user's clips by name."""
    order = ("run", "jump", "fight", "dance")
    return (order.index(clip) if clip in order else len(order), clip)


def _base(label: str) -> str:
    """The method of a label (``SHAC+BCG [tau=300]`` -> ``SHAC+BCG``)."""
    return label.split(" [", 1)[0]


def _method_key(label: str) -> tuple[int, str]:
    base = _base(label)
    return (ORDER.index(base) if base in ORDER else len(ORDER), label)


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def transfer_rows(runs: Sequence[MethodRun]) -> list[dict[str, Any]]:
    """Q4: one row per clip and method: seeds, falls of episodes, mean episode [s] and E_track in MuJoCo [cm] (mean
    and std over seeds), E_track in our simulator, mean samples, and the paper's E_track where it has one."""
    rows = []
    for clip, methods in _grouped(runs).items():
        for label, rs in methods.items():
            e, e_sd = _mean_std([r.e_track_cm for r in rs])
            ep, ep_sd = _mean_std([r.episode_s for r in rs])
            paper = PAPER_E_TRACK.get(clip, {}).get(_base(label))
            rows.append({"clip": clip, "method": label, "seeds": [r.seed for r in rs], "runs": [r.name for r in rs],
                         "falls": sum(r.falls for r in rs), "episodes": sum(r.episodes for r in rs),
                         "episode_s": ep, "episode_std": ep_sd, "e_track_cm": e, "e_track_std": e_sd,
                         "bcg_e_track_cm": _mean_std([r.bcg_e_track_cm for r in rs])[0],
                         "samples": statistics.fmean(r.samples for r in rs),
                         "paper_e_track_cm": None if paper is None else paper[0]})
    return rows


def at_least_as_good(point: CurvePoint, e_track_cm: float, episode_s: float) -> bool:
    """Whether ``point`` tracks at least as well in MuJoCo (E_track at or below ``e_track_cm``) and stays up at least
    as long (mean episode at least ``episode_s``): the reaching rule of Q3."""
    return point.mujoco_e_track_cm <= e_track_cm and point.mujoco_mean_episode_s >= episode_s


def first_reaching(curve: Sequence[CurvePoint], e_track_cm: float, episode_s: float) -> CurvePoint | None:
    """The first point of ``curve`` (in training order) :func:`at_least_as_good` as ``e_track_cm`` and
    ``episode_s``; None when no checkpoint is."""
    return next((p for p in sorted(curve, key=lambda p: p.samples) if at_least_as_good(p, e_track_cm, episode_s)),
                None)


def scored_before(curve: Sequence[CurvePoint], point: CurvePoint) -> CurvePoint | None:
    """The point of ``curve`` scored last before ``point`` (None for the first): the unscored checkpoints between the
    two may have reached the target first, so the reaching point is known only within that stretch."""
    earlier = [p for p in curve if p.samples < point.samples]
    return max(earlier, key=lambda p: p.samples) if earlier else None


def _baseline_and_others(methods: dict[str, list[MethodRun]],
                         baseline: str) -> tuple[list[MethodRun], list[tuple[str, MethodRun]]]:
    """One clip's runs split into ``baseline``'s and the others (with their labels), both in table order."""
    base = [r for label, rs in methods.items() if _base(label) == baseline for r in rs]
    others = [(label, r) for label, rs in methods.items() if _base(label) != baseline for r in rs]
    return base, others


def samples_rows(runs: Sequence[MethodRun], baseline: str = "PPO") -> list[dict[str, Any]]:
    """Q3: per clip with a ``baseline`` run, the target (its final E_track, mean episode and samples, means over its
    seeds) and per other run the samples of its first checkpoint that reaches it (:func:`first_reaching`), the ratio
    baseline samples / those samples (None where not reached or without a curve), and the samples of the point scored
    before it with the ratio there (``ratio_at_most``: the largest the ratio can be had an unscored checkpoint in
    between reached the target; None when the reaching point is the curve's first)."""
    rows = []
    for clip, methods in _grouped(runs).items():
        base, others = _baseline_and_others(methods, baseline)
        if not base:
            continue
        target_e = statistics.fmean(r.e_track_cm for r in base)
        target_ep = statistics.fmean(r.episode_s for r in base)
        target_samples = statistics.fmean(r.samples for r in base)
        for label, r in others:
            hit = first_reaching(r.curve, target_e, target_ep) if r.curve else None
            before = scored_before(r.curve, hit) if hit is not None else None
            rows.append({"clip": clip, "method": label, "run": r.name, "seed": r.seed,
                         "target_e_track_cm": target_e, "target_episode_s": target_ep,
                         "baseline_samples": target_samples, "has_curve": bool(r.curve),
                         "samples": None if hit is None else hit.samples,
                         "wall_time_s": None if hit is None else hit.wall_time_s,
                         "ratio": None if hit is None else target_samples / max(hit.samples, 1),
                         "samples_before": None if before is None else before.samples,
                         "ratio_at_most": None if before is None else target_samples / max(before.samples, 1)})
    return rows


def hardest_rows(runs: Sequence[MethodRun], baseline: str = "PPO") -> list[dict[str, Any]]:
    """Q3 against every checkpoint of ``baseline``'s curves at least as good as its run's final point, not only the
    final one (a policy-gradient run's last point can be worse than its middle, so it may have reached that level with
    far fewer samples): per clip and other run with a curve, each scored checkpoint ``c`` of a baseline run ``b``
    whose MuJoCo E_track is at most ``b``'s final one and whose mean episode is at least ``b``'s final one is a target
    (its E_track and mean episode), with ratio ``c.samples`` over the run's samples at its first checkpoint reaching
    ``c`` (:func:`first_reaching`). The row keeps the target with the smallest ratio (the baseline's point the run
    gains least against) and counts the targets the run reached (``reached`` of ``checkpoints``; one it never reached
    would make the worst case worse than the ratio shown)."""
    rows = []
    for clip, methods in _grouped(runs).items():
        base, others = _baseline_and_others(methods, baseline)
        targets = [(b, p) for b in base for p in b.curve if at_least_as_good(p, b.e_track_cm, b.episode_s)]
        if not targets:
            continue
        for label, r in others:
            if not r.curve:
                continue
            scored = []
            for b, c in targets:
                hit = first_reaching(r.curve, c.mujoco_e_track_cm, c.mujoco_mean_episode_s)
                if hit is not None:
                    scored.append((c.samples / max(hit.samples, 1), b, c, hit))
            row: dict[str, Any] = {"clip": clip, "method": label, "run": r.name, "seed": r.seed,
                                   "checkpoints": len(targets), "reached": len(scored), "baseline_run": None,
                                   "baseline_iteration": None, "target_e_track_cm": None, "target_episode_s": None,
                                   "baseline_samples": None, "samples": None, "ratio": None}
            if scored:
                ratio, b, c, hit = min(scored, key=lambda t: t[0])
                row.update(baseline_run=b.name, baseline_iteration=c.iteration,
                           target_e_track_cm=c.mujoco_e_track_cm, target_episode_s=c.mujoco_mean_episode_s,
                           baseline_samples=c.samples, samples=hit.samples, ratio=ratio)
            rows.append(row)
    return rows


PLOT_ROWS: tuple[tuple[str, str, str], ...] = (
    ("fall rate in MuJoCo", "fall_rate", "fall_rate"),
    ("mean episode in MuJoCo [s]", "mujoco_mean_episode_s", "episode_s"),
    ("E_track in MuJoCo [cm]", "mujoco_e_track_cm", "e_track_cm"),
)
"""Rows of :func:`methods_plot`: (axis label, CurvePoint attribute, MethodRun attribute)."""


def _value(obj: Any, attr: str) -> float:
    if attr == "fall_rate":  # CurvePoint or MethodRun
        falls, episodes = ((obj.mujoco_falls, obj.mujoco_episodes) if isinstance(obj, CurvePoint)
                           else (obj.falls, obj.episodes))
        return falls / max(episodes, 1)
    return float(getattr(obj, attr))


def methods_plot(runs: Sequence[MethodRun], samples: Sequence[dict[str, Any]], path: Path,
                 baseline: str = "PPO", x: str = "samples") -> Path:
    """``study_methods.png``: per clip (columns), fall rate, mean episode and E_track in MuJoCo (rows) against
    ``x`` (``samples``, log scale, or ``wall_time_s``); one line per run, colour per method, seed 0 solid and others
    dashed; the baseline's final point a star (its mean a dotted line), each run's reaching checkpoint a circle."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {sorted(X_AXES)}, got {x!r}")
    plt = pyplot()
    grouped = _grouped(runs)
    clips = [c for c, ms in grouped.items() if any(r.curve for rs in ms.values() for r in rs)]
    if not clips:
        raise ValueError("no run has a learning curve in MuJoCo: run `bcg curve RUN` first")
    fig, axes = plt.subplots(len(PLOT_ROWS), len(clips), figsize=(4.2 * len(clips), 8.0), squeeze=False)
    labels = sorted({r.label for r in runs}, key=_method_key)
    color = {m: f"C{i}" for i, m in enumerate(labels)}
    color.setdefault(baseline, f"C{len(labels)}")
    hits = {(s["clip"], s["run"]): s for s in samples if s["samples"] is not None}
    for col, clip in enumerate(clips):
        column = [axes[row][col] for row in range(len(PLOT_ROWS))]
        for label, rs in grouped[clip].items():
            for k, r in enumerate(rs):
                pts = sorted(r.curve, key=lambda p: p.samples)
                if not pts:
                    continue
                hit = hits.get((clip, r.name))
                for ax, (_, attr, _) in zip(column, PLOT_ROWS, strict=True):
                    ax.plot([getattr(p, x) for p in pts], [_value(p, attr) for p in pts], color=color[label],
                            lw=1.0, alpha=0.85, ls="-" if k == 0 else "--", label=f"{label} s{r.seed}")
                    if hit is not None:
                        p = next(p for p in pts if p.samples == hit["samples"])
                        ax.plot([getattr(p, x)], [_value(p, attr)], "o", color=color[label], ms=5)
        base = [r for label, rs in grouped[clip].items() if _base(label) == baseline for r in rs]
        for ax, (ylabel, _, attr) in zip(column, PLOT_ROWS, strict=True):
            for r in base:
                ax.plot([getattr(r, x)], [_value(r, attr)], "*", color=color[r.label], ms=11)
            if base:
                ax.axhline(statistics.fmean(_value(r, attr) for r in base), color=color[baseline], lw=0.7, ls=":")
            ax.set_ylabel(ylabel, fontsize=8)
            if x == "samples":
                ax.set_xscale("log")
            style_axis(ax)
        column[0].set_title(clip, fontsize=9)
        column[-1].set_xlabel(X_AXES[x], fontsize=8)
        column[0].legend(fontsize=6)
    return save_figure(fig, path)


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None or not math.isfinite(x) else format(x, fmt)


def _m(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x / 1e6:.2f} M"


def methods_markdown(transfer: Sequence[dict[str, Any]], samples: Sequence[dict[str, Any]],
                     figure: str | None = "study_methods.png", baseline: str = "PPO",
                     hardest: Sequence[dict[str, Any]] = ()) -> str:
    """Markdown of the tables: Q4 first, then Q3 against ``baseline``'s final point, then (with ``hardest``,
    :func:`hardest_rows`) Q3 against the baseline's checkpoint each run gains least against."""
    lines = ["# SHAC+BCG, SHAC and PPO in MuJoCo (paper Q3 and Q4)", "",
             "Each run's final policy replayed in MuJoCo with `bcg evaluate`'s protocol (8 episodes through the whole "
             "clip). Means over seeds, ± the standard deviation where there are several.", "",
             "## Tracking after transfer (Q4)", "",
             "| clip | method | seeds | falls | mean episode [s] | E_track MuJoCo [cm] | E_track ours [cm] | samples "
             "| paper's E_track [cm] |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in transfer:
        sd = f" ± {r['e_track_std']:.1f}" if len(r["seeds"]) > 1 else ""
        lines.append(f"| {r['clip']} | {r['method']} | {len(r['seeds'])} | {r['falls']} of {r['episodes']} | "
                     f"{_f(r['episode_s'])} | {_f(r['e_track_cm'])}{sd} | {_f(r['bcg_e_track_cm'])} | "
                     f"{_m(r['samples'])} | {_f(r['paper_e_track_cm'])} |")
    lines += ["", f"## Samples to reach {baseline}'s final point (Q3)", "",
              f"Target: {baseline}'s final E_track in MuJoCo and its mean episode length (means over its seeds). A run "
              "reaches it at its first checkpoint (of `bcg curve`) that tracks at least as well and stays up at least "
              f"as long; ratio: {baseline}'s samples over the run's samples there (the paper, against PPO: more than "
              "10x for SHAC+BCG). "
              "Samples count every simulated environment step of training, a bundle's branches included. `bcg curve` "
              "scores a subset of the checkpoints, so an unscored one after the point scored before the reaching one "
              "may have reached the target first: the ratio lies between the last two columns.", "",
              f"| clip | method | run | target: E_track [cm], episode [s] | {baseline}'s samples | samples to reach | "
              "wall time [s] | scored before | ratio | at most |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in samples:
        reach = _m(r["samples"]) if r["samples"] is not None else ("no curve" if not r["has_curve"] else
                                                                   "not reached")
        lines.append(f"| {r['clip']} | {r['method']} | {r['run']} | {_f(r['target_e_track_cm'])}, "
                     f"{_f(r['target_episode_s'], '.2f')} | {_m(r['baseline_samples'])} | {reach} | "
                     f"{_f(r['wall_time_s'], '.0f')} | {_m(r['samples_before'])} | {_f(r['ratio'])} | "
                     f"{_f(r['ratio_at_most'])} |")
    if not samples:
        lines.append(f"| – | no clip has a {baseline} run among the runs given | | | | | | |")
    if hardest:
        lines += ["", f"## Samples to reach any of {baseline}'s checkpoints (Q3, worst case)", "",
                  f"Every checkpoint of {baseline}'s curves (all seeds) that tracks at least as well as its run's "
                  "final point and stands at least as long is a target in turn, with the same reaching rule; the "
                  f"row shows the one the run gains least against: its ratio ({baseline}'s samples at that "
                  "checkpoint over the run's samples to reach it) is the smallest over the targets the run reached. "
                  f"It guards against a {baseline} run whose final point is worse than its middle (it got there "
                  "with fewer samples). \"reached\" counts the targets the run reached at all; one it never reached "
                  "would make the worst case worse than the ratio shown.", "",
                  f"| clip | method | run | reached | hardest target: {baseline} run, iteration | E_track [cm], "
                  f"episode [s] | {baseline}'s samples there | samples to reach | ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in hardest:
            where = "–" if r["baseline_run"] is None else f"{r['baseline_run']}, {r['baseline_iteration']}"
            lines.append(f"| {r['clip']} | {r['method']} | {r['run']} | {r['reached']} of {r['checkpoints']} | "
                         f"{where} | {_f(r['target_e_track_cm'])}, {_f(r['target_episode_s'], '.2f')} | "
                         f"{_m(r['baseline_samples'])} | {_m(r['samples'])} | {_f(r['ratio'])} |")
    if figure:
        lines += ["", f"![Fall rate, mean episode and E_track in MuJoCo against samples]({figure})",
                  "", f"Against training wall time: [{figure.replace('.png', '_wall_time.png')}]"
                  f"({figure.replace('.png', '_wall_time.png')})"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class StudyMethods:
    """SHAC+BCG, SHAC and PPO compared on finished runs in MuJoCo (paper Q3 and Q4): tracking after transfer per clip
    and method, and the samples each run needs to reach PPO's final point (tables, JSON, a figure)."""

    runs: tuple[Path, ...] = ()
    """Finished run directories (``bcg train`` then ``bcg evaluate RUN``; ``bcg curve RUN`` for Q3), any clips and
    methods."""
    out: Path = Path("runs/study_methods")
    """Output folder: results.json, methods.md, study_methods.png, study_methods_wall_time.png."""
    baseline: str = "PPO"
    """The method whose final point the others must reach (Q3)."""

    def run(self) -> int:
        from bcg.errors import UserError

        if not self.runs:
            raise UserError("bcg study methods needs --runs RUN [RUN ...] (finished, evaluated runs)")
        try:
            runs = read_runs(self.runs)
        except (FileNotFoundError, ValueError, KeyError) as exc:
            raise UserError(str(exc)) from None
        transfer, samples = transfer_rows(runs), samples_rows(runs, self.baseline)
        hardest = hardest_rows(runs, self.baseline)
        if (self.out / "results.json").exists():  # a rebuild from the runs: say that it replaces the earlier one
            print(f"[study methods] replacing the earlier results in {self.out}")
        self.out.mkdir(parents=True, exist_ok=True)
        figure = None
        if any(r.curve for r in runs):
            methods_plot(runs, samples, self.out / "study_methods.png", self.baseline)
            methods_plot(runs, samples, self.out / "study_methods_wall_time.png", self.baseline, x="wall_time_s")
            figure = "study_methods.png"
        (self.out / "results.json").write_text(json.dumps({"transfer": transfer, "samples": samples,
                                                           "hardest": hardest}, indent=1))
        (self.out / "methods.md").write_text(methods_markdown(transfer, samples, figure, self.baseline, hardest))
        print(f"[study methods] {len(runs)} runs -> {self.out / 'methods.md'}")
        return 0
