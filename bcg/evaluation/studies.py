"""``bcg study variance`` (paper Q2) and ``bcg study stiffness`` (paper Q1), docs/method.md §3.10 and 2.1.

* :class:`StudyVariance`: the summed per-environment policy-gradient variance V of any set of registered
  estimators (plugins included) on the tracking-policy windows of :mod:`bcg.evaluation.gradient_variance`, for
  every (clip, kappa, window) of the grid, with bootstrap intervals. Writes ``variance.json``, ``study_variance.png``
  (V against the window length per clip and kappa, log scale, the bootstrap interval as a band) and
  ``variance.md``.
* :class:`StudyStiffness`: one method trained at several contact stiffnesses (default kappa = 50, 100, 300) and
  seeds through the jobs of :mod:`bcg.evaluation.compare`, each policy replayed in MuJoCo: falls and Δd per kappa.
  Writes ``results.json``, ``study_stiffness.png`` (bars: fall rate, Δd, E_track per kappa) and ``stiffness.md``
  with the paper's table beside ours.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bcg.evaluation.compare import GridOptions
from bcg.evaluation.report import pyplot, save_figure, style_axis

__all__ = ["PAPER_STIFFNESS", "STUDY_COMMANDS", "CheckpointPolicy", "StudySensitivity", "StudyStiffness",
           "StudyVariance", "branch_sensitivities", "check_estimator_specs", "run_checkpoints", "sensitivity_plot",
           "stiffness_rows", "variance_plot"]

PAPER_STIFFNESS: dict[float, dict[str, tuple[str, float]]] = {
    50.0: {"run": ("5/5", 10.6), "jump": ("5/5", 12.6), "fight": ("5/5", 13.3), "dance": ("5/5", 13.5)},
    100.0: {"run": ("5/5", 8.1), "jump": ("4/5", 10.8), "fight": ("3/5", 9.1), "dance": ("4/5", 9.5)},
    300.0: {"run": ("0/5", 3.1), "jump": ("0/5", 3.3), "fight": ("0/5", 3.4), "dance": ("0/5", 2.9)},
}
"""docs/method.md §2.1: SHAC+BCG policies replayed in MuJoCo, 5 runs per kappa: (runs that fell, Δd [mm])."""


def check_estimator_specs(specs: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless every spec (``name[:key=value,...]``) names a registered estimator (the message
    lists them) that accepts its parameters."""
    from bcg.estimators import ESTIMATORS, parse_spec
    from bcg.evaluation.gradient_variance import make_estimator

    if not specs:
        raise ValueError(f"estimators: at least one is needed; registered: {', '.join(ESTIMATORS)}")
    for s in specs:
        name, _ = parse_spec(s)
        if name not in ESTIMATORS:
            raise ValueError(f"unknown estimator {name!r} (in {s!r}); registered: {', '.join(ESTIMATORS)}")
        try:
            make_estimator(s)
        except TypeError as exc:
            raise ValueError(f"estimator spec {s!r}: {exc}") from None


# -------------------------------------------------------------------------------------------- variance (Q2)


