"""``bcg study variance`` (paper Q2, docs/method.md §3.10): the summed per-environment policy-gradient variance V of
any set of registered estimators (plugins included), with bootstrap intervals.

On the tracking-policy windows of :mod:`bcg.evaluation.gradient_variance`, for every (clip, kappa, window) of a grid,
or over training at the checkpoints of one or more ``bcg train`` runs. Writes ``variance.json``,
``study_variance.png`` (log scale, the bootstrap interval as a band) and ``variance.md``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcg.envs.dynamics import Dynamics
from bcg.evaluation.report import pyplot, save_figure, style_axis
from bcg.sim import ContactParams

__all__ = ["CheckpointPolicy", "StudyVariance", "check_estimator_specs", "policy_gradients", "policy_sources",
           "policy_study_env", "run_checkpoints", "variance_markdown", "variance_plot"]


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
    kappas: tuple[float, ...] = (ContactParams.kappa,)
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
    output layer, the policy acting through its own action map (clip and kappa: each run's own; --clips and --kappas
    are then ignored). A policy file (`bcg export`'s, or a run's policy.pt) counts as a run of one checkpoint
    (iteration 0)."""
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
            studies = [VarianceStudy(clip=c, dynamics=Dynamics(kappa=float(k)), num_envs=self.num_envs, window=int(w),
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
        from bcg.evaluation.gradient_variance import VarianceStudy, make_estimator, study_dict, summarize

        try:
            check_estimator_specs(tuple(self.estimators))
            names = [run_label(Path(r)) for r in self.run_dir]
            if len(set(names)) != len(names):
                raise ValueError(f"--run-dir: the run directories need distinct names (they label the curves), got "
                                 f"{names}")
            runs_chosen = [(Path(r), policy_sources(Path(r), self.checkpoints)) for r in self.run_dir]
        except (ValueError, CheckpointError) as exc:
            print(f"bcg study variance: error: {exc}", file=sys.stderr)
            return 2
        built = {spec: make_estimator(spec) for spec in self.estimators}
        entries, env, made_for, cp = [], None, None, None
        for run_dir, chosen in runs_chosen:
            label = run_label(run_dir)
            for it, ckpt in chosen:
                if run_dir.is_file():
                    policy = load_policy(run_dir)
                else:
                    (self.out / "policies" / run_dir.name).mkdir(parents=True, exist_ok=True)
                    policy = load_policy(export_run(ckpt, self.out / "policies" / run_dir.name / f"iter_{it:06d}.pt"))
                # the checkpoints of a run share clip, kappa and action map: the env (and the clip's hash check) once
                key = (repr(policy.meta.get("motion")), repr(policy.meta.get("env")), policy.action_offset,
                       policy.action_scale.tolist())
                if made_for != key:
                    (env, clip, kappa), made_for = policy_study_env(policy, 2 * self.num_envs, self.device), key
                cp = CheckpointPolicy(policy)
                for w in self.windows:
                    st = VarianceStudy(clip=clip, dynamics=Dynamics(kappa=kappa), num_envs=self.num_envs, window=int(w),
                                       seeds=tuple(self.seeds), bootstrap=self.bootstrap, confidence=self.confidence,
                                       zo_rounds=0, device=self.device)
                    t0 = time.perf_counter()
                    runs = policy_gradients(env, built, cp, st)
                    summary = summarize(runs, self.estimators[0], bootstrap=st.bootstrap, confidence=st.confidence)
                    entries.append({"study": study_dict(st) | {"iteration": it, "checkpoint": str(ckpt),
                                                               "run": label, "action_offset": env.action_offset},
                                    "summary": _json_safe(summary), "seconds": time.perf_counter() - t0})
                    v = ", ".join(f"{e}: V {summary[e]['V']:.3g}" for e in self.estimators)
                    print(f"  {label} iteration {it} T {w}: {v} ({entries[-1]['seconds']:.0f} s)", flush=True)
        data = {"estimators": list(self.estimators), "entries": entries, "x": "iteration",
                "run_dirs": [str(r) for r, _ in runs_chosen],
                "parameters": f"output layer ({cp.num_params} parameters)"}
        _write_variance_outputs(data, self.out)
        return 0


def policy_study_env(policy: Any, num_envs: int, device: str = "cpu") -> tuple[Any, str, float]:
    """``(env, clip, kappa)``: the differentiable env a trained ``policy`` (an exported policy,
    :func:`bcg.agents.export.load_policy`) is studied on, with ``num_envs`` rows: its clip (a packaged name, or its
    file with the hash checked), its kappa [1/m], and the action map and dynamics it was trained with, as ``bcg
    evaluate`` replays it. The action map matters: a policy trained on residuals around the reference, read through
    the env's default map (offsets from the default pose), sends other targets and falls."""
    from bcg.evaluation.evaluate_cli import policy_env_kwargs, policy_motion
    from bcg.evaluation.gradient_variance import make_study_env

    clip = policy_motion(policy.motion)
    kappa = policy_kappa(policy)
    return make_study_env(clip, kappa, num_envs, device, **policy_env_kwargs(policy)), clip, kappa


def policy_kappa(policy: Any) -> float:
    """The contact stiffness [1/m] an exported ``policy`` was trained at (the simulator's default when unrecorded)."""
    return float(policy.meta.get("env", {}).get("kappa") or ContactParams.kappa)


def policy_gradients(env: Any, estimators: dict[str, Any], policy: CheckpointPolicy, study: Any
                     ) -> dict[str, dict[int, Any]]:
    """The window-return gradients of a trained ``policy`` under each estimator (spec -> built estimator), per seed of
    ``study`` (a :class:`~bcg.evaluation.gradient_variance.VarianceStudy`: its ``num_envs`` start states per seed, its
    window), for :func:`~bcg.evaluation.gradient_variance.summarize`: ``{spec: {seed: EstimatorRun}}``, each run's
    ``grads`` [num_envs, P] with respect to every environment's own copy of the output layer (P parameters).
    ``env`` holds at least ``2 num_envs`` environments (a bundle's rows come from them)."""
    from bcg.evaluation.gradient_variance import estimator_gradients, start_states

    theta0 = policy.initial_theta(study.num_envs).to(env.device)
    runs: dict[str, dict[int, Any]] = {spec: {} for spec in estimators}
    for seed in study.seeds:
        start = start_states(env, seed, study.num_envs, study.window)
        for spec, est in estimators.items():
            runs[spec][seed] = estimator_gradients(env, est, policy, theta0, start, study.window, seed)
    return runs


def run_label(run: Path) -> str:
    """How a study names a run: its directory's name; a run's own ``policy.pt`` by its run directory's name; any other
    policy file by its file name."""
    return run.parent.name if run.name == "policy.pt" and run.parent.name else run.name


def require_policy_source(run: Path) -> None:
    """Refuse a ``run`` path that does not exist (:class:`~bcg.errors.InputNotFoundError`, saying what the studies take
    there: a ``bcg train`` run directory or a policy file)."""
    from bcg.errors import InputNotFoundError

    if not run.exists():
        raise InputNotFoundError(f"{run} does not exist: expected a bcg train run directory or a policy file")


def policy_sources(run: Path, count: int) -> list[tuple[int, Path]]:
    """The (iteration, file) pairs a study measures for ``run``: ``count`` of a run directory's checkpoints
    (:func:`run_checkpoints`), or a policy file itself as iteration 0 (read here, so that a file that is not a policy
    is refused before anything is measured: :class:`~bcg.agents.export.PolicyFileError`)."""
    from bcg.agents.export import load_policy

    require_policy_source(run)
    if run.is_file():
        load_policy(run)
        return [(0, run)]
    return run_checkpoints(run, count)


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
        names = ", ".join(map(str, dirs))
        where = (f"At the policy {names}" if all(str(d).endswith(".pt") for d in dirs)
                 else f"Over training: the policies of {names} at their checkpoints")
        lines[2:2] = [f"{where}; V over the {data['parameters']}, the hidden layers fixed.", ""]

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
