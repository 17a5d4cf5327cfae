"""``bcg study variance`` and ``bcg study stiffness`` on tiny budgets: outputs, tables, plots, refused arguments."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from bcg.cli import main
from bcg.estimators import ESTIMATORS


def test_variance_study_writes_json_png_markdown(tmp_path: Path) -> None:
    out = tmp_path / "var"
    argv = ["study", "variance", "--estimators", "bptt", "bcg", "--windows", "2", "3", "--seeds", "0",
            "--num-envs", "4", "--bootstrap", "50", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "variance.json").read_text())
    assert data["estimators"] == ["bptt", "bcg"]
    assert [e["study"]["window"] for e in data["entries"]] == [2, 3]
    for e in data["entries"]:
        for name in ("bptt", "bcg"):
            s = e["summary"][name]
            assert s["V"] > 0 and math.isfinite(s["V"]) and len(s["V_ci"]) == 2
        assert e["summary"]["bptt"]["ratio"] == 1.0
    assert (out / "study_variance.png").stat().st_size > 10_000  # a real figure (measured ~40 kB)
    md = (out / "variance.md").read_text()
    assert "](study_variance.png)" in md and md.count("| jump | 300 |") == 4


def test_variance_study_on_a_clip_file_of_the_user(tmp_path: Path) -> None:
    """--clips takes what bcg train --motion takes: a motion file too (it refused anything but the 4 names)."""
    from bcg.motion import load_motion

    clip = load_motion("jump").save(tmp_path / "myjump.npz")
    out = tmp_path / "var"
    assert main(["study", "variance", "--clips", str(clip), "--estimators", "bptt", "--windows", "2", "--seeds", "0",
                 "--num-envs", "4", "--bootstrap", "20", "--out", str(out)]) == 0
    data = json.loads((out / "variance.json").read_text())
    from bcg.motion.formats import motion_sha256

    assert data["entries"][0]["study"]["clip"] == str(clip)
    assert data["entries"][0]["study"]["clip_sha256"] == motion_sha256(clip)  # which file, exactly
    assert data["entries"][0]["summary"]["bptt"]["V"] > 0
    assert "| myjump | 300 |" in (out / "variance.md").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--estimators", "bptt", "magic"], "unknown estimator 'magic' (in 'magic'); registered: "),
    (["--estimators", "bcg:nonsense=3"], "nonsense"),
    (["--seeds"], "seeds must be a non-empty tuple"),
])
def test_variance_study_refuses(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
                                ) -> None:
    assert main(["study", "variance", *argv, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "registered" in message:
        assert all(name in err for name in ESTIMATORS)
    assert not (tmp_path / "v").exists()


def test_stiffness_study_tiny(tmp_path: Path) -> None:
    out = tmp_path / "stiff"
    argv = ["study", "stiffness", "--method", "shac:bptt", "--kappas", "50", "300", "--iterations", "1",
            "--budget-s", "None", "--shac-num-envs", "4", "--eval-phases", "1", "--eval-seconds", "0.3",
            "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert [r["kappa"] for r in data["results"]] == [50.0, 300.0]
    for r in data["results"]:
        assert r["error"] is None
        cfg = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert cfg["dynamics"]["kappa"] == r["kappa"]  # each run trained at its own stiffness
        tr = r["transfer"]
        assert tr["episodes"] == 1 and 0 <= tr["falls"] <= 1 and math.isfinite(tr["delta_d_mm"])
    assert (out / "study_stiffness.png").stat().st_size > 10_000
    md = (out / "stiffness.md").read_text()
    assert "| 50 | " in md and "| 300 | " in md
    assert "5/5 / 12.6" in md and "0/5 / 3.3" in md  # the paper's jump row beside ours
    assert main(["study", "stiffness", "--report-only", "--out", str(out)]) == 0
    assert (out / "stiffness.md").read_text() == md

    # the same runs collected after the fact (--runs, as for runs trained with bcg train --kappa and bcg evaluate):
    # the same rows, transfers and table
    again = tmp_path / "collected"
    runs = [r["run_dir"] for r in data["results"]][::-1]
    assert main(["study", "stiffness", "--runs", *runs, "--out", str(again)]) == 0
    got = json.loads((again / "results.json").read_text())
    assert [(r["kappa"], r["seed"], r["method"]) for r in got["results"]] == [(50.0, 0, "shac:bptt"),
                                                                             (300.0, 0, "shac:bptt")]
    for a, b in zip(data["results"], got["results"], strict=True):
        assert {k: b["transfer"][k] for k in a["transfer"]} == a["transfer"]
        assert a["curve"] == b["curve"]
    table = [line for line in md.splitlines() if line.startswith("| 50 |") or line.startswith("| 300 |")]
    assert table == [line for line in (again / "stiffness.md").read_text().splitlines()
                     if line.startswith("| 50 |") or line.startswith("| 300 |")]
    assert main(["study", "stiffness", "--runs", runs[0], str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    # a run kept the way benchmarks/results keeps them (config, metrics, eval_CLIP.json side by side) reads the same
    from bcg.evaluation.compare import run_result

    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("config.json", "metrics.csv"):
        shutil.copy(Path(runs[0]) / name, kept / name)
    shutil.copy(Path(runs[0]) / "eval" / "metrics.json", kept / "eval_jump.json")
    assert run_result(kept)["transfer"] == run_result(runs[0])["transfer"]


def test_stiffness_study_refuses(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["study", "stiffness", "--method", "shac:nope", "--out", str(tmp_path / "s")]) == 2
    assert "unknown estimator 'nope'; registered: " in capsys.readouterr().err
    assert main(["study", "stiffness", "--kappas", "0", "--out", str(tmp_path / "s")]) == 2
    assert "kappas must be one or more finite values > 0" in capsys.readouterr().err
    assert main(["study", "stiffness", "--seeds", "--out", str(tmp_path / "s")]) == 2
    assert "seeds: at least one is needed" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_variance_over_training_checkpoints(tmp_path: Path) -> None:
    """--run-dir: V at every checkpoint of a 3-iteration run (the trained network, per-env output layers)."""
    assert main(["train", "--agent", "shac", "--iterations", "3", "--checkpoint-every", "1", "--shac.num-envs", "4",
                 "--shac.horizon", "8", "--out", str(tmp_path), "--name", "r", "--no-progress",
                 "--no-tensorboard"]) == 0
    out = tmp_path / "var"
    assert main(["study", "variance", "--run-dir", str(tmp_path / "r"), "--checkpoints", "3", "--estimators", "bptt",
                 "bcg", "--windows", "4", "--seeds", "0", "--num-envs", "4", "--bootstrap", "50",
                 "--out", str(out)]) == 0
    data = json.loads((out / "variance.json").read_text())
    assert [e["study"]["iteration"] for e in data["entries"]] == [1, 2, 3]
    assert data["parameters"] == "output layer (3741 parameters)"  # (128 + 1) x 29 of the cpu-small actor
    # each policy acts through the action map it was trained with (bcg train: residuals around the reference)
    assert {e["study"]["action_offset"] for e in data["entries"]} == {"reference"}
    # the policies differ between checkpoints, so V does (measured 43.2, 41.7, 39.8 for bptt)
    vs = [e["summary"]["bptt"]["V"] for e in data["entries"]]
    assert all(v > 0 for v in vs) and len(set(vs)) == 3
    assert (out / "study_variance.png").stat().st_size > 10_000
    assert main(["study", "variance", "--run-dir", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    # several runs in one study (a SHAC run beside a SHAC+BCG run): entries labelled by run, paired start states
    shutil.copytree(tmp_path / "r", tmp_path / "copy")
    both = tmp_path / "both"
    assert main(["study", "variance", "--run-dir", str(tmp_path / "r"), str(tmp_path / "copy"), "--checkpoints", "2",
                 "--estimators", "bptt", "--windows", "4", "--seeds", "0", "--num-envs", "4", "--bootstrap", "50",
                 "--out", str(both)]) == 0
    two = json.loads((both / "variance.json").read_text())
    assert [(e["study"]["run"], e["study"]["iteration"]) for e in two["entries"]] == [
        ("r", 1), ("r", 3), ("copy", 1), ("copy", 3)]
    v = [e["summary"]["bptt"]["V"] for e in two["entries"]]
    assert v[:2] == v[2:] == [vs[0], vs[2]]  # the same checkpoints and start states give the same numbers
    md = (both / "variance.md").read_text()
    assert "| copy | " in md and "Over training: the policies of" in md
    assert main(["study", "variance", "--run-dir", str(tmp_path / "r"), str(tmp_path / "r"), "--out", str(both)]) == 2


def test_variance_study_of_a_policy_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--run-dir takes an exported policy too: measured once (iteration 0) on its clip, through its action map; a file
    that is not a policy is refused before anything runs."""
    from bcg.evaluation.study_variance import run_label

    policy = Path(__file__).parent / "data" / "policy_run_shac_bcg.pt"
    out = tmp_path / "var"
    assert main(["study", "variance", "--run-dir", str(policy), "--estimators", "bptt", "bcg", "--windows", "4",
                 "--seeds", "0", "--num-envs", "4", "--bootstrap", "50", "--out", str(out)]) == 0
    (entry,) = json.loads((out / "variance.json").read_text())["entries"]
    assert (entry["study"]["run"], entry["study"]["iteration"], entry["study"]["clip"]) == (policy.name, 0, "run")
    assert entry["study"]["action_offset"] == "reference" and entry["summary"]["bptt"]["fell"] == 0.0
    assert f"At the policy {policy};" in (out / "variance.md").read_text()  # one policy, not checkpoints
    # a run's own policy.pt is labelled by its run directory
    assert run_label(Path("runs/jump-s1/policy.pt")) == "jump-s1" and run_label(policy) == policy.name
    readme = Path(__file__).parents[1] / "README.md"
    assert main(["study", "variance", "--run-dir", str(readme), "--out", str(tmp_path / "x")]) == 2
    assert "is not a torch file" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["study", "variance", "--run-dir", str(tmp_path / "gone"), "--out", str(tmp_path / "x")]) == 2
    assert "gone does not exist: expected a bcg train run directory or a policy file" in capsys.readouterr().err


