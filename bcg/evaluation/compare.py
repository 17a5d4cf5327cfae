"""``bcg compare``: head-to-head of training methods on clips and seeds (paper Q3/Q4, docs/method.md §3.10).

One independent **job** per (method, motion, seed): train with ``bcg.agents.train.train`` (its own run directory
under ``OUT/runs``), then replay the exported policy in C MuJoCo and in our simulator
(``bcg.evaluation.mujoco_transfer.evaluate_transfer``). A job is described by a :class:`Job` (plain, picklable
values only) and :func:`run_job` returns a small JSON-able dict: the learning curve (samples, wall-clock, tracking
error per iteration) and the transfer metrics, so that results are gathered the same way whether the jobs ran
in-process, in local worker processes (``concurrent.futures.ProcessPoolExecutor``, spawn context) or as Ray tasks
on a cluster (:func:`run_jobs`). The report (learning curves, transfer table, samples to reach PPO's error,
``OUT/report.md``) is :mod:`bcg.evaluation.report`.

A **method** is ``ppo`` or ``shac:ESTIMATOR`` with any registered estimator (plugins included), optionally with
parameters: ``shac:bcg:tau=200,branches=8`` (the spec syntax of
:func:`bcg.estimators.parse_spec`); ``shac`` alone is ``shac:bptt``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from bcg.envs.dynamics import Dynamics

__all__ = ["Compare", "Job", "check_method", "make_jobs", "method_label", "parse_method", "run_job", "run_jobs"]


# -------------------------------------------------------------------------------------------- methods


def parse_method(method: str) -> tuple[str, str | None, dict[str, Any]]:
    """``"ppo"`` -> ``("ppo", None, {})``; ``"shac:bcg:tau=200"`` -> ``("shac", "bcg", {"tau": 200})``;
    ``"shac"`` -> ``("shac", "bptt", {})``. Checks the agent and the estimator's name against the registry (the
    message lists the registered estimators); raises ``ValueError``."""
    from bcg.estimators import ESTIMATORS, parse_spec

    agent, _, spec = method.strip().partition(":")
    agent = agent.lower()
    if agent == "ppo":
        if spec:
            raise ValueError(f"method {method!r}: PPO takes no estimator (write plain 'ppo')")
        return "ppo", None, {}
    if agent != "shac":
        raise ValueError(f"unknown method {method!r}: expected 'ppo' or 'shac:ESTIMATOR' with a registered "
                         f"estimator ({', '.join(ESTIMATORS)})")
    name, params = parse_spec(spec or "bptt")
    if name not in ESTIMATORS:
        raise ValueError(f"method {method!r}: unknown estimator {name!r}; registered: {', '.join(ESTIMATORS)}")
    return "shac", name, params


def check_method(method: str) -> None:
    """Raise ``ValueError`` unless ``method`` parses and its estimator accepts its parameters."""
    from bcg.estimators import make

    agent, name, params = parse_method(method)
    if agent == "shac":
        try:
            make(name, **params)
        except TypeError as exc:  # unknown parameter of the estimator's dataclass
            raise ValueError(f"method {method!r}: {exc}") from None


def method_label(method: str) -> str:
    """Display name: ``PPO``, ``SHAC+BCG``, ``SHAC (bptt)``, ``SHAC+GRS``, ``SHAC+<plugin>`` (parameters kept)."""
    agent, name, _ = parse_method(method)
    if agent == "ppo":
        return "PPO"
    spec = method.strip().partition(":")[2]
    rest = spec.partition(":")[2]
    base = "SHAC (bptt)" if name == "bptt" else f"SHAC+{name.upper() if name in ('bcg', 'grs') else name}"
    return f"{base} [{rest}]" if rest else base


# -------------------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One (method, motion, seed) training run and its transfer evaluation; plain values only (pickled to worker
    processes and Ray tasks)."""

    method: str
    """``ppo`` or ``shac:ESTIMATOR[:key=value,...]``."""
    motion: str
    """Packaged clip name or motion file."""
    seed: int
    """Training seed."""
    out: str
    """Folder in which the run directory is made (the run is named ``MOTION-METHOD-sSEED``)."""
    iterations: int = 30
    """Training iterations (the budget when ``budget_s`` is None; the cap otherwise)."""
    budget_s: float | None = None
    """Training wall-clock budget [s] (None: ``iterations`` alone)."""
    preset: str = "cpu-small"
    """Agent config preset."""
    dynamics: Dynamics = Dynamics()
    """Dynamics of the training simulator (contact stiffness, ...; each None for the default)."""
    shac: tuple[tuple[str, Any], ...] = ()
    """SHACConfig field overrides, as (name, value) pairs."""
    ppo: tuple[tuple[str, Any], ...] = ()
    """PPOConfig field overrides, as (name, value) pairs."""
    eval_phases: int = 2
    """Transfer: start phases per seed."""
    eval_seeds: tuple[int, ...] = (0,)
    """Transfer: seeds of the initial joint noise."""
    eval_seconds: float | None = 2.0
    """Transfer: longest episode [s] (None: the clip's end)."""
    device: str = "cpu"
    """Torch / Warp device of training."""

    @property
    def name(self) -> str:
        """Run directory name, unique in a grid: ``MOTION-METHOD-sSEED`` (method made file-safe)."""
        slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in self.method.replace(":", "-"))
        k = "" if self.dynamics.kappa is None else f"-k{self.dynamics.kappa:g}"
        return f"{Path(self.motion).stem}-{slug}{k}-s{self.seed}"


