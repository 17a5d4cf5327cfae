"""Gradient estimators side by side (issue 9): policy-gradient variance, direction and cost, as ratios to ``bptt``.

For every clip, contact stiffness kappa and window length T: E environments per seed start from the same states for
every estimator (``env.reset(seed)``), a fixed tracking policy (the reference targets plus a linear residual,
:mod:`bcg.evaluation.gradient_variance`) is rolled out for T steps with each estimator as the env's transition
function, and one backward pass gives every environment's own policy gradient. Printed and written as JSON per
estimator, as ratios to the first estimator (``bptt``) of the same run: wall-clock of forward + backward, peak
resident-memory increase, trigger rate, rows simulated per environment-step, the summed per-environment variance V
with its bootstrap interval (paired by seed), V / |mean g|^2, the cosine between the mean gradients of different
seeds, and the cosine to a zeroth-order reference of the smoothed return's gradient (bias row of the residual).
The plot shows the variance ratios with their bootstrap intervals per clip, kappa and window.

    python benchmarks/estimators.py --quick                      # a small version (a few minutes)
    python benchmarks/estimators.py                              # the issue's sizes (64 envs, T = 8 16 32)
    python benchmarks/estimators.py --estimators bptt bcg bcg:aggregation=per_foot bcg:trigger=always
    python benchmarks/estimators.py --perturb-scale              # joint offsets of the Cartesian law on clip states

An estimator is a registered name (plugins included) with optional parameters, ``name:key=value,key=value``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro


@dataclass(frozen=True)
class Options:
    """Sizes and outputs of the estimator benchmark."""

    clips: tuple[str, ...] = ("jump", "run")
    """Reference clips: packaged names or motion files (as bcg train --motion)."""
    kappas: tuple[float, ...] = (300.0, 50.0)
    """Contact stiffnesses [1/m]."""
    windows: tuple[int, ...] = (8, 16, 32)
    """Window lengths T [control steps]."""
    num_envs: int = 64
    """E, environments per seed."""
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    """Seeds (start states and estimator draws, paired across estimators)."""
    estimators: tuple[str, ...] = ("bptt", "grs", "bcg")
    """Estimator specs ``name[:key=value,...]``; the first is the reference of the ratios."""
    theta_std: float = 0.0
    """Standard deviation of the residual's initial parameters (0: the reference-target policy)."""
    shared_start: bool = False
    """Diagnostic: all environments of a seed start from one state plus N(0, start_jitter^2) hinge offsets, so that V
    measures the gradient's sensitivity to tiny state changes rather than its spread over clip phases."""
    start_jitter: float = 1e-3
    """Hinge-angle jitter of ``--shared-start`` [rad]."""
    zo_rounds: int = 8
    """Antithetic zeroth-order pairs per environment and seed (0: no reference direction)."""
    zo_sigma: float = 0.02
    """Perturbation scale of the zeroth-order reference on the bias row (action units)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the environments."""
    threads: int = 1
    """Torch CPU threads."""
    device: str = "cpu"
    """Torch / Warp device."""
    quick: bool = False
    """A small version: jump only, kappa 300, T = 8 and 16, 16 environments, 2 seeds, 2 zeroth-order rounds."""
    perturb_scale: bool = False
    """Instead of the variance study: the distribution of the Cartesian law's joint offsets on the clips' stance
    states, for several dampings (``--dampings``)."""
    dampings: tuple[float, ...] = (1e-4, 1e-3, 4e-3, 1e-2)
    """Dampings lambda [m^2] of the ``--perturb-scale`` table."""
    inputs: tuple[Path, ...] = ()
    """Measure nothing: read the results of earlier runs' JSON files (e.g. one per window length), print their
    tables and the goal, and plot them together."""
    out: Path = Path("out/estimators.json")
    """JSON of the results."""
    plot: Path | None = Path("docs/img/estimator_variance.png")
    """PNG of the variance ratios (None: no plot)."""


def _quick(o: Options) -> Options:
    import dataclasses

    return dataclasses.replace(o, clips=("jump",), kappas=(300.0,), windows=(8, 16), num_envs=16, seeds=(0, 1),
                               zo_rounds=2, bootstrap=300)


