"""Every results table and figure of the README and docs/ that comes from kept training runs, regenerated in one go.

The runs live in ``benchmarks/results/stay_up/RUN/`` (``config.json``, ``metrics.csv``, ``eval_CLIP.json`` and, where
``bcg curve`` ran, ``curve_CLIP.csv``). This script runs, in order:

1. ``benchmarks/transfer_tables.py --write docs/shac.md README.md docs/learning_throughput.md docs/evaluation.md``
   (the whole-clip transfer tables);
2. ``bcg study methods`` on the default runs of the four clips (Q3, Q4) -> ``benchmarks/results/study_methods`` and
   ``docs/img/study_methods*.png``, and on the methods' runs of 3600 s -> ``benchmarks/results/study_methods_3600``
   and ``docs/img/study_methods_3600*.png``;
3. ``bcg study stiffness`` on the dance runs at four stiffnesses (Q1) -> ``benchmarks/results/stiffness_dance`` and
   ``docs/img/study_stiffness_dance.png``;
4. ``benchmarks/mujoco_curves.py`` for the curve figures of docs/shac.md and docs/learning_throughput.md;

then copies the study figures into ``docs/img`` and quotes the studies' tables (``methods.md``'s Q3 and Q4) into the
pages that mark them with ``<!-- study_tables:NAME -->`` ... ``<!-- /study_tables:NAME -->`` (README.md,
docs/studies.md), and writes the study commands docs/studies.md shows (``<!-- study_command:NAME -->``) from the same
run lists.

    python benchmarks/regenerate_results.py            # about a minute; needs only the kept files
    python benchmarks/regenerate_results.py --list     # the commands, without running them
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from transfer_tables import METHODS_3600, WINDOW_SIZE, write_into  # the sibling script (on sys.path when run)

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "benchmarks" / "results" / "stay_up"
IMG = ROOT / "docs" / "img"

METHOD_RUNS: tuple[str, ...] = (
    "ts-bcg-run-s0", "ts-bcg-run-s1", "ts-bptt-run-s0", "ts-bptt-run-s1", "ts-ppo-run-s0", "ts-ppo-run-s1",
    "def60-bcg-jump-s0", "def60-bcg-jump-s1", "def60-bptt-jump-s0", "def60-bptt-jump-s1", "def60-ppo-jump-s0",
    "def60-ppo-jump-s1",
    "def-bcg-fight-s0", "def-bcg-fight-s1", "def-bcg-dance-s0", "def-bcg-dance-s1",
    "def20-bcg-fight-new-s0", "def20-bcg-fight-fix-s1", "def20-bptt-fight-s0", "def20-bptt-fight-s1",
    "def20-ppo-fight-s0", "def20-ppo-fight-s1",
    "def20-bcg-dance-new-s0", "def20-bcg-dance-fix-s1", "def20-bptt-dance-s0", "def20-bptt-dance-s1",
    "def20-ppo-dance-s0", "def20-ppo-dance-s1",
    # third seeds
    "ts-bcg-run-s2", "ts-bptt-run-s2", "ts-ppo-run-s2", "def20-bcg-fight-s2", "def20-bptt-fight-s2",
    "def20-ppo-fight-s2", "def20-bcg-dance-s2", "def20-bptt-dance-s2", "def20-ppo-dance-s2",
    "def60-bcg-jump-s2", "def60-bptt-jump-s2", "def60-ppo-jump-s2",
)
"""`bcg train`'s default settings per clip and method (run, fight, dance 1200 s; jump 3600 s); runs of the earlier
default (a failure credited to the end of its episode) and of today's are labelled apart by the study."""

METHOD_RUNS_3600: tuple[str, ...] = tuple(name for groups in METHODS_3600.values() for _, names in groups
                                          for name in names)
"""Each method's default for 3600 s, one run at a time (the runs of transfer_tables.METHODS_3600, every clip)."""