def test_sensitivity_study_tiny(tmp_path: Path) -> None:
    """Branch versus bundle on the jump clip's first landing: the bundle is the branches' mean, the plot is written,
    and the window across touchdown has a non-zero sensitivity (in flight dv_z/dp_z is exactly 0)."""
    out = tmp_path / "sens"
    assert main(["study", "sensitivity", "--kappas", "300", "--branches", "4", "--window", "4", "--out", str(out)]) == 0
    data = json.loads((out / "sensitivity.json").read_text())
    e = data["entries"][0]
    assert len(e["branch"]) == 4 and e["mean"] == pytest.approx(sum(e["branch"]) / 4, rel=1e-9)
    assert data["frame"] == 43  # jump's first landing is frame 45 (flight 26-44); the window starts 2 steps earlier
    assert abs(e["nominal"]) > 0.5  # measured -9.1 [1/s] for T = 4 (-2.5 for T = 8 from frame 41)
    assert (out / "study_sensitivity.png").stat().st_size > 10_000
    assert main(["study", "sensitivity", "--branches", "2", "--out", str(tmp_path / "x")]) == 2


def test_sensitivity_study_with_a_trained_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--policy: the branches act through a trained policy, on its own clip and kappa; its feedback changes the
    sensitivity the reference-target policy has from the same start; a missing path is one error line."""
    from bcg.motion.formats import motion_sha256

    policy = Path(__file__).parent / "data" / "policy_run_shac_bcg.pt"
    out, ref = tmp_path / "sens", tmp_path / "ref"
    assert main(["study", "sensitivity", "--policy", str(policy), "--branches", "3", "--window", "4",
                 "--landings", "2", "--out", str(out)]) == 0
    data = json.loads((out / "sensitivity.json").read_text())
    # the run's first two landings, left and right foot (frames 11 and 26), each window starting 2 steps before
    assert data["clip"] == "run" and data["policy"] == str(policy) and data["frames"] == [9, 24]
    assert [e["frame"] for e in data["entries"]] == [9, 24] and "| 300 | 24 |" in (out / "sensitivity.md").read_text()
    assert data["clip_sha256"] == motion_sha256("run")
    assert [e["kappa"] for e in data["entries"]] == [300.0, 300.0]
    assert main(["study", "sensitivity", "--clip", "run", "--kappas", "300", "--branches", "3", "--window", "4",
                 "--out", str(ref)]) == 0
    plain = json.loads((ref / "sensitivity.json").read_text())
    assert plain["frame"] == data["frame"] and plain["policy"] is None
    # the policy halves the landing's sensitivity (it reacts to the pelvis height that the reference targets ignore)
    assert data["entries"][0]["nominal"] == pytest.approx(-5.34, rel=0.02)
    assert plain["entries"][0]["nominal"] == pytest.approx(-11.7, rel=0.02)
    capsys.readouterr()
    assert main(["study", "sensitivity", "--policy", str(tmp_path / "gone"), "--out", str(tmp_path / "x")]) == 2
    assert "gone does not exist: expected a bcg train run directory or a policy file" in capsys.readouterr().err
