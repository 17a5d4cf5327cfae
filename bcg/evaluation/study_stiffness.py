"""``bcg study stiffness`` (paper Q1, docs/method.md §2.1): one method trained at several contact stiffnesses
(default kappa = 50, 100, 300) and seeds through the jobs of :mod:`bcg.evaluation.compare`, each policy replayed in
MuJoCo: falls and Δd per kappa. Writes ``results.json``, ``study_stiffness.png`` (bars: fall rate, Δd, E_track per
kappa) and ``stiffness.md`` with the paper's table beside ours.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bcg.envs.dynamics import Dynamics
from bcg.evaluation.compare import GridOptions
from bcg.evaluation.report import pyplot, save_figure, style_axis

__all__ = ["PAPER_STIFFNESS", "StudyStiffness", "stiffness_markdown", "stiffness_plot", "stiffness_rows"]

PAPER_STIFFNESS: dict[float, dict[str, tuple[str, float]]] = {
    50.0: {"run": ("5/5", 10.6), "jump": ("5/5", 12.6), "fight": ("5/5", 13.3), "dance": ("5/5", 13.5)},
    100.0: {"run": ("5/5", 8.1), "jump": ("4/5", 10.8), "fight": ("3/5", 9.1), "dance": ("4/5", 9.5)},
    300.0: {"run": ("0/5", 3.1), "jump": ("0/5", 3.3), "fight": ("0/5", 3.4), "dance": ("0/5", 2.9)},
}
"""docs/method.md §2.1: SHAC+BCG policies replayed in MuJoCo, 5 runs per kappa: (runs that fell, Δd [mm])."""



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
    runs: tuple[Path, ...] = ()
    """Instead of training: collect these finished run directories (each trained with ``bcg train --kappa K`` and
    replayed with ``bcg evaluate RUN``) into results.json, the plot and stiffness.md. They must share the clip and
    method; kappa and seed come from each run's config."""

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

        if self.runs:
            return self._collect()
        try:
            if not self.kappas or any(not (k > 0 and math.isfinite(k)) for k in self.kappas):
                raise ValueError(f"kappas must be one or more finite values > 0 [1/m], got {list(self.kappas)}")
            shac = (("num_envs", self.shac_num_envs),) if self.shac_num_envs else ()
            ppo = (("num_envs", self.ppo_num_envs),) if self.ppo_num_envs else ()
            jobs = [j for k in self.kappas for j in make_jobs(
                [self.method], [self.motion], self.seeds, self.out / "runs", iterations=self.iterations,
                budget_s=self.budget_s, preset=self.preset, dynamics=Dynamics(kappa=float(k)), shac=shac, ppo=ppo,
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
        cfg = self._plain_config()
        data = {"config": cfg, "results": results}
        (self.out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
        self._write(results, cfg)
        return 1 if any(r.get("error") for r in results) else 0

    def _plain_config(self) -> dict[str, Any]:
        """The options as results.json stores them: through JSON (paths as strings, tuples as lists), so that a report
        rebuilt from results.json (--report-only) reads the same values."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    def _collect(self) -> int:
        from bcg.evaluation.compare import run_result

        try:
            results = sorted((run_result(r) for r in self.runs), key=lambda r: (r["kappa"], r["seed"]))
            kinds = {(r["motion"], r["method"]) for r in results}
            if len(kinds) > 1:
                raise ValueError(f"the runs mix clips or methods: {sorted(kinds)}")
            budgets = {r["seconds"]["train"] for r in results}
        except (FileNotFoundError, ValueError, KeyError) as exc:
            print(f"bcg study stiffness: error: {exc}", file=sys.stderr)
            return 2
        motion, method = kinds.pop()
        cfg = self._plain_config()
        first = json.loads((Path(self.runs[0]) / "config.json").read_text())
        options = results[0]["transfer_options"]
        cfg.update(motion=motion, method=method, kappas=sorted({r["kappa"] for r in results}),
                   seeds=sorted({r["seed"] for r in results}), preset=first.get("preset"),
                   budget_s=budgets.pop() if len(budgets) == 1 else None, iterations=first.get("iterations"),
                   eval_phases=options["phases"], eval_seeds=options["seeds"], eval_seconds=options["seconds"])
        for r in results:
            t = r["transfer"]
            print(f"  kappa {r['kappa']:g} s{r['seed']}: falls {t['falls']}/{t['episodes']}, "
                  f"E_track {t['e_track_cm']:.1f} cm, Δd {t['delta_d_mm']:+.2f} mm ({r['run_dir']})", flush=True)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "results.json").write_text(json.dumps({"config": cfg, "results": results}, indent=1) + "\n")
        self._write(results, cfg)
        return 0

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
    lines += ["", "The paper trains SHAC+BCG for 3000 iterations per kappa (5 runs) on a GPU; the runs here have the "
              "budget above. A policy that falls in MuJoCo at every kappa says the budget was too small, not which "
              "kappa transfers: read the falls beside the episode length and E_track.",
              ""]
    return "\n".join(lines)
