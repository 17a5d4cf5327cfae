"""``bcg study methods`` (paper Q3 and Q4) on runs laid out as ``bcg train`` + ``bcg evaluate`` + ``bcg curve`` leave
them (and as benchmarks/results keeps them): the reaching rule, the tables, the figure, the refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bcg.cli import main
from bcg.evaluation.learning_curve import CURVE_COLUMNS, CurvePoint
from bcg.evaluation.study_methods import (
    first_reaching,
    hardest_rows,
    read_runs,
    samples_rows,
    scored_before,
    transfer_rows,
)


def _point(samples: int, e_track: float, episode: float, falls: int = 0) -> CurvePoint:
    return CurvePoint(iteration=samples // 256, samples=samples, wall_time_s=samples / 1000.0, mujoco_falls=falls,
                      mujoco_episodes=8, mujoco_mean_episode_s=episode, mujoco_e_track_cm=e_track, bcg_falls=falls,
                      bcg_episodes=8, bcg_mean_episode_s=episode, bcg_e_track_cm=e_track + 1.0)


def _run(root: Path, name: str, agent: str, estimator: str | None, seed: int, final: tuple[float, float, int],
         curve: list[CurvePoint] | None, kept: bool = False, done: int = 2, **settings: object) -> Path:
    """A finished run: config.json, metrics.csv, the final replay (eval/jump/metrics.json, or eval_jump.json when
    ``kept``) with ``final`` = (E_track [cm], mean episode [s], falls), and the curve (eval/curve-jump/curve.csv or
    curve_jump.csv); ``done``: the iterations it completed."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {"agent": agent, "motion": "jump", "seed": seed, "kappa": None, "max_time_s": 60.0,
           "estimator": None if estimator is None else {"name": estimator}, **settings}
    (run / "config.json").write_text(json.dumps(cfg))
    last = curve[-1].samples if curve else 1000
    (run / "metrics.csv").write_text(f"iteration,samples,wall_time_s\n1,500,1.0\n{done},{last},2.0\n")
    e, ep, falls = final
    sim = {"e_track_cm": e, "falls": falls, "episodes": 8, "mean_episode_seconds": ep, "fall_rate": falls / 8,
           "unstable": 0, "steps": 100, "mean_penetration_mm": 1.0}
    report = {"motion": "jump", "options": {}, "mujoco": dict(sim), "bcg": dict(sim, e_track_cm=e + 1.0),
              "delta_d_mm": 0.5, "episodes": []}
    path = run / "eval_jump.json" if kept else run / "eval" / "jump" / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    if curve:
        cpath = run / "curve_jump.csv" if kept else run / "eval" / "curve-jump" / "curve.csv"
        cpath.parent.mkdir(parents=True, exist_ok=True)
        rows = [",".join(str(getattr(p, c)) for c in CURVE_COLUMNS) for p in curve]
        cpath.write_text(",".join(CURVE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    return run


def test_a_checkpoint_reaches_only_when_it_tracks_as_well_and_stands_as_long() -> None:
    # a falling policy's early checkpoint tracks its first second well: not a reach
    curve = [_point(100, 15.0, 1.2, falls=8), _point(200, 25.0, 6.0), _point(300, 19.0, 5.0), _point(400, 9.0, 9.4)]
    assert first_reaching(curve, 20.0, 4.8).samples == 300
    assert first_reaching(curve, 20.0, 9.0).samples == 400
    assert first_reaching(curve, 5.0, 1.0) is None
    assert first_reaching(list(reversed(curve)), 20.0, 4.8).samples == 300  # training order, not file order
    assert scored_before(list(reversed(curve)), curve[2]).samples == 200 and scored_before(curve, curve[0]) is None


def test_study_methods_tables_figure_and_kept_runs(tmp_path: Path) -> None:
    ppo = [_run(tmp_path, f"ppo-s{s}", "ppo", None, s, (22.0 + 2 * s, 4.0 + s, 7), [_point(4_000_000, 23.0, 4.0)])
           for s in (0, 1)]  # target: E_track 23.0, episode 4.5, 4 M samples
    bcg = _run(tmp_path, "bcg-s0", "shac", "bcg", 0, (8.0, 9.4, 0),
               [_point(100_000, 18.0, 3.0), _point(500_000, 20.0, 5.0), _point(900_000, 8.0, 9.4)])
    bptt = _run(tmp_path, "bptt-s0", "shac", "bptt", 0, (30.0, 2.0, 8), [_point(100_000, 30.0, 2.0)], kept=True)
    nocurve = _run(tmp_path, "bcg-s1", "shac", "bcg", 1, (10.0, 9.4, 0), None)
    runs = read_runs([*ppo, bcg, bptt, nocurve])
    assert {r.label for r in runs} == {"PPO", "SHAC+BCG", "SHAC (bptt)"}

    q4 = {r["method"]: r for r in transfer_rows(runs)}
    assert [r["method"] for r in transfer_rows(runs)] == ["SHAC+BCG", "SHAC (bptt)", "PPO"]
    assert q4["PPO"]["falls"] == 14 and q4["PPO"]["episodes"] == 16
    assert q4["PPO"]["e_track_cm"] == pytest.approx(23.0) and q4["PPO"]["e_track_std"] == pytest.approx(math.sqrt(2))
    assert q4["SHAC+BCG"]["e_track_cm"] == pytest.approx(9.0) and q4["SHAC+BCG"]["seeds"] == [0, 1]
    assert q4["SHAC+BCG"]["paper_e_track_cm"] == 18.6 and q4["PPO"]["paper_e_track_cm"] == 18.0

    q3 = {r["run"]: r for r in samples_rows(runs)}
    assert set(q3) == {"bcg-s0", "bptt-s0", "bcg-s1"}
    assert q3["bcg-s0"]["samples"] == 500_000 and q3["bcg-s0"]["ratio"] == pytest.approx(8.0)
    assert q3["bcg-s0"]["samples_before"] == 100_000 and q3["bcg-s0"]["ratio_at_most"] == pytest.approx(40.0)
    assert q3["bptt-s0"]["samples"] is None and q3["bptt-s0"]["has_curve"]
    assert q3["bcg-s1"]["samples"] is None and not q3["bcg-s1"]["has_curve"]

    out = tmp_path / "study"
    assert main(["study", "methods", "--runs", *map(str, [*ppo, bcg, bptt, nocurve]), "--out", str(out)]) == 0
    md = (out / "methods.md").read_text()
    assert "| jump | SHAC+BCG | bcg-s0 | 23.0, 4.50 | 4.00 M | 0.50 M | 500 | 0.10 M | 8.0 | 40.0 |" in md
    assert "not reached" in md and "no curve" in md
    assert (out / "study_methods.png").stat().st_size > 10_000
    assert (out / "study_methods_wall_time.png").stat().st_size > 10_000
    assert runs[-2].wall_time_s == 2.0  # the last row of metrics.csv
    assert json.loads((out / "results.json").read_text())["samples"][0]["clip"] == "jump"


def test_study_methods_refuses(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["study", "methods", "--out", str(tmp_path / "x")]) == 2
    assert "needs --runs" in capsys.readouterr().err
    assert main(["study", "methods", "--runs", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "config.json not found" in err and len(err.strip().splitlines()) == 1


def test_runs_of_one_method_with_other_settings_are_labelled_apart(tmp_path: Path) -> None:
    """Two SHAC+BCG runs that differ in a setting (and a seed) are two rows, each named by the difference; two seeds
    of the same setting are one row."""
    runs = read_runs([
        _run(tmp_path, "a-s0", "shac", "bcg", 0, (10.0, 9.0, 0), None),
        _run(tmp_path, "a-s1", "shac", "bcg", 1, (12.0, 9.0, 0), None),
        _run(tmp_path, "b-s0", "shac", "bcg", 0, (8.0, 9.0, 0), None, adaptive_start_credit="start"),
        _run(tmp_path, "t-s0", "shac", "bcg", 0, (9.0, 9.0, 0), None, done=4, max_time_s=120.0),
    ])
    labels = {r.name: r.label for r in runs}
    assert labels["a-s0"] == labels["a-s1"] == "SHAC+BCG [adaptive_start_credit=end, max_time_s=60.0]"
    assert labels["b-s0"] == "SHAC+BCG [adaptive_start_credit=start, max_time_s=60.0]"
    assert labels["t-s0"] == "SHAC+BCG [adaptive_start_credit=end, max_time_s=120.0]"
    rows = transfer_rows(runs)
    assert sorted(len(r["seeds"]) for r in rows) == [1, 1, 2]
    assert all(r["paper_e_track_cm"] == 18.6 for r in rows)  # the paper's figure of the method, whatever the setting


def test_a_budget_written_two_ways_is_one_setting(tmp_path: Path) -> None:
    """A run stopped by ``--iterations N`` and one whose time budget stopped it after N iterations share a row (their
    label names both ways); a third budget is labelled apart, and the seeds of one time budget stay together though
    they completed different iterations."""
    runs = read_runs([
        _run(tmp_path, "time-s0", "ppo", None, 0, (20.0, 9.0, 1), None, done=7),
        _run(tmp_path, "iters-s1", "ppo", None, 1, (24.0, 8.0, 3), None, done=7, max_time_s=None, iterations=7),
        _run(tmp_path, "short-s0", "ppo", None, 0, (30.0, 5.0, 6), None, done=3, max_time_s=None, iterations=3),
    ])
    labels = {r.name: r.label for r in runs}
    assert labels["time-s0"] == labels["iters-s1"] == "PPO [iterations=7 / max_time_s=60.0]"
    assert labels["short-s0"] == "PPO [iterations=3]"
    assert sorted(len(r["seeds"]) for r in transfer_rows(runs)) == [1, 2]

    seeds = read_runs([_run(tmp_path / "b", f"t-s{s}", "ppo", None, s, (20.0, 9.0, 1), None, done=7 + s)
                       for s in (0, 1)])
    assert {r.label for r in seeds} == {"PPO"}


def test_the_worst_case_q3_takes_ppos_checkpoints_at_least_as_good_as_its_final_point(tmp_path: Path) -> None:
    """A PPO run whose end is worse than its middle: its middle checkpoint (at fewer samples) is the target the SHAC
    run gains least against; checkpoints worse than PPO's final point (falling early) are no targets."""
    ppo = _run(tmp_path, "ppo-s0", "ppo", None, 0, (30.0, 3.0, 8),
               [_point(100_000, 10.0, 1.0, falls=8),  # tracks its first second well, then falls: worse episode
                _point(1_000_000, 20.0, 5.0), _point(2_000_000, 25.0, 4.0), _point(4_000_000, 30.0, 3.0)])
    bcg = _run(tmp_path, "bcg-s0", "shac", "bcg", 0, (8.0, 9.4, 0),
               [_point(100_000, 28.0, 3.5), _point(200_000, 19.0, 6.0), _point(400_000, 8.0, 9.4)])
    slow = _run(tmp_path, "bcg-s1", "shac", "bcg", 1, (26.0, 4.0, 2), [_point(3_000_000, 26.0, 4.0)])
    runs = read_runs([ppo, bcg, slow])
    rows = {r["run"]: r for r in hardest_rows(runs)}
    assert set(rows) == {"bcg-s0", "bcg-s1"}
    fast = rows["bcg-s0"]
    assert fast["checkpoints"] == 3 and fast["reached"] == 3  # 1.0, 2.0 and 4.0 M; not the falling 0.1 M
    assert fast["baseline_iteration"] == 1_000_000 // 256 and fast["samples"] == 200_000
    assert fast["ratio"] == pytest.approx(5.0)  # against the final point alone: 4 M / 0.1 M = 40
    assert {r["run"]: r["ratio"] for r in samples_rows(runs)}["bcg-s0"] == pytest.approx(40.0)
    assert rows["bcg-s1"]["reached"] == 1 and rows["bcg-s1"]["ratio"] == pytest.approx(4.0 / 3.0)

    out = tmp_path / "study"
    assert main(["study", "methods", "--runs", *map(str, [ppo, bcg, slow]), "--out", str(out)]) == 0
    md = (out / "methods.md").read_text()
    assert "## Samples to reach any of PPO's checkpoints (Q3, worst case)" in md
    assert "| jump | SHAC+BCG | bcg-s0 | 3 of 3 | ppo-s0, 3906 | 20.0, 5.00 | 1.00 M | 0.20 M | 5.0 |" in md
    assert json.loads((out / "results.json").read_text())["hardest"][0]["ratio"] == pytest.approx(5.0)