def read_curve(metrics_csv: Path) -> dict[str, list[float]]:
    """The columns ``iteration``, ``samples``, ``wall_time_s``, ``tracking_error_cm``, ``reward`` and the evaluation's
    ``eval_tracking_error_cm``, ``eval_fall_rate`` of a run's metrics.csv, as float lists (NaN where empty or
    missing)."""
    cols = ("iteration", "samples", "wall_time_s", "tracking_error_cm", "reward", "eval_tracking_error_cm",
            "eval_fall_rate")
    out: dict[str, list[float]] = {c: [] for c in cols}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for c in cols:
                v = row.get(c, "")
                out[c].append(float(v) if v not in ("", None) else math.nan)
    return out


def _finite(x: float) -> float | None:
    """JSON-safe float: None for NaN / inf (json.dumps would write NaN, which strict readers refuse)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _transfer_entry(report: dict[str, Any]) -> dict[str, Any]:
    """The ``transfer`` entry of a result from a transfer report's dict (``TransferReport.to_dict()`` or its JSON):
    the MuJoCo metrics (NaN as None), Δd, and our simulator's E_track and falls."""
    tr = {k: (_finite(v) if isinstance(v, float) else v) for k, v in report["mujoco"].items()}
    tr.update(delta_d_mm=_finite(report["delta_d_mm"]), bcg_e_track_cm=_finite(report["bcg"]["e_track_cm"]),
              bcg_falls=report["bcg"]["falls"])
    return tr


def run_job(job: Job | dict[str, Any]) -> dict[str, Any]:
    """Train ``job`` and evaluate its transfer; returns the job's result dict::

        {"method", "label", "motion", "seed", "kappa", "run_dir", "status", "error",
         "curve": {"iteration", "samples", "wall_time_s", "tracking_error_cm", "reward",
                   "eval_tracking_error_cm", "eval_fall_rate"},   # per iteration (eval: NaN between evaluations)
         "transfer": {"e_track_cm", "falls", "episodes", "fall_rate", "delta_d_mm", "unstable",
                      "mean_episode_seconds", "error_body_pos", ...} or None,
         "seconds": {"train", "transfer"}}

    A failure (exception while training or evaluating) is caught and reported in ``error`` (the grid goes on);
    a module-level function so that worker processes and Ray can import it."""
    if isinstance(job, dict):
        job = Job(**{**job, "eval_seeds": tuple(job.get("eval_seeds", (0,))),
                     "dynamics": Dynamics.from_mapping(job.get("dynamics") or {}),
                     "shac": tuple(map(tuple, job.get("shac", ()))), "ppo": tuple(map(tuple, job.get("ppo", ())))})
    import torch

    torch.set_num_threads(1)  # one core per job: jobs run side by side (train's torch_threads=1 does the same)
    res: dict[str, Any] = {"method": job.method, "label": method_label(job.method), "motion": Path(job.motion).stem,
                           "seed": job.seed, "kappa": job.dynamics.kappa, "run_dir": None, "status": None,
                           "error": None, "curve": None, "transfer": None, "seconds": {"train": None, "transfer": None}}
    try:
        from bcg.agents.train import default_config
        from bcg.estimators import make
        from bcg.evaluation.periodic import train_and_evaluate

        agent, est_name, params = parse_method(job.method)
        overrides: dict[str, Any] = dict(motion=job.motion, seed=job.seed, iterations=job.iterations,
                                         max_time_s=job.budget_s, out=Path(job.out), name=job.name,
                                         dynamics=job.dynamics, checkpoint_every=0, progress=False, tensorboard=False,
                                         device=job.device,
                                         # the learning rates decay over the budget that binds, as in `bcg train
                                         # --max-time-s`, not over the preset's iterations (docs/training.md)
                                         schedule_over_time=job.budget_s is not None)
        if agent == "shac":
            overrides["estimator"] = make(est_name, **params)
        cfg = default_config(agent, job.preset, **overrides)
        cfg = dataclasses.replace(cfg, shac=dataclasses.replace(cfg.shac, **dict(job.shac)),
                                  ppo=dataclasses.replace(cfg.ppo, **dict(job.ppo)))
        t0 = time.perf_counter()
        result = train_and_evaluate(cfg)
        res["seconds"]["train"] = time.perf_counter() - t0
        res["run_dir"], res["status"] = str(result.run_dir), int(result.status)
        res["curve"] = {k: [_finite(v) for v in vals] for k, vals in read_curve(result.run_dir / "metrics.csv").items()}
        del result  # the agent (env, networks) is not needed for the replay

        from bcg.evaluation.evaluate_cli import load_source
        from bcg.evaluation.mujoco_transfer import TransferOptions, evaluate_transfer

        policy, motion, env_kwargs, eval_dir, label = load_source(res["run_dir"], None)
        opts = TransferOptions(phases=job.eval_phases, seeds=tuple(job.eval_seeds), seconds=job.eval_seconds)
        t0 = time.perf_counter()
        report, _ = evaluate_transfer(policy, motion, opts, label=label, env_kwargs=env_kwargs)
        res["seconds"]["transfer"] = time.perf_counter() - t0
        eval_dir.mkdir(parents=True, exist_ok=True)
        (eval_dir / "metrics.json").write_text(report.to_json() + "\n")
        (eval_dir / "metrics.md").write_text(report.to_markdown())
        res["transfer"] = _transfer_entry(report.to_dict())
    except Exception as exc:  # noqa: BLE001 - one failed job is reported, the others go on
        res["error"] = f"{type(exc).__name__}: {exc}"
    return res