STIFFNESS_RUNS: tuple[str, ...] = (
    "k50-bcg-dance-s0", "k50-bcg-dance-s1", "k100-bcg-dance-s0", "k100-bcg-dance-s1", "def-bcg-dance-s0",
    "def-bcg-dance-s1",
    "k1000-bcg-dance-s0", "k1000-bcg-dance-s1",
)
"""SHAC+BCG on the dance, 1200 s, at kappa = 50, 100, 300 (the default runs) and 1000."""

NXH_RUNS: tuple[str, ...] = tuple(name for _, names in WINDOW_SIZE for name in names)
"""SHAC+BCG on the run clip, 1200 s, at four sizes of cpu-small's window (environments x steps), the runs of
transfer_tables.WINDOW_SIZE: docs/learning_throughput.md."""

CURVE_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mujoco_curves.png", ()),  # every kept run with a curve but the window-size runs (a figure of their own)
    ("mujoco_curves_jump_methods.png", ("def60-bcg-jump-s0", "def60-bcg-jump-s1", "def60-bcg-jump-s2",
                                        "def60-bptt-jump-s0", "def60-bptt-jump-s1", "def60-bptt-jump-s2",
                                        "def60-ppo-jump-s0", "def60-ppo-jump-s1", "def60-ppo-jump-s2")),
    ("mujoco_curves_jazzwalk_credit.png", ("def60-bcg-jazzwalk-s0", "def60-bcg-jazzwalk-s1",
                                           "def60-bcg-jazzwalk-credit-s0", "def60-bcg-jazzwalk-credit-s1")),
    ("mujoco_curves_spinkarate.png", ("def60-bcg-spinkarate-credit-s0", "def60-bcg-spinkarate-credit-s1",
                                      "def120-bcg-spinkarate-credit-s0", "hd120-bcg-spinkarate-crtlr-s0",
                                      "hd120-bcg-spinkarate-crtlr-s1", "solo60-bcg-spinkarate-s0",
                                      "solo60-bcg-spinkarate-s1")),
)
"""docs/shac.md's curve figures: (file under docs/img, runs; empty: all)."""


STUDY_TABLES: dict[str, tuple[str, str]] = {
    "methods_q4": ("study_methods", "Tracking after transfer (Q4)"),
    "methods_q3": ("study_methods", "Samples to reach PPO's final point (Q3)"),
    "methods_3600_q4": ("study_methods_3600", "Tracking after transfer (Q4)"),
    "methods_3600_q3": ("study_methods_3600", "Samples to reach PPO's final point (Q3)"),
    "methods_3600_q3_worst": ("study_methods_3600", "Samples to reach any of PPO's checkpoints (Q3, worst case)"),
}
"""The study tables the pages quote, by marker name: (study folder under benchmarks/results, heading in methods.md)."""
QUOTING_PAGES: tuple[str, ...] = ("README.md", "docs/studies.md")
STUDY_COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "methods_3600": (METHOD_RUNS_3600, "benchmarks/results/study_methods_3600"),
}
"""The `bcg study methods` commands COMMAND_PAGE shows and this script runs, by marker name: (runs, output folder)."""
COMMAND_PAGE = "docs/studies.md"


def section_table(markdown: str, heading: str) -> str:
    """The first Markdown table under the heading (any level) named ``heading`` of ``markdown``; a one-line error if
    the heading or its table is missing."""
    lines = markdown.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip() == heading)
    except StopIteration:
        raise SystemExit(f"regenerate_results: no heading {heading!r} in a study's methods.md") from None
    rows: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    if not rows:
        raise SystemExit(f"regenerate_results: no table under {heading!r} in a study's methods.md")
    return "\n".join(rows)


def quote_study_tables(results: Path, pages: tuple[Path, ...]) -> dict[str, list[str]]:
    """Write the STUDY_TABLES read from ``results/STUDY/methods.md`` into the marked places of ``pages``; returns the
    names replaced per page."""
    found = {name: (heading, section_table((results / study / "methods.md").read_text(), heading))
             for name, (study, heading) in STUDY_TABLES.items()}
    return {str(page): write_into(page, found, kind="study_tables") for page in pages}