def _fmt_ci(x: float, ci: list[float]) -> str:
    return f"{x:7.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def print_table(key: str, summary: dict) -> None:
    print(f"\n== {key}")
    print(f"{'estimator':32s} {'V/V_ref [90% CI]':>26s} {'V':>10s} {'V/|g|^2':>8s} {'cons':>6s} {'cos_zo':>7s} "
          f"{'trig':>6s} {'rows':>6s} {'time':>6s} {'mem':>6s} {'fell':>5s}")
    for label, r in summary.items():
        print(f"{label:32s} {_fmt_ci(r['ratio'], r['ratio_ci']):>26s} {r['V']:10.3g} {r['rel_var']:8.2f} "
              f"{r['consistency']:6.3f} {r.get('cos_zo', math.nan):7.3f} {r['trigger_rate']:6.3f} "
              f"{r['rows_per_step']:6.2f} {r['time_ratio']:6.2f} {r['mem_ratio']:6.2f} {r['fell']:5.2f}")
    ref = next(iter(summary.values()))
    if "zo_split_cos" in ref:
        print(f"zeroth-order reference: {ref['zo_samples']} antithetic samples, cosine between its halves "
              f"{ref['zo_split_cos']:.3f}")


def goal(results: list[dict], name: str = "bcg") -> list[str]:
    """Lines saying, per kappa-300 configuration, whether ``name`` cut V at least 3x at most 2.5x bptt's time."""
    lines = []
    for r in results:
        s = r["summary"].get(name)
        if s is None or r["kappa"] != 300.0:
            continue
        met = s["ratio_ci"][1] <= 1 / 3 and s["time_ratio"] <= 2.5
        lines.append(f"{r['clip']} kappa {r['kappa']:g} T {r['window']}: V ratio {s['ratio']:.3f} "
                     f"(upper bound {s['ratio_ci'][1]:.3f}, goal <= 0.333), time {s['time_ratio']:.2f}x (goal <= 2.5): "
                     f"{'met' if met else 'NOT met'}")
    return lines