def run_result(run_dir: str | Path) -> dict[str, Any]:
    """The result dict of :func:`run_job` for a run trained and evaluated on its own (``bcg train`` then ``bcg evaluate
    RUN``): method, clip, seed and kappa from its ``config.json`` (kappa: the simulator's default when the run did
    not set one), the curve from its ``metrics.csv``, the transfer from ``eval/<clip>/metrics.json`` (``bcg evaluate``'s
    default protocol), ``eval/metrics.json`` (a job of this grid) or ``eval_<clip>.json`` (a run kept in
    ``benchmarks/results``). Raises a
    one-line ``FileNotFoundError`` / ``ValueError`` for a folder that is not such a run."""
    from bcg.sim import ContactParams

    run = Path(run_dir)
    cfg_path, csv_path = run / "config.json", run / "metrics.csv"
    for path in (cfg_path, csv_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: {run} is not a finished bcg train run")
    cfg = json.loads(cfg_path.read_text())
    clip = Path(str(cfg["motion"])).stem
    # bcg evaluate's default protocol writes eval/CLIP/, a grid job of bcg compare eval/; a run kept in
    # benchmarks/results has its evaluation beside its config as eval_CLIP.json
    found = [p for p in (run / "eval" / clip / "metrics.json", run / "eval" / "metrics.json",
                         run / f"eval_{clip}.json") if p.is_file()]
    if not found:
        raise FileNotFoundError(f"{run / 'eval' / clip / 'metrics.json'} not found: evaluate the run first "
                                f"(bcg evaluate {run})")
    report_path = found[0]
    report = json.loads(report_path.read_text())
    est = cfg.get("estimator") or {}
    method = "ppo" if cfg["agent"] == "ppo" else f"shac:{est.get('name', 'bptt')}"
    # runs written before the dynamics were one option group have kappa at the top of their config
    kappa = Dynamics.from_mapping(cfg.get("dynamics") or cfg).kappa or ContactParams().kappa
    tr = _transfer_entry(report)
    return {"method": method, "label": method_label(method), "motion": clip, "seed": int(cfg["seed"]),
            "kappa": float(kappa), "run_dir": str(run), "status": 0, "error": None,
            "curve": {k: [_finite(v) for v in vals] for k, vals in read_curve(csv_path).items()},
            "transfer": tr, "transfer_options": report["options"],
            "seconds": {"train": cfg.get("max_time_s"), "transfer": None}}


def make_jobs(methods: Sequence[str], motions: Sequence[str], seeds: Sequence[int], out: str | Path,
              **job_fields: Any) -> list[Job]:
    """The grid: one :class:`Job` per (method, motion, seed), in that nesting order. Checks the methods (unknown
    method or estimator: ``ValueError`` listing the registered ones) and that every list is non-empty."""
    for what, xs in (("methods", methods), ("motions", motions), ("seeds", seeds)):
        if not xs:
            raise ValueError(f"{what}: at least one is needed, got none")
        if len(set(xs)) != len(xs):
            raise ValueError(f"{what} must be distinct, got {list(xs)}")
    for m in methods:
        check_method(m)
    for s in seeds:
        if isinstance(s, bool) or int(s) != s or s < 0:
            raise ValueError(f"seeds must be integers >= 0, got {s!r}")
    from bcg.agents.train import check_motion

    for mo in motions:
        check_motion(mo)
    return [Job(method=m, motion=mo, seed=int(s), out=str(out), **job_fields)
            for m in methods for mo in motions for s in seeds]


# -------------------------------------------------------------------------------------------- executors


def _run_ray(jobs: Sequence[Job], address: str, on_done: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise ImportError("--ray-address needs Ray: pip install 'ray>=2.9' (or run without --ray-address: local "
                          "worker processes)") from None
    started = False
    if not ray.is_initialized():  # an instance the caller started (ray.init in a test or a notebook) is reused
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address == "local":
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=1)(run_job)
        pending = {task.remote(dataclasses.asdict(j)): i for i, j in enumerate(jobs)}
        out: list[dict[str, Any] | None] = [None] * len(jobs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                out[pending.pop(ref)] = r = ray.get(ref)
                on_done(r)
        return out  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()


def run_jobs(jobs: Sequence[Job], *, workers: int = 1, ray_address: str | None = None,
             on_done: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the jobs and return their result dicts in the jobs' order.

    ``ray_address`` (``auto``, ``HOST:PORT`` or ``local`` for a fresh local instance; an instance already
    initialised in this process is used as it is): one Ray task per job (1 CPU each). Otherwise ``workers == 1``:
    one after another in this process; ``workers > 1``: a ``ProcessPoolExecutor`` of that many spawned processes
    (spawn: no forked torch / Warp state). ``on_done`` is called with each result as it arrives."""
    cb = on_done or (lambda r: None)
    if ray_address:
        return _run_ray(jobs, ray_address, cb)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) == 1:
        out = []
        for j in jobs:
            out.append(run_job(j))
            cb(out[-1])
        return out
    import concurrent.futures as cf
    import multiprocessing as mp

    results: list[dict[str, Any] | None] = [None] * len(jobs)
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(run_job, j): i for i, j in enumerate(jobs)}
        for fut in cf.as_completed(futures):
            results[futures[fut]] = r = fut.result()
            cb(r)
    return results  # type: ignore[return-value]


# -------------------------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class GridOptions:
    """Options shared by the commands that run a grid of train-then-transfer jobs (``bcg compare``,
    ``bcg study stiffness``): budget, preset, sizes, the transfer replay and where the jobs run."""

    iterations: int = 1000
    """Iterations per run (a cap when --budget-s is given)."""
    budget_s: float | None = 40.0
    """Training wall-clock budget per run [s] (equal for all runs; None: --iterations alone). Runs side by side
    share the CPU: the budget is wall-clock, not CPU time."""
    preset: str = "cpu-small"
    """Agent preset of every run (cpu-small or paper)."""
    shac_num_envs: int | None = None
    """SHAC environments (None: the preset's)."""
    ppo_num_envs: int | None = None
    """PPO environments (None: the preset's)."""
    eval_phases: int = 2
    """Transfer: start phases per seed."""
    eval_seeds: tuple[int, ...] = (0,)
    """Transfer: seeds of the initial joint noise."""
    eval_seconds: float | None = 3.0
    """Transfer: longest episode [s] (None: to the clip's end)."""
    workers: int | None = None
    """Parallel jobs: 1 runs them in this process; K > 1 in K spawned worker processes (default: min(jobs, CPUs))."""
    ray_address: str | None = None
    """Run the jobs as Ray tasks: auto, HOST:PORT, or local (a fresh local instance). Needs `pip install ray`."""


@dataclass(frozen=True)
class Compare(GridOptions):
    """Head to head: train every method on every motion and seed, replay each policy in MuJoCo, write learning
    curves, the transfer table and a Markdown report (OUT/report.md)."""

    methods: tuple[str, ...] = ("ppo", "shac:bptt", "shac:bcg")
    """Methods: ppo or shac:ESTIMATOR (any registered estimator, plugins included; parameters as
    shac:bcg:tau=200,branches=8)."""
    motions: tuple[str, ...] = ("jump",)
    """Clips (packaged names or motion files)."""
    seeds: tuple[int, ...] = (0,)
    """Training seeds."""
    dynamics: tyro.conf.OmitArgPrefixes[Dynamics] = Dynamics()
    """Dynamics of training (--kappa, --substeps, ...; each None for the simulator's default)."""
    out: Path = Path("runs/compare")
    """Output folder: runs/ (one run directory per job), results.json, report.md and the PNG plots."""
    device: str = "cpu"
    """Training device of every job."""
    report_only: bool = False
    """Rebuild report.md and the plots from OUT/results.json without training."""

    def jobs(self) -> list[Job]:
        """The grid of jobs (checks the options; ``ValueError`` with a message on a bad one)."""
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.budget_s is not None and not self.budget_s > 0:
            raise ValueError(f"budget_s must be > 0 or None, got {self.budget_s}")
        shac = (("num_envs", self.shac_num_envs),) if self.shac_num_envs else ()
        ppo = (("num_envs", self.ppo_num_envs),) if self.ppo_num_envs else ()
        return make_jobs(self.methods, self.motions, self.seeds, self.out / "runs", iterations=self.iterations,
                         budget_s=self.budget_s, preset=self.preset, dynamics=self.dynamics, shac=shac, ppo=ppo,
                         eval_phases=self.eval_phases, eval_seeds=tuple(self.eval_seeds),
                         eval_seconds=self.eval_seconds, device=self.device)

    def run(self) -> int:
        from bcg.evaluation.report import write_report

        results_path = self.out / "results.json"
        if self.report_only:
            if not results_path.is_file():
                print(f"bcg compare: error: {results_path} not found (run the grid first)", file=sys.stderr)
                return 2
            data = json.loads(results_path.read_text())
        else:
            try:
                jobs = self.jobs()
                taken = [j.name for j in jobs if (Path(j.out) / j.name).exists()]
                if taken:
                    raise ValueError(f"{self.out / 'runs'} already holds {', '.join(taken)}: choose another --out, or "
                                     "rebuild the report of that grid with --report-only")
            except ValueError as exc:
                print(f"bcg compare: error: {exc}", file=sys.stderr)
                return 2
            workers = self.workers or max(1, min(len(jobs), os.cpu_count() or 1))
            where = f"Ray ({self.ray_address})" if self.ray_address else (
                "this process" if workers == 1 else f"{workers} worker processes")
            print(f"bcg compare: {len(jobs)} jobs ({len(self.methods)} methods x {len(self.motions)} motions x "
                  f"{len(self.seeds)} seeds) in {where}; runs in {self.out / 'runs'}", flush=True)
            t0 = time.perf_counter()
            done = [0]

            def on_done(r: dict[str, Any]) -> None:
                done[0] += 1
                tr = r.get("transfer") or {}
                what = r["error"] or (f"E_track {_num(tr.get('e_track_cm'))} cm, falls {tr.get('falls')}/"
                                      f"{tr.get('episodes')}, Δd {_num(tr.get('delta_d_mm'), '+.2f')} mm")
                print(f"  [{done[0]}/{len(jobs)}] {r['label']} {r['motion']} s{r['seed']}: {what} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)

            try:
                results = run_jobs(jobs, workers=workers, ray_address=self.ray_address, on_done=on_done)
            except ImportError as exc:
                print(f"bcg compare: error: {exc}", file=sys.stderr)
                return 2
            data = {"config": _config_dict(self), "command": "bcg compare " + " ".join(sys.argv[2:]),
                    "results": results, "total_seconds": time.perf_counter() - t0}
            self.out.mkdir(parents=True, exist_ok=True)
            results_path.write_text(json.dumps(data, indent=1) + "\n")
        report = write_report(data, self.out)
        print(f"wrote {report}")
        print(f"plots: {', '.join(str(p) for p in sorted(self.out.glob('compare_*.png')))}")
        failed = [r for r in data["results"] if r.get("error")]
        for r in failed:
            print(f"bcg compare: job {r['label']} {r['motion']} s{r['seed']} failed: {r['error']}", file=sys.stderr)
        return 1 if failed else 0


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "nan" if x is None else format(x, fmt)


def _config_dict(c: Compare) -> dict[str, Any]:
    d = dataclasses.asdict(c)
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in d.items()}