def kept_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``names`` that are kept, in order (the runs a study command actually gets)."""
    return tuple(n for n in names if (KEPT / n).is_dir())


def kept(names: tuple[str, ...]) -> list[str]:
    """The paths (from the repository root) of the runs ``names`` that are kept (a run not kept yet is left out)."""
    return [str((KEPT / n).relative_to(ROOT)) for n in kept_names(names)]


def study_command(runs: tuple[str, ...], out: str, width: int = 100) -> str:
    """The ``bcg study methods`` command over ``runs`` (names under the kept folder), as the fenced bash block a page
    shows (wrapped at ``width`` characters, the kept folder as ``$K``)."""
    lines, line = [], "bcg study methods --runs"
    for run in runs:
        word = f"$K/{run}"
        if len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    lines += [line + " \\", f"    --out {out}    # python benchmarks/regenerate_results.py runs this"]
    return "\n".join(["```bash", f"K={KEPT.relative_to(ROOT)}", *lines, "```"])


def commands() -> list[list[str]]:
    """The commands, in order (argv lists, run from the repository root)."""
    py, bcg = sys.executable, [sys.executable, "-m", "bcg.cli"]
    out = [[py, "benchmarks/transfer_tables.py", "--write", "docs/shac.md", "README.md",
            "docs/learning_throughput.md", "docs/evaluation.md"],
           [*bcg, "study", "methods", "--runs", *kept(METHOD_RUNS), "--out", "benchmarks/results/study_methods"],
           *([*bcg, "study", "methods", "--runs", *kept(runs), "--out", out] for runs, out in STUDY_COMMANDS.values()),
           [*bcg, "study", "stiffness", "--runs", *kept(STIFFNESS_RUNS), "--out",
            "benchmarks/results/stiffness_dance"]]
    for name, runs in CURVE_FIGURES:
        out.append([py, "benchmarks/mujoco_curves.py", "--sims", "mujoco", "--out", str(IMG / name),
                    *(["--runs", *runs] if runs else ["--exclude", *NXH_RUNS])])
    if kept(NXH_RUNS):
        out.append([py, "benchmarks/mujoco_curves.py", "--sims", "mujoco", "--x", "wall_time_s", "--out",
                    str(IMG / "mujoco_curves_run_window_size.png"), "--runs", *NXH_RUNS])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the commands instead of running them")
    args = ap.parse_args()
    for cmd in commands():
        shown = " ".join(Path(c).name if c == sys.executable else c for c in cmd).replace(str(ROOT) + "/", "")
        print(f"$ {shown}", flush=True)
        if not args.list:
            subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if args.list:
        return
    for src, dst in (("study_methods/study_methods.png", "study_methods.png"),
                     ("study_methods/study_methods_wall_time.png", "study_methods_wall_time.png"),
                     ("study_methods_3600/study_methods.png", "study_methods_3600.png"),
                     ("study_methods_3600/study_methods_wall_time.png", "study_methods_3600_wall_time.png"),
                     ("stiffness_dance/study_stiffness.png", "study_stiffness_dance.png")):
        shutil.copy(ROOT / "benchmarks" / "results" / src, IMG / dst)
    print("copied the study figures into docs/img")
    for page, names in quote_study_tables(ROOT / "benchmarks" / "results",
                                          tuple(ROOT / page for page in QUOTING_PAGES)).items():
        print(f"{Path(page).relative_to(ROOT)}: quoted {', '.join(names) or 'nothing (no markers)'}")
    shown = {name: ("", study_command(kept_names(runs), out)) for name, (runs, out) in STUDY_COMMANDS.items()}
    written = write_into(ROOT / COMMAND_PAGE, shown, kind="study_command")
    print(f"{COMMAND_PAGE}: wrote the commands {', '.join(written) or 'nothing (no markers)'}")


if __name__ == "__main__":
    main()