def _write_variance_outputs(data: dict[str, Any], out: Path) -> None:
    """``variance.json``, ``variance.md`` and ``study_variance.png`` of a variance study's ``data`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "variance.json").write_text(json.dumps(data, indent=1) + "\n")
    png = variance_plot(data, out / "study_variance.png")
    md = out / "variance.md"
    md.write_text(variance_markdown(data))
    print(f"wrote {out / 'variance.json'}, {md}, {png}")


@dataclass(frozen=True)
class StudyVariance:
    """Policy-gradient variance (paper Q2): summed per-environment variance V of each estimator, with bootstrap
    intervals, for every clip, contact stiffness and window length; JSON, PNG and Markdown."""

    estimators: tuple[str, ...] = ("bptt", "bcg")
    """Estimator specs, name[:key=value,...] (any registered, plugins included); the first is the reference of the
    ratios."""
    clips: tuple[str, ...] = ("jump",)
    """Clips: run, jump, fight, dance, or motion files (.npz / .csv, as bcg train --motion)."""
    kappas: tuple[float, ...] = (300.0,)
    """Contact stiffnesses [1/m]."""
    windows: tuple[int, ...] = (8, 16, 32)
    """Window lengths T [control steps]."""
    seeds: tuple[int, ...] = (0, 1)
    """Seeds (paired start states and draws across estimators)."""
    num_envs: int = 32
    """E, environments per seed (the paper: 128)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the environments (the paper: 4000)."""
    confidence: float = 0.6827
    """Coverage of the bootstrap interval (0.6827: the +-1 std band of the paper for a normal spread)."""
    theta_std: float = 0.0
    """Standard deviation of the linear residual's parameters (0: the reference-target policy)."""
    zo_rounds: int = 0
    """Antithetic zeroth-order pairs for the direction check (0: none; costs 2 rollouts per pair)."""
    run_dir: tuple[Path, ...] = ()
    """Over training: one or more `bcg train` run directories (e.g. a SHAC run and a SHAC+BCG run); V is measured at
    each run's checkpoints (train with --checkpoint-every) on the trained network, per-environment copies of its
    output layer (clip and kappa: each run's own; --clips and --kappas are then ignored)."""
    checkpoints: int = 5
    """Over training: how many of the run's checkpoints, evenly spaced from the first to the last."""
    out: Path = Path("runs/study_variance")
    """Output folder."""
    device: str = "cpu"
    """Torch / Warp device."""

    def run(self) -> int:
        from bcg.evaluation.gradient_variance import VarianceStudy, run_study, study_dict

        if self.run_dir:
            return self._run_over_training()
        try:
            check_estimator_specs(tuple(self.estimators))
            studies = [VarianceStudy(clip=c, kappa=float(k), num_envs=self.num_envs, window=int(w),
                                     seeds=tuple(self.seeds), theta_std=self.theta_std, bootstrap=self.bootstrap,
                                     confidence=self.confidence, zo_rounds=self.zo_rounds, device=self.device)
                       for c in self.clips for k in self.kappas for w in self.windows]
            if not studies:
                raise ValueError("clips, kappas and windows need one value each at least")
        except ValueError as exc:
            print(f"bcg study variance: error: {exc}", file=sys.stderr)
            return 2
        entries = []
        for st in studies:
            t0 = time.perf_counter()
            ws = run_study(st, tuple(self.estimators))
            entries.append({"study": study_dict(st), "summary": _json_safe(ws.summary),
                            "seconds": time.perf_counter() - t0})
            v = ", ".join(f"{e}: V {ws.summary[e]['V']:.3g}" for e in self.estimators)
            print(f"  {st.clip} kappa {st.kappa:g} T {st.window}: {v} ({entries[-1]['seconds']:.0f} s)", flush=True)
        self.out.mkdir(parents=True, exist_ok=True)
        _write_variance_outputs({"estimators": list(self.estimators), "entries": entries}, self.out)
        return 0


    def _run_over_training(self) -> int:
        from bcg.agents.checkpoint import CheckpointError
        from bcg.agents.export import load_policy
        from bcg.agents.train import export_run
        from bcg.evaluation.evaluate_cli import policy_motion
        from bcg.evaluation.gradient_variance import (
            VarianceStudy,
            estimator_gradients,
            make_estimator,
            make_study_env,
            start_states,
            study_dict,
            summarize,
        )

        try:
            check_estimator_specs(tuple(self.estimators))
            names = [Path(r).name for r in self.run_dir]
            if len(set(names)) != len(names):
                raise ValueError(f"--run-dir: the run directories need distinct names (they label the curves), got "
                                 f"{names}")
            runs_chosen = [(Path(r), run_checkpoints(Path(r), self.checkpoints)) for r in self.run_dir]
        except (ValueError, CheckpointError) as exc:
            print(f"bcg study variance: error: {exc}", file=sys.stderr)
            return 2
        built = {spec: make_estimator(spec) for spec in self.estimators}
        entries, env, made_for, cp = [], None, None, None
        for run_dir, chosen in runs_chosen:
            (self.out / "policies" / run_dir.name).mkdir(parents=True, exist_ok=True)
            for it, ckpt in chosen:
                policy = load_policy(export_run(ckpt, self.out / "policies" / run_dir.name / f"iter_{it:06d}.pt"))
                clip = policy_motion(policy.motion)  # a packaged name, or the run's own file (its hash checked)
                kappa = float(policy.meta.get("env", {}).get("kappa") or 300.0)
                if made_for != (str(clip), kappa):
                    env, made_for = make_study_env(clip, kappa, 2 * self.num_envs, self.device), (str(clip), kappa)
                cp = CheckpointPolicy(policy)
                theta0 = cp.initial_theta(self.num_envs).to(env.device)
                for w in self.windows:
                    st = VarianceStudy(clip=clip, kappa=kappa, num_envs=self.num_envs, window=int(w),
                                       seeds=tuple(self.seeds), bootstrap=self.bootstrap, confidence=self.confidence,
                                       zo_rounds=0, device=self.device)
                    t0 = time.perf_counter()
                    runs: dict[str, dict[int, Any]] = {spec: {} for spec in self.estimators}
                    for seed in st.seeds:
                        start = start_states(env, seed, st.num_envs, st.window)
                        for spec, est in built.items():
                            runs[spec][seed] = estimator_gradients(env, est, cp, theta0, start, st.window, seed)
                    summary = summarize(runs, self.estimators[0], bootstrap=st.bootstrap, confidence=st.confidence)
                    entries.append({"study": study_dict(st) | {"iteration": it, "checkpoint": str(ckpt),
                                                               "run": run_dir.name},
                                    "summary": _json_safe(summary), "seconds": time.perf_counter() - t0})
                    v = ", ".join(f"{e}: V {summary[e]['V']:.3g}" for e in self.estimators)
                    print(f"  {run_dir.name} iteration {it} T {w}: {v} ({entries[-1]['seconds']:.0f} s)", flush=True)
        data = {"estimators": list(self.estimators), "entries": entries, "x": "iteration",
                "run_dirs": [str(r) for r, _ in runs_chosen],
                "parameters": f"output layer ({cp.num_params} parameters)"}
        _write_variance_outputs(data, self.out)
        return 0


