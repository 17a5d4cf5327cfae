"""``bcg compare``: the grid of jobs, the executors (in-process, spawned workers, Ray) and the report.

A two-job grid (PPO and SHAC through bptt on the jump clip, 2 iterations of 4 environments, a 0.2 s transfer) is
run once in-process; the report must build with all its figures from it, and the worker-process and Ray paths must
give the same table (training is deterministic for a seed on the CPU with one thread, so the numbers agree exactly).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bcg.cli import main
from bcg.evaluation.compare import Job, make_jobs, method_label, parse_method, run_job, run_jobs
from bcg.evaluation.report import group, samples_table, transfer_rows, write_report

TINY = dict(iterations=2, shac=(("num_envs", 4), ("horizon", 8)), ppo=(("num_envs", 4), ("n_steps", 8)),
            eval_phases=1, eval_seconds=0.2)
"""A job small enough for a test: 32 samples per iteration, one 10-step transfer episode per simulator."""


def _grid(out: Path) -> list[Job]:
    return make_jobs(["ppo", "shac:bptt"], ["jump"], [0], out, **TINY)


def _table(results: list[dict]) -> list[dict]:
    """The transfer and samples tables without wall-clock (which differs between runs)."""
    g = group(results)
    rows = [{k: v for k, v in r.items() if k != "wall_s"} for r in transfer_rows(g)]
    return rows + samples_table(g)


@pytest.fixture(scope="module")
def local_grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("compare_local")
    return out, run_jobs(_grid(out / "runs"), workers=1)


def test_methods_parse_and_label() -> None:
    assert parse_method("ppo") == ("ppo", None, {})
    assert parse_method("shac") == ("shac", "bptt", {})
    assert parse_method("shac:bcg:tau=200.0,branches=8") == ("shac", "bcg", {"tau": 200.0, "branches": 8})
    assert [method_label(m) for m in ("ppo", "shac:bptt", "shac:bcg", "shac:grs")] == [
        "PPO", "SHAC (bptt)", "SHAC+BCG", "SHAC+GRS"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(methods=["ppo", "dqn"]), "unknown method 'dqn'"),
    (dict(methods=["shac:magic"]), "unknown estimator 'magic'; registered: "),
    (dict(methods=["shac:bcg:no_such_field=1"]), "no_such_field"),
    (dict(methods=["ppo:bcg"]), "PPO takes no estimator"),
    (dict(seeds=[]), "seeds: at least one is needed"),
    (dict(motions=["moonwalk"]), "unknown motion 'moonwalk'"),
])
def test_bad_grid_refused(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = dict(methods=["ppo"], motions=["jump"], seeds=[0]) | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as exc:
        make_jobs(args["methods"], args["motions"], args["seeds"], tmp_path)
    if "registered" in message:
        from bcg.estimators import ESTIMATORS

        assert all(name in str(exc.value) for name in ESTIMATORS)


def test_cli_refuses_unknown_estimator_and_zero_seeds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["compare", "--methods", "shac:nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown estimator 'nope'; registered: " in err and "bptt" in err and "bcg" in err
    assert main(["compare", "--seeds", "--out", str(tmp_path)]) == 2
    assert "seeds: at least one is needed" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was trained


def test_local_grid_results(local_grid: tuple[Path, list[dict]]) -> None:
    _, results = local_grid
    assert [(r["label"], r["error"]) for r in results] == [("PPO", None), ("SHAC (bptt)", None)]
    for r in results:
        assert r["curve"]["iteration"] == [1.0, 2.0]
        assert r["curve"]["samples"] == [32.0, 64.0]  # 4 envs x 8 steps per iteration, both agents
        tr = r["transfer"]
        assert tr["episodes"] == 1 and 0 < tr["e_track_cm"] < 100 and math.isfinite(tr["delta_d_mm"])
        assert (Path(r["run_dir"]) / "policy.pt").is_file()
        assert (Path(r["run_dir"]) / "eval" / "metrics.json").is_file()
        cfg = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert cfg["max_time_s"] is None and cfg["schedule_over_time"] is False  # iterations alone: their schedule


def test_a_budget_binds_the_learning_rate_schedule(tmp_path: Path) -> None:
    """With --budget-s the learning rates decay over the budget, as in `bcg train --max-time-s`."""
    (job,) = make_jobs(["shac:bptt"], ["jump"], [0], tmp_path, **{**TINY, "iterations": 1, "budget_s": 60.0})
    r = run_job(job)
    assert r["error"] is None, r["error"]
    cfg = json.loads((Path(r["run_dir"]) / "config.json").read_text())
    assert cfg["max_time_s"] == 60.0 and cfg["schedule_over_time"] is True


def test_report_builds_with_all_figures(local_grid: tuple[Path, list[dict]]) -> None:
    out, results = local_grid
    data = {"config": {"methods": ["ppo", "shac:bptt"], "motions": ["jump"], "seeds": [0], "iterations": 2,
                       "budget_s": None, "preset": "cpu-small", "eval_phases": 1, "eval_seeds": [0],
                       "eval_seconds": 0.2}, "command": "bcg compare --tiny", "results": results}
    (out / "results.json").write_text(json.dumps(data))
    report = write_report(json.loads((out / "results.json").read_text()), out)
    text = report.read_text()
    for png in ("compare_learning.png", "compare_transfer.png", "compare_samples.png"):
        assert (out / png).stat().st_size > 10_000, png  # a real figure (measured 30-60 kB), not an empty file
        assert f"]({png})" in text
    assert "| jump | PPO | 1 |" in text and "| jump | SHAC (bptt) | 1 |" in text
    assert "18.6 +- 0.4" in text and "18.0 +- 0.2" in text  # the paper's jump numbers beside ours
    # the CLI rebuilds the same report from results.json alone, and will not train over the finished runs
    assert main(["compare", "--report-only", "--out", str(out)]) == 0
    assert report.read_text() == text
    assert main(["compare", "--methods", "ppo", "--out", str(out)]) == 2


@pytest.mark.slow
def test_worker_processes_give_the_same_table(local_grid: tuple[Path, list[dict]], tmp_path: Path) -> None:
    _, local = local_grid
    spawned = run_jobs(_grid(tmp_path / "runs"), workers=2)
    assert _table(spawned) == _table(local)


def test_ray_gives_the_same_table(local_grid: tuple[Path, list[dict]], tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray>=2.9'): the Ray path is untested")
    _, local = local_grid
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_jobs(_grid(tmp_path / "runs"), ray_address="auto")  # the instance above is used as it is
    finally:
        ray.shutdown()
    assert [r["error"] for r in remote] == [None, None]
    assert _table(remote) == _table(local)


def test_ray_missing_is_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the package
    with pytest.raises(ImportError, match=r"--ray-address needs Ray: pip install 'ray>=2.9'"):
        run_jobs(_grid(tmp_path / "runs"), ray_address="auto")
    assert main(["compare", "--methods", "ppo", "--ray-address", "auto", "--out", str(tmp_path / "c")]) == 2
    assert "pip install 'ray>=2.9'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
