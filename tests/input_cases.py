"""Bad inputs tried on the ``bcg`` command, and the workspace they need.

Each :class:`Case` is a command line that must be refused with one line ``bcg COMMAND: error: ...`` and status 2.
``tests/test_input_handling.py`` runs every case in-process; run this file to regenerate docs/input_handling.md from
the commands themselves, each in its own process as a user would type it::

    python tests/input_cases.py docs/input_handling.md
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WS = "{ws}"
"""Placeholder of the workspace folder in :attr:`Case.argv` (and in the table's messages)."""

QUICK_EVAL = ("--phases", "1", "--seeds", "0", "--seconds", "0.06", "--no-progress")
"""Options of a fast evaluation (the one the workspace runs, so that running it again finds its results)."""

TINY_SHAC = ("--shac.num-envs", "2", "--shac.horizon", "4", "--shac.critic-minibatches", "2", "--shac.actor-hidden",
             "16", "--shac.critic-hidden", "16", "--shac.critic-iterations", "2", "--no-progress", "--eval-every", "0",
             "--no-tensorboard")
"""A SHAC run of a few seconds (the workspace's run)."""


@dataclass(frozen=True)
class Case:
    """One bad input: what was tried, the ``bcg`` arguments (``{ws}``: the workspace) and a part of the expected
    one-line message."""

    what: str
    argv: tuple[str, ...]
    expect: str
    needs_no_gpu: bool = False
    """Only meaningful on a machine without a CUDA device."""

    def args(self, ws: Path) -> list[str]:
        return [a.replace(WS, str(ws)) for a in self.argv]


CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------------ motion files
    Case("empty CSV", ("motions", "inspect", "{ws}/empty.csv"), "the file holds no frames"),
    Case("CSV with 3 columns", ("motions", "inspect", "{ws}/cols.csv"), "expected 36 comma-separated columns"),
    Case("CSV with NaN", ("motions", "inspect", "{ws}/nan.csv"), "non-finite value in column(s) [0]"),
    Case("CSV with text in a row", ("motions", "inspect", "{ws}/text.csv"), "not a number"),
    Case("CSV with a non-unit quaternion", ("motions", "inspect", "{ws}/quat.csv"), "root quaternion is not unit"),
    Case("CSV declaring '# fps: -50'", ("motions", "inspect", "{ws}/neg.csv"), "declares fps '-50'"),
    Case("NPZ without the expected arrays", ("motions", "inspect", "{ws}/nokeys.npz"), "unknown NPZ layout"),
    Case("random bytes named .npz", ("motions", "inspect", "{ws}/noise.npz"), "not an NPZ archive"),
    Case("random bytes named .csv", ("motions", "inspect", "{ws}/noise.csv"), "not a text CSV"),
    Case("a folder named .csv", ("motions", "inspect", "{ws}/folder.csv"), "is a folder"),
    Case("a missing file", ("motions", "inspect", "{ws}/missing.csv"), "neither a packaged clip"),
    Case("--fps 0", ("motions", "inspect", "{ws}/good.csv", "--fps", "0"), "frame rate must be a finite value > 0"),
    Case("plot of a malformed file", ("motions", "plot", "{ws}/cols.csv", "--out", "{ws}/x.png"),
         "expected 36 comma-separated columns"),
    Case("plot of random bytes", ("motions", "plot", "{ws}/noise.npz", "--out", "{ws}/x.png"), "not an NPZ archive"),
    # ------------------------------------------------------------------ train: options
    Case("train on an unknown clip name", ("train", "--motion", "moonwalk"), "unknown motion 'moonwalk'"),
    Case("train on an existing but malformed file", ("train", "--motion", "{ws}/cols.csv", "--out", "{ws}/runs"),
         "expected 36 comma-separated columns"),
    Case("train --device foo", ("train", "--device", "foo"), "unknown device 'foo'"),
    Case("train --device cuda without a GPU", ("train", "--device", "cuda", "--out", "{ws}/runs"),
         "Warp finds no CUDA device", needs_no_gpu=True),
    Case("train --out naming a file", ("train", "--out", "{ws}/afile"), "is a file; expected a folder"),
    Case("train --out that cannot be created", ("train", "--out", "/proc/no/such", *TINY_SHAC),
         "cannot create the run directory"),
    Case("train --iterations 0", ("train", "--iterations", "0"), "iterations must be an integer >= 1"),
    Case("train --kappa -5", ("train", "--kappa", "-5"), "kappa must be a finite number > 0"),
    Case("train --contact-beta 2", ("train", "--contact-beta", "2"), "contact_beta must be a number in [0, 1]"),
    Case("train --contact-dropout 1.5", ("train", "--contact-dropout", "1.5"),
         "contact_dropout must be a number in [0, 1]"),
    Case("train --contact-dropout-range 0.5 0.2", ("train", "--contact-dropout-range", "0.5", "0.2"),
         "contact_dropout_range must be two numbers LO HI with 0 <= LO <= HI <= 1"),
    Case("train --soft-contact-timeconst 0.001", ("train", "--soft-contact-timeconst", "0.001"),
         "soft_contact_timeconst must be at least twice the physics substep"),
    Case("train --action-scale-torque 0", ("train", "--action-scale-torque", "0"),
         "action_scale_torque must be a finite number > 0"),
    Case("train --name of a folder with files but no checkpoint",
         ("train", "--out", "{ws}/runs", "--name", "notarun"), "choose another --name, or remove it"),
    Case("train --branch without --resume", ("train", "--branch"), "it needs --resume"),
    # ------------------------------------------------------------------ train: resume
    Case("resume from an older checkpoint of a run",
         ("train", "--resume", "{ws}/runs/run/checkpoints/iter_000003.pt", "--iterations", "4"),
         "has later checkpoints (iter_000004.pt, iter_000005.pt, iter_000006.pt)"),
    Case("resume a checkpoint copied outside its run", ("train", "--resume", "{ws}/D/ck.pt", "--iterations", "7"),
         "is not in a run's checkpoints/ folder"),
    Case("resume with --name", ("train", "--resume", "{ws}/runs/run", "--iterations", "7", "--name", "other"),
         "--name other would be ignored"),
    Case("resume with --out", ("train", "--resume", "{ws}/runs/run", "--iterations", "7", "--out", "{ws}/elsewhere"),
         "would be ignored: a resumed run stays in"),
    Case("resume with fewer iterations than done", ("train", "--resume", "{ws}/runs/run", "--iterations", "2"),
         "beyond --iterations 2"),
    Case("resume with another estimator", ("train", "--resume", "{ws}/runs/run", "--iterations", "7", "--estimator",
                                           "grs"), "estimator.name: checkpoint 'bptt', requested 'grs'"),
    Case("resume a path that does not exist", ("train", "--resume", "{ws}/nothing"), "does not exist"),
    Case("resume a file of random bytes", ("train", "--resume", "{ws}/noise.npz"), "is not a torch file"),
    Case("resume a zip archive that torch did not write", ("train", "--resume", "{ws}/nokeys.npz"),
         "is truncated or corrupt"),
    Case("resume a policy file", ("train", "--resume", "{ws}/runs/run/policy.pt"), "a policy export"),
    Case("resume after the clip file changed", ("train", "--resume", "{ws}/runs/changed", "--iterations", "3"),
         "has changed since the run recorded it"),
    # ------------------------------------------------------------------ evaluate, export, bench
    Case("evaluate --motion with an unknown name", ("evaluate", "{ws}/runs/run", "--motion", "moonwalk"),
         "motion 'moonwalk' is neither a packaged clip"),
    Case("evaluate --kappa -5", ("evaluate", "{ws}/runs/run", "--kappa", "-5"), "kappa must be a finite number > 0"),
    Case("evaluate --mujoco-refine 0", ("evaluate", "{ws}/runs/run", "--mujoco-refine", "0"),
         "mujoco_refine must be an integer >= 1"),
    Case("evaluate --out-dir naming a file", ("evaluate", "{ws}/runs/run", "--out-dir", "{ws}/afile"),
         "is a file; expected a folder for metrics.json"),
    Case("evaluate again with the same clip and options", ("evaluate", "{ws}/runs/run", *QUICK_EVAL),
         "pass --force to replace it"),
    Case("evaluate a run that does not exist", ("evaluate", "{ws}/nothing"), "neither a run directory"),
    Case("evaluate the baseline without --motion", ("evaluate", "reference"), "needs --motion"),
    Case("curve of a folder that is not a run", ("curve", "{ws}/runs/notarun"), "has no checkpoints/ folder"),
    Case("curve --every 0", ("curve", "{ws}/runs/run", "--every", "0"), "every must be an integer >= 1"),
    Case("curve --seeds -1", ("curve", "{ws}/runs/run", "--seeds", "-1"), "seeds must be one or more integers >= 0"),
    Case("curve --motion with an unknown name", ("curve", "{ws}/runs/run", "--motion", "moonwalk"),
         "motion 'moonwalk' is neither a packaged clip"),
    Case("export --out naming a folder", ("export", "{ws}/runs/run", "--out", "{ws}/D"), "is a folder; expected"),
    Case("export a folder without checkpoints", ("export", "{ws}/D"), "no checkpoint (iter_NNNNNN.pt)"),
    Case("bench --sizes 0", ("bench", "--sizes", "0"), "sizes must be integers >= 1"),
    Case("bench --steps 0", ("bench", "--steps", "0"), "steps must be an integer >= 1"),
)
"""Every bad input of docs/input_handling.md."""