def run_checkpoints(run_dir: Path, count: int) -> list[tuple[int, Path]]:
    """``count`` (iteration, checkpoint file) pairs of a run directory, evenly spaced from its first checkpoint to its
    last (all of them when it has fewer). ``ValueError`` when the run has none."""
    from bcg.agents.checkpoint import list_checkpoints

    if count < 1:
        raise ValueError(f"checkpoints must be >= 1, got {count}")
    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        raise ValueError(f"{run_dir} has no checkpoints/iter_*.pt (train it with --checkpoint-every K)")
    idx = sorted({round(i * (len(found) - 1) / max(count - 1, 1)) for i in range(min(count, len(found)))})
    return [found[i] for i in idx]


class CheckpointPolicy:
    """A trained policy as a :class:`~bcg.evaluation.gradient_variance.TrackingPolicy` stand-in: the exported
    network's hidden layers (fixed) and one copy of its output layer per environment, so that one backward pass gives
    every environment's gradient with respect to its own output layer.

    ``actions(env, state, theta)`` -> raw actions [n, A] = ``[h, 1] @ theta[e]`` with h [n, H] the last hidden
    features of the normalised observation and ``theta`` [n, H + 1, A] (weight transposed, then the bias row)."""

    def __init__(self, policy: Any) -> None:
        import torch
        from torch import nn

        layers = list(policy.mean_net)
        last = layers[-1]
        if not isinstance(last, nn.Linear) or last.bias is None:
            raise ValueError(f"the policy network must end with a Linear layer with a bias, got {last}")
        for p in policy.parameters():
            p.requires_grad_(False)
        self.policy = policy
        self.body = nn.Sequential(*layers[:-1])
        self.theta = torch.cat([last.weight.detach().T, last.bias.detach()[None]], 0)  # [H + 1, A]
        self.obs_dim = int(last.in_features)
        self.num_actions = int(last.out_features)
        self.num_params = int(self.theta.numel())

    @property
    def bias_row(self) -> int:
        """Index of the bias row of theta."""
        return self.obs_dim

    def initial_theta(self, n: int) -> Any:
        """[n, H + 1, A] identical copies of the trained output layer."""
        return self.theta[None].repeat(n, 1, 1)

    def actions(self, env: Any, state: Any, theta: Any) -> Any:
        import torch

        h = self.body(self.policy.normalize(env.observe(state)))
        x = torch.cat([h, torch.ones_like(h[:, :1])], 1)
        return torch.einsum("nd,nda->na", x, theta)


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def variance_plot(data: dict[str, Any], path: Path) -> Path:
    """``study_variance.png``: V against the window length T, one panel per (clip, kappa), one line per estimator,
    the bootstrap interval as a band; log y."""
    plt = pyplot()
    over = data.get("x") == "iteration"  # over training: V against the checkpoint's iteration, a panel per window
    key = (lambda e: ("T", e["study"]["window"])) if over else (lambda e: (e["study"]["clip"], e["study"]["kappa"]))
    xk = "iteration" if over else "window"
    panels = list(dict.fromkeys(key(e) for e in data["entries"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        in_panel = [e for e in data["entries"] if key(e) == panel]
        runs = list(dict.fromkeys(e["study"].get("run") for e in in_panel))  # [None] outside over-training
        for r_i, run in enumerate(runs):
            es = sorted((e for e in in_panel if e["study"].get("run") == run), key=lambda e: e["study"][xk])
            t = [e["study"][xk] for e in es]
            for i, name in enumerate(data["estimators"]):
                v = [e["summary"][name]["V"] for e in es]
                lo = [e["summary"][name]["V_ci"][0] for e in es]
                hi = [e["summary"][name]["V_ci"][1] for e in es]
                label = name if run is None or len(runs) == 1 else f"{run}: {name}"
                ax.plot(t, v, marker="o", color=f"C{i}", ls=("-", "--", ":", "-.")[r_i % 4], ms=3, lw=1.2,
                        label=label)
                ax.fill_between(t, lo, hi, color=f"C{i}", alpha=0.2 if len(runs) == 1 else 0.12, lw=0)
                if len(t) == 1:
                    # a percentile bootstrap interval of few environments need not contain the estimate itself
                    ax.errorbar(t, v, yerr=[[max(v[0] - lo[0], 0.0)], [max(hi[0] - v[0], 0.0)]], color=f"C{i}",
                                capsize=3)
        es = in_panel
        ax.set_yscale("log")
        ax.set_xlabel("training iteration" if over else "window T [control steps]", fontsize=8)
        ax.set_ylabel("summed gradient variance V", fontsize=8)
        e0 = es[0]["study"]
        ax.set_title(f"{Path(e0['clip']).stem}, kappa {e0['kappa']:g}" + (f", T {e0['window']}" if over else ""),
                     fontsize=9)
        style_axis(ax)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def variance_markdown(data: dict[str, Any]) -> str:
    """Markdown of the study: one table row per (clip, kappa, T, estimator)."""
    e0 = data["entries"][0]["study"]
    ref = data["estimators"][0]
    lines = ["# Policy-gradient variance (paper Q2)", "",
             f"Summed across-environment variance V of the per-environment policy gradients (docs/method.md §3.10); "
             f"{e0['num_envs']} environments x seeds {e0['seeds']}; interval: bootstrap ({e0['bootstrap']} "
             f"resamples, {e0['confidence']:.0%} coverage); ratio: V / V_{ref} (paired bootstrap).", "",
             "![variance](study_variance.png)", "",
             "| run | clip | kappa | T | iteration | estimator | V | V interval | ratio | ratio interval "
             "| trigger rate | contact force median / p99 [N] | per-env gradient norm: median / max | fell | s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    if data.get("x") == "iteration":
        dirs = data.get("run_dirs") or [data.get("run_dir")]
        lines[2:2] = [f"Over training: the policies of {', '.join(map(str, dirs))} at their checkpoints; V over the "
                      f"{data['parameters']}, the hidden layers fixed.", ""]

    def g(x: Any) -> str:
        return "–" if x is None else f"{x:.3g}"

    for e in data["entries"]:
        st = e["study"]
        for name in data["estimators"]:
            s = e["summary"][name]
            norms = s.get("grad_norm_q50_q90_max") or [None, None, None]
            force = s.get("peak_force_q50_q90_q99_max") or [None, None, None, None]
            lines.append(f"| {st.get('run', '–')} | {Path(st['clip']).stem} | {st['kappa']:g} | {st['window']} | "
                         f"{st.get('iteration', '–')} | {name} | {g(s['V'])} | "
                         f"[{g(s['V_ci'][0])}, {g(s['V_ci'][1])}] | {g(s['ratio'])} | [{g(s['ratio_ci'][0])}, "
                         f"{g(s['ratio_ci'][1])}] | {g(s['trigger_rate'])} | {g(force[0])} / {g(force[2])} | "
                         f"{g(norms[0])} / {g(norms[2])} | "
                         f"{g(s['fell'])} | {g(s['seconds'])} |")
    lines += ["", "The paper (docs/method.md §3.10) plots V in training, SHAC (bptt) and SHAC+BCG, jump clip, "
              "128 environments and a +-1 std band over 4000 bootstrap resamples; "
              + ("this study measures V at the run's checkpoints, over the output layer only (the full network's "
                 "per-environment gradients do not fit a CPU's bootstrap)." if data.get("x") == "iteration" else
                 "this study measures V at a fixed tracking policy (gradient_variance.TrackingPolicy), not along a "
                 "training run (--run-dir RUN does that)."), ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- stiffness (Q1)


@dataclass(frozen=True)
class StudyStiffness(GridOptions):
    """Stiffness ablation (paper Q1): train one method at each contact stiffness kappa and seed, replay every policy
    in MuJoCo; falls and Δd per kappa (bar plots, Markdown, the paper's table beside ours)."""

    method: str = "shac:bcg"
    """The method trained (ppo or shac:ESTIMATOR[:key=value,...])."""
    kappas: tuple[float, ...] = (50.0, 100.0, 300.0)
    """Contact stiffnesses of training [1/m]."""
    motion: str = "jump"
    """Clip."""
    seeds: tuple[int, ...] = (0,)
    """Training seeds (the paper: 5 runs per kappa)."""
    out: Path = Path("runs/study_stiffness")
    """Output folder: runs/, results.json, stiffness.md, study_stiffness.png."""
    report_only: bool = False
    """Rebuild stiffness.md and the plot from OUT/results.json without training."""

    def run(self) -> int:
        from bcg.evaluation.compare import make_jobs, run_jobs

        if self.report_only:
            path = self.out / "results.json"
            if not path.is_file():
                print(f"bcg study stiffness: error: {path} not found (run the study first)", file=sys.stderr)
                return 2
            data = json.loads(path.read_text())
            self._write(data["results"], data["config"])
            return 0

        try:
            if not self.kappas or any(not (k > 0 and math.isfinite(k)) for k in self.kappas):
                raise ValueError(f"kappas must be one or more finite values > 0 [1/m], got {list(self.kappas)}")
            shac = (("num_envs", self.shac_num_envs),) if self.shac_num_envs else ()
            ppo = (("num_envs", self.ppo_num_envs),) if self.ppo_num_envs else ()
            jobs = [j for k in self.kappas for j in make_jobs(
                [self.method], [self.motion], self.seeds, self.out / "runs", iterations=self.iterations,
                budget_s=self.budget_s, preset=self.preset, kappa=float(k), shac=shac, ppo=ppo,
                eval_phases=self.eval_phases, eval_seeds=tuple(self.eval_seeds), eval_seconds=self.eval_seconds)]
        except ValueError as exc:
            print(f"bcg study stiffness: error: {exc}", file=sys.stderr)
            return 2
        workers = self.workers or max(1, min(len(jobs), os.cpu_count() or 1))
        print(f"bcg study stiffness: {len(jobs)} jobs ({self.method} on {self.motion}, kappa "
              f"{', '.join(f'{k:g}' for k in self.kappas)}, seeds {list(self.seeds)})", flush=True)
        def on_done(r: dict[str, Any]) -> None:
            t = r.get("transfer") or {}
            d, e = t.get("delta_d_mm"), t.get("e_track_cm")
            what = r["error"] or (f"falls {t.get('falls')}/{t.get('episodes')}, unstable {t.get('unstable')}, "
                                  f"Δd {math.nan if d is None else d:+.2f} mm, "
                                  f"E_track {math.nan if e is None else e:.1f} cm")
            print(f"  kappa {r['kappa']:g} s{r['seed']}: {what}", flush=True)

        results = run_jobs(jobs, workers=workers, ray_address=self.ray_address, on_done=on_done)
        self.out.mkdir(parents=True, exist_ok=True)
        # through JSON, so that a report rebuilt from results.json (--report-only) reads the same values (lists)
        cfg = json.loads(json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                     for k, v in dataclasses.asdict(self).items()}))
        data = {"config": cfg, "results": results}
        (self.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
        self._write(results, cfg)
        return 1 if any(r.get("error") for r in results) else 0

    def _write(self, results: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
        rows = stiffness_rows(results)
        png = stiffness_plot(rows, self.out / "study_stiffness.png")
        md = self.out / "stiffness.md"
        md.write_text(stiffness_markdown(rows, cfg["motion"], cfg["method"], cfg))
        print(f"wrote {self.out / 'results.json'}, {md}, {png}")


def stiffness_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kappa of the finished jobs: runs with at least one fall / runs, episodes that fell / episodes,
    Δd (mean, std over runs) [mm], E_track in MuJoCo (mean, std) [cm]."""
    rows = []
    for k in dict.fromkeys(r["kappa"] for r in results):
        tr = [r["transfer"] for r in results if r["kappa"] == k and r.get("transfer")]
        if not tr:
            continue
        d = np.array([t["delta_d_mm"] if t["delta_d_mm"] is not None else math.nan for t in tr])
        e = np.array([t["e_track_cm"] if t["e_track_cm"] is not None else math.nan for t in tr])
        rows.append({"kappa": k, "runs": len(tr), "runs_fell": sum(t["falls"] > 0 for t in tr),
                     "falls": sum(t["falls"] for t in tr), "episodes": sum(t["episodes"] for t in tr),
                     "unstable": sum(t.get("unstable", 0) for t in tr),
                     "episode_s": float(np.mean([t["mean_episode_seconds"] for t in tr])),
                     "delta_d_mm": float(np.nanmean(d)), "delta_d_std": float(np.nanstd(d)),
                     "e_track_cm": float(np.nanmean(e)), "e_track_std": float(np.nanstd(e))})
    return rows


def stiffness_plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """``study_stiffness.png``: bars per kappa of the fall rate (episodes), Δd and E_track in MuJoCo."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.0))
    x = np.arange(len(rows))
    names = [f"{r['kappa']:g}" for r in rows]
    axes[0].bar(x, [r["falls"] / max(r["episodes"], 1) for r in rows], color="C3")
    axes[0].set_ylim(0, 1.05)
    axes[0].set_ylabel("fall rate in MuJoCo (episodes)", fontsize=8)
    axes[1].bar(x, [r["delta_d_mm"] for r in rows], yerr=[r["delta_d_std"] for r in rows], color="C0", capsize=3)
    axes[1].set_ylabel("Δd = pen. bcg - MuJoCo [mm]", fontsize=8)
    axes[2].bar(x, [r["e_track_cm"] for r in rows], yerr=[r["e_track_std"] for r in rows], color="C2", capsize=3)
    axes[2].set_ylabel("E_track in MuJoCo [cm]", fontsize=8)
    for ax in axes:
        ax.set_xticks(x, names)
        ax.set_xlabel("kappa [1/m]", fontsize=8)
        style_axis(ax, "y")
    return save_figure(fig, path)


def stiffness_markdown(rows: list[dict[str, Any]], motion: str, method: str, cfg: dict[str, Any]) -> str:
    """Markdown of the ablation: our table and the paper's (docs/method.md §2.1) for the clip."""
    clip = Path(motion).stem
    budget = f"{cfg['budget_s']:g} s" if cfg.get("budget_s") else f"{cfg['iterations']} iterations"
    lines = ["# Stiffness ablation (paper Q1)", "",
             f"`{method}` on `{clip}`, preset `{cfg['preset']}`, {budget} per run, seeds {cfg['seeds']}; each policy "
             f"replayed in MuJoCo ({cfg['eval_phases']} phases x seeds {cfg['eval_seeds']}, at most "
             f"{cfg['eval_seconds'] or 'the clip'} s). Unstable: episodes ended by the instability guard (not falls); "
             "episode: mean episode length in MuJoCo. Δd: mean foot penetration in our simulator (at the training "
             "kappa) minus MuJoCo on the same replay.", "",
             "![stiffness](study_stiffness.png)", "",
             "| kappa [1/m] | runs with a fall | episodes that fell | unstable | episode [s] | Δd [mm] "
             "| E_track MuJoCo [cm] | paper: falls / Δd [mm] |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p = PAPER_STIFFNESS.get(float(r["kappa"]), {}).get(clip)
        paper = f"{p[0]} / {p[1]:.1f}" if p else "–"
        lines.append(f"| {r['kappa']:g} | {r['runs_fell']}/{r['runs']} | {r['falls']}/{r['episodes']} | "
                     f"{r['unstable']}/{r['episodes']} | {r['episode_s']:.2f} | "
                     f"{r['delta_d_mm']:+.2f} +- {r['delta_d_std']:.2f} | {r['e_track_cm']:.1f} +- "
                     f"{r['e_track_std']:.1f} | {paper} |")
    lines += ["", "The paper trains SHAC+BCG for 3000 iterations per kappa (5 runs); a CPU-sized run trains "
              "minutes, so its falls measure barely trained policies and Δd mostly the contact model's penetration at "
              "each kappa.",
              ""]
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- sensitivity picture


@dataclass(frozen=True)
class StudySensitivity:
    """Branch versus bundle (contact-local averaging, docs/method.md §3.10): per-branch sensitivities of the future
    vertical pelvis velocity to the pelvis height, dv_z(t+T)/dp_z(t), against their mean, and a PCA of the branches'
    full state-gradient vectors with a 95 % ellipse; one panel pair per kappa."""

    clip: str = "jump"
    """Clip: run, jump, fight, dance, or a motion file (as bcg train --motion)."""
    kappas: tuple[float, ...] = (50.0, 300.0)
    """Contact stiffnesses [1/m] (one row of panels each)."""
    branches: int = 64
    """B, perturbed branches from the start state."""
    window: int = 8
    """T, control steps from the perturbation to the velocity measured."""
    sigma_q: float = 0.02
    """Standard deviation of the hinge-angle perturbation [rad] (the bcg estimator's joint_gaussian law)."""
    sigma_qd: float = 0.05
    """Standard deviation of the hinge-rate perturbation [rad/s]."""
    frame: int | None = None
    """Start frame (control step) of the window (None: window // 2 steps before the first touchdown after a flight
    phase of the clip, so that the window spans the landing; a clip without flight: frame 0)."""
    seed: int = 0
    """Seed of the perturbations."""
    out: Path = Path("runs/study_sensitivity")
    """Output folder: sensitivity.json, study_sensitivity.png, sensitivity.md."""

    def run(self) -> int:
        if self.branches < 3 or self.window < 1 or not self.kappas:
            print(f"bcg study sensitivity: error: need branches >= 3, window >= 1 and one kappa at least, got "
                  f"{self.branches}, {self.window}, {list(self.kappas)}", file=sys.stderr)
            return 2
        entries = [branch_sensitivities(self.clip, float(k), self.branches, self.window, self.sigma_q,
                                        self.sigma_qd, self.seed, self.frame) for k in self.kappas]
        self.out.mkdir(parents=True, exist_ok=True)
        data = {"clip": self.clip, "frame": entries[0]["frame"], "branches": self.branches, "window": self.window,
                "sigma_q": self.sigma_q,
                "sigma_qd": self.sigma_qd, "seed": self.seed,
                "entries": [{k: v for k, v in e.items() if k != "grads"} for e in entries]}
        (self.out / "sensitivity.json").write_text(json.dumps(_json_safe(data), indent=1) + "\n")
        png = sensitivity_plot(entries, self.out / "study_sensitivity.png", self.window)
        lines = ["# Branch versus bundle sensitivity", "",
                 f"`{self.clip}` from frame {entries[0]['frame']}, {self.branches} branches perturbed at t (hinges "
                 f"N(0, {self.sigma_q:g}^2) rad, "
                 f"rates N(0, {self.sigma_qd:g}^2) rad/s), each differentiated through T = {self.window} steps of the "
                 "reference-target policy; s = dv_z(t+T)/dp_z(t) [1/s]. The bundle's (first-order smoothed) "
                 "gradient is the branches' mean. Gradient spread: RMS distance of the branches' full state-gradient "
                 "vectors d v_z(t+T) / d(q, qd) from their mean.", "", "![sensitivity](study_sensitivity.png)", "",
                 "| kappa | nominal s | bundle mean s | branch std | branch min | branch max | gradient spread "
                 "| PC1 share |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for e in entries:
            lines.append(f"| {e['kappa']:g} | {e['nominal']:.3g} | {e['mean']:.3g} | {e['std']:.3g} | "
                         f"{min(e['branch']):.3g} | {max(e['branch']):.3g} | {e['spread']:.3g} | "
                         f"{e['pc_share'][0]:.2f} |")
        (self.out / "sensitivity.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines[-len(entries) - 2:]))
        print(f"wrote {self.out / 'sensitivity.json'}, {self.out / 'sensitivity.md'}, {png}")
        return 0


def touchdown_frame(motion: Any, min_flight: int = 3) -> int | None:
    """The first frame with a foot in contact after at least ``min_flight`` frames with neither (the landing of the
    first flight phase; a lone contact-free frame is not a flight). Jump: frame 45 (flight 26-44)."""
    contact = np.asarray(motion.foot_contact()).any(1)
    run = 0
    for i, c in enumerate(contact):
        if c and run >= min_flight:
            return i
        run = 0 if c else run + 1
    return None


def branch_sensitivities(clip: str, kappa: float, branches: int, window: int, sigma_q: float, sigma_qd: float,
                         seed: int, frame: int | None = None) -> dict[str, Any]:
    """Per-branch gradients of v_z(t+T) (root linear z velocity, world frame) with respect to the start state.

    The reference pose and velocity at ``frame`` (None: ``window // 2`` before :func:`touchdown_frame`; the start
    rule of the transfer replay, :func:`bcg.evaluation.mujoco_transfer.start_state`), its nominal row plus
    ``branches`` rows with joint-Gaussian hinge offsets (the estimators' ``joint_gaussian_offsets``, clamped to the
    joint limits), rolled out with the reference-target policy (the variance study's TrackingPolicy at theta = 0)
    through ``env.transition`` with autograd. Returns ``kappa``, ``nominal`` and ``branch`` (list [B]) of
    s = dv_z(t+T)/dp_z(t) [1/s], their ``mean`` and ``std``, ``grads`` [B, 71] (d v_z / d(q, qd)), and the PCA of
    the gradient vectors: ``pc`` [B, 2] projections, ``pc_share`` (variance shares of the first two components)."""
    import torch

    from bcg.estimators.grs import joint_gaussian_offsets
    from bcg.evaluation.gradient_variance import TrackingPolicy, make_study_env, observation_normaliser
    from bcg.evaluation.mujoco_transfer import start_state

    env = make_study_env(clip, kappa, 8)
    mean, std = observation_normaliser(env)
    policy = TrackingPolicy(env, mean, std)
    if frame is None:
        td = touchdown_frame(env.motion)
        frame = max(0, td - window // 2) if td is not None else 0
    if not 0 <= frame < env.num_frames - window - 1:
        raise ValueError(f"frame must leave {window} steps before the clip's end, got {frame}")
    start = start_state(env, torch.full((env.num_envs,), int(frame))).map(lambda t: t[:1])
    gen = torch.Generator().manual_seed(int(seed))
    dq, dqd = joint_gaussian_offsets(env.model, start.q, start.qd, branches, sigma_q, sigma_qd, False, gen)
    s = start.repeat_interleave(branches + 1)
    q, qd = s.q.detach().clone(), s.qd.detach().clone()
    q[1:, 7:] += dq[0].to(q)
    qd[1:, 6:] += dqd[0].to(qd)
    q.requires_grad_(True)
    qd.requires_grad_(True)
    s = dataclasses.replace(s, q=q, qd=qd)
    theta = policy.initial_theta(branches + 1, device=env.device)
    for _ in range(window):
        s, *_ = env.transition(s, policy.actions(env, s, theta))
    gq, gqd = torch.autograd.grad(s.qd[:, 2].sum(), (q, qd))  # rows are independent: row r's own gradient
    grads = torch.cat([gq, gqd], 1).double()
    sens = grads[:, 2]  # d v_z(t+T) / d p_z(t)
    g = grads[1:]
    centred = g - g.mean(0)
    _, sv, vt = torch.linalg.svd(centred, full_matrices=False)
    share = (sv**2 / (sv**2).sum()).tolist()
    return {"kappa": kappa, "nominal": float(sens[0]), "branch": sens[1:].tolist(), "mean": float(sens[1:].mean()),
            "std": float(sens[1:].std()), "grads": g,
            "spread": float(centred.pow(2).sum(1).mean().sqrt()), "pc": (centred @ vt[:2].T).tolist(),
            "nominal_pc": ((grads[0] - g.mean(0)) @ vt[:2].T).tolist(), "pc_share": share[:2],
            "frame": int(frame)}


def sensitivity_plot(entries: list[dict[str, Any]], path: Path, window: int) -> Path:
    """``study_sensitivity.png``: per kappa, the branch sensitivities (dots) with their mean (the bundle, a line) and
    the nominal row (a cross); and the branches' state-gradient vectors on their first two principal components with
    the 95 % ellipse of a normal fit."""
    plt = pyplot()
    fig, axes = plt.subplots(len(entries), 2, figsize=(9, 3.0 * len(entries)), squeeze=False)
    for row, e in zip(axes, entries):
        b = np.array(e["branch"])
        ax = row[0]
        ax.plot(np.arange(len(b)), b, "o", ms=3, color="C0", alpha=0.7, label="branches")
        ax.axhline(e["mean"], color="C3", lw=1.5, label=f"bundle mean {e['mean']:.3g}")
        ax.plot([-2], [e["nominal"]], "kx", ms=7, label=f"nominal {e['nominal']:.3g}")
        ax.set_xlabel("branch", fontsize=8)
        ax.set_ylabel(f"dv_z(t+{window}) / dp_z(t) [1/s]", fontsize=8)
        ax.set_title(f"kappa {e['kappa']:g}: per-branch sensitivities", fontsize=9)
        ax.legend(fontsize=7)
        ax = row[1]
        pc = np.array(e["pc"])
        ax.plot(pc[:, 0], pc[:, 1], "o", ms=3, color="C0", alpha=0.7)
        ax.plot([0], [0], "o", color="C3", ms=6, label="bundle mean")
        ax.plot([e["nominal_pc"][0]], [e["nominal_pc"][1]], "kx", ms=7, label="nominal")
        cov = np.cov(pc.T)
        w, v = np.linalg.eigh(cov)
        t = np.linspace(0, 2 * np.pi, 200)
        ell = (v @ (np.sqrt(np.maximum(w, 0) * 5.991)[:, None] * np.stack([np.cos(t), np.sin(t)])))
        ax.plot(ell[0], ell[1], color="C3", lw=1, label="95 % ellipse")
        ax.set_xlabel(f"PC1 ({e['pc_share'][0]:.0%})", fontsize=8)
        ax.set_ylabel(f"PC2 ({e['pc_share'][1]:.0%})", fontsize=8)
        ax.set_title(f"kappa {e['kappa']:g}: state-gradient vectors d v_z / d(q, qd)", fontsize=9)
        ax.legend(fontsize=7)
        for a in row:
            style_axis(a)
    return save_figure(fig, path)


STUDY_COMMANDS: dict[str, type] = {"variance": StudyVariance, "stiffness": StudyStiffness,
                                   "sensitivity": StudySensitivity}
"""``bcg study ...`` subcommands."""