def plot(results: list[dict], path: Path, reference: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["clip"], r["kappa"]) for r in results}, key=lambda x: (x[0], -x[1]))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.8), sharey=True, squeeze=False)
    labels = list(dict.fromkeys(k for r in results for k in r["summary"] if k != reference))
    width = 0.8 / max(len(labels), 1)
    for ax, (clip, kappa) in zip(axes[0], groups, strict=True):
        rows = sorted((r for r in results if r["clip"] == clip and r["kappa"] == kappa), key=lambda r: r["window"])
        xs = range(len(rows))
        for i, label in enumerate(labels):
            have = [(x, r["summary"][label]) for x, r in zip(xs, rows, strict=True) if label in r["summary"]]
            if not have:
                continue
            y = [s["ratio"] for _, s in have]
            lo = [s["ratio"] - s["ratio_ci"][0] for _, s in have]
            hi = [s["ratio_ci"][1] - s["ratio"] for _, s in have]
            ax.bar([x + (i - (len(labels) - 1) / 2) * width for x, _ in have], y, width, yerr=[lo, hi], capsize=3,
                   label=label if (clip, kappa) == groups[0] else None, color=f"C{i}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(1 / 3, color="tab:red", lw=0.8, ls="--", label="goal (1/3)" if (clip, kappa) == groups[0] else None)
        ax.set_xticks(list(xs), [f"T={r['window']}" for r in rows])
        ax.set_title(f"{clip}, kappa {kappa:g}")
    top = max((r["summary"][k]["ratio_ci"][1] for r in results for k in labels if k in r["summary"]), default=1.0)
    axes[0][0].set_ylim(0, max(1.25, 1.05 * top))  # shared by all panels
    axes[0][0].set_ylabel(f"V / V_{reference} (90 % bootstrap interval)")
    fig.suptitle(f"summed per-env policy-gradient variance / {reference}'s", fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(fontsize=8, loc="lower center", ncol=len(labels) + 1, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def perturb_scale(o: Options) -> dict:
    """The ``--perturb-scale`` table: Cartesian-law joint offsets on every frame's stance legs of each clip."""
    from bcg.envs.vector_env import G1TrackingVectorEnv
    from bcg.estimators.perturb import stance_offset_statistics

    out: dict = {}
    for clip in o.clips:
        env = G1TrackingVectorEnv(1, clip)
        qpos = torch.as_tensor(env.motion.qpos, dtype=torch.float32)
        for lam in o.dampings:
            s = stance_offset_statistics(env.model, qpos, damping=lam)
            out[f"{clip} lambda={lam:g}"] = s
            print(f"{clip:5s} lambda {lam:7.0e}: stance {s['stance_fraction']:.2f}, knee q05 {s['knee_q05']:.2f} rad, "
                  f"sigma_min q05 {s['sigma_min_q05']:.3f} m/rad | branch max|dq| q50 {s['branch_max_q50']:.3f} "
                  f"q95 {s['branch_max_q95']:.3f} q99 {s['branch_max_q99']:.3f} max {s['branch_max_max']:.3f} | "
                  f"joint std max {s['joint_std_max']:.3f} rms {s['joint_std_rms']:.3f} | capped "
                  f"{s['capped']:.3f} | kept {s['kept_displacement']:.3f}")
    return out


def main(o: Options) -> None:
    from tqdm import tqdm

    from bcg.envs.dynamics import Dynamics
    from bcg.evaluation.gradient_variance import VarianceStudy, make_estimator, make_study_env, run_study, study_dict

    torch.set_num_threads(o.threads)
    if o.perturb_scale:
        res = perturb_scale(o)
        o.out.parent.mkdir(parents=True, exist_ok=True)
        o.out.write_text(json.dumps({"options": repr(o), "perturb_scale": res}, indent=1))
        print(f"wrote {o.out}")
        return
    if o.inputs:
        results = [r for path in o.inputs for r in json.loads(Path(path).read_text())["results"]]
        results.sort(key=lambda r: (r["clip"], -r["kappa"], r["window"]))
        for r in results:
            print_table(f"{r['clip']} kappa={r['kappa']:g} T={r['window']}", r["summary"])
        report(results, o)
        return
    if o.quick:
        o = _quick(o)
    for spec in o.estimators:
        make_estimator(spec)  # fail before the long loop on a bad name or parameter
    per_config = len(o.seeds) * (len(o.estimators) + (1 if o.zo_rounds else 0))
    bar = tqdm(total=len(o.clips) * len(o.kappas) * len(o.windows) * per_config, file=sys.stderr)
    results: list[dict] = []
    t_start = time.time()
    for clip in o.clips:
        for kappa in o.kappas:
            env = make_study_env(clip, kappa, 2 * o.num_envs, o.device)
            # warm-up: kernels, kinematics caches and the allocator, so that the first timed run is not slower
            run_study(VarianceStudy(clip=clip, dynamics=Dynamics(kappa=kappa), num_envs=o.num_envs, window=2,
                                    seeds=(o.seeds[0],), zo_rounds=0, bootstrap=10, device=o.device),
                      o.estimators, env=env)
            for window in o.windows:
                study = VarianceStudy(clip=clip, dynamics=Dynamics(kappa=kappa), num_envs=o.num_envs, window=window,
                                      seeds=o.seeds, theta_std=o.theta_std, shared_start=o.shared_start,
                                      start_jitter=o.start_jitter, bootstrap=o.bootstrap, zo_sigma=o.zo_sigma,
                                      zo_rounds=o.zo_rounds, device=o.device)

                def progress(msg: str, _c=clip, _k=kappa, _w=window) -> None:
                    bar.set_description(f"{_c} k{_k:g} T{_w} {msg}")
                    bar.update(1)

                ws = run_study(study, o.estimators, env=env, progress=progress)
                key = f"{clip} kappa={kappa:g} T={window}"
                tqdm.write(f"{key}: done")
                print_table(key, ws.summary)
                results.append({"clip": clip, "kappa": kappa, "window": window, "study": study_dict(study),
                                "summary": ws.summary})
                o.out.parent.mkdir(parents=True, exist_ok=True)
                o.out.write_text(json.dumps({"options": repr(o), "results": results,
                                             "seconds": time.time() - t_start}, indent=1))
    bar.close()
    print(f"\nwrote {o.out} ({time.time() - t_start:.0f} s)")
    report(results, o)


def report(results: list[dict], o: Options) -> None:
    """The goal lines and the plot of ``results``."""
    lines = goal(results)
    if lines:
        print("goal (bcg: V at least 3x lower, time at most 2.5x bptt, kappa 300):")
        for line in lines:
            print("  " + line)
    if o.plot is not None:
        plot(results, o.plot, next(iter(results[0]["summary"])))


if __name__ == "__main__":
    main(tyro.cli(Options))