def _write_motion_files(ws: Path) -> None:
    row = [0.0, 0.0, 0.8, 0.0, 0.0, 0.0, 1.0] + [0.0] * 29
    line = ",".join(map(str, row))
    bad_quat = ",".join(map(str, row[:3] + [0.0, 0.0, 0.0, 2.0] + row[7:]))
    rng = np.random.default_rng(0)
    (ws / "empty.csv").write_text("")
    (ws / "cols.csv").write_text("1,2,3\n")
    (ws / "nan.csv").write_text(f"# fps: 30\n{line}\n{line}\nnan{line[3:]}\n")
    (ws / "text.csv").write_text(f"# fps: 30\n{line}\nabc{line[3:]}\n")
    (ws / "quat.csv").write_text(f"# fps: 30\n{bad_quat}\n" * 3)
    (ws / "neg.csv").write_text("# fps: -50\n" + f"{line}\n" * 3)
    (ws / "good.csv").write_text("# fps: 30\n" + f"{line}\n" * 30)
    np.savez(ws / "nokeys.npz", foo=np.zeros(3))
    (ws / "noise.npz").write_bytes(rng.bytes(2000))
    (ws / "noise.csv").write_bytes(rng.bytes(2000))
    (ws / "folder.csv").mkdir()
    (ws / "afile").write_text("a file, not a folder\n")


def make_workspace(ws: Path) -> None:
    """Write the files the cases use into ``ws``: malformed motions, a trained run ``runs/run`` at iteration 6 (a
    checkpoint per iteration, evaluated once with :data:`QUICK_EVAL`), a run ``runs/changed`` whose clip was edited,
    a copy of a checkpoint in ``D`` beside files of the user's, and a folder ``runs/notarun`` with a file in it."""
    from bcg.cli import main
    from bcg.motion import load_motion

    ws.mkdir(parents=True, exist_ok=True)
    _write_motion_files(ws)
    runs = ws / "runs"
    assert main(["train", *TINY_SHAC, "--iterations", "6", "--checkpoint-every", "1", "--out", str(runs),
                 "--name", "run"]) == 0
    clip = load_motion("jump").save(ws / "myclip.npz")
    assert main(["train", *TINY_SHAC, "--iterations", "1", "--motion", str(clip), "--out", str(runs),
                 "--name", "changed"]) == 0
    clip.write_bytes(clip.read_bytes() + b"\0")
    assert main(["evaluate", str(runs / "run"), *QUICK_EVAL]) == 0
    (ws / "D").mkdir()
    shutil.copy(runs / "run" / "checkpoints" / "iter_000004.pt", ws / "D" / "ck.pt")
    (ws / "D" / "config.json").write_text("{}\n")
    (runs / "notarun").mkdir()
    (runs / "notarun" / "notes.txt").write_text("not a run\n")


def has_cuda() -> bool:
    import warp as wp

    wp.init()
    return bool(wp.is_cuda_available())


def _markdown(ws: Path, results: list[tuple[Case, int, list[str]]]) -> str:
    def cell(text: str) -> str:
        return text.replace(str(ws), "WS").replace("|", "\\|")

    rows = ["| what was tried | command | what `bcg` prints now (stderr) | exit |", "|---|---|---|---|"]
    for case, status, lines in results:
        message = "<br>".join(f"`{cell(line)}`" for line in lines)
        rows.append(f"| {case.what} | `bcg {cell(' '.join(case.argv).replace(WS, str(ws)))}` | {message} | {status} |")
    return "\n".join(rows) + "\n"


def run_all(ws: Path) -> list[tuple[Case, int, list[str]]]:
    """Run every case as ``python -m bcg.cli ...`` in its own process (cwd ``ws``); ``(case, status, stderr lines)``.
    Lines that Warp prints when it starts on a machine without a GPU are left out (they are not bcg's)."""
    repo = str(Path(__file__).resolve().parents[1])  # this checkout's bcg, whichever one is installed
    path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "BCG_DEBUG": "", "PYTHONPATH": path}
    results = []
    for case in CASES:
        p = subprocess.run([sys.executable, "-m", "bcg.cli", *case.args(ws)], cwd=ws, env=env, capture_output=True,
                           text=True, timeout=600)
        lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("Warp CUDA warning")]
        results.append((case, p.returncode, lines))
        print(f"{p.returncode:3d} {case.what}: {lines[-1] if lines else ''}", file=sys.stderr)
    return results


if __name__ == "__main__":  # regenerate the table of docs/input_handling.md
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's bcg, whichever one is installed

    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/input_handling.md")
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "WS"
        make_workspace(ws)
        table = _markdown(ws, run_all(ws))
    text = target.read_text()
    start, end = "<!-- table: generated by tests/input_cases.py -->\n", "<!-- end of table -->\n"
    target.write_text(text[:text.index(start) + len(start)] + table + text[text.index(end):])
    print(f"wrote {target}", file=sys.stderr)
