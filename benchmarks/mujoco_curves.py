"""Learning curves in MuJoCo of the kept runs, one figure (the README's), from their ``bcg curve`` results.

Every run folder in ``benchmarks/results/stay_up/`` that holds a ``curve_CLIP.csv`` (the ``curve.csv`` that
``bcg curve RUN`` writes: each checkpoint replayed with ``bcg evaluate``'s protocol, 8 episodes through the whole
clip) becomes one line per simulator; one column per clip.

    python benchmarks/mujoco_curves.py [--dir benchmarks/results/stay_up] [--out docs/img/mujoco_curves.png]
        [--runs NAME ...] [--exclude NAME ...] [--sims mujoco bcg] [--x samples|wall_time_s]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bcg.evaluation.learning_curve import MEASURES, X_AXES, CurvePoint, plot_lines, read_curve
from bcg.evaluation.report import pyplot, save_figure, style_axis

ROOT = Path(__file__).resolve().parent


def gather(root: Path, names: list[str] | None, exclude: tuple[str, ...] = ()
           ) -> dict[str, dict[str, list[CurvePoint]]]:
    """``{clip: {run: points}}`` of the runs under ``root`` that have a curve (``names``: only these runs; ``exclude``:
    not these)."""
    out: dict[str, dict[str, list[CurvePoint]]] = {}
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        if (names and run.name not in names) or run.name in exclude:
            continue
        for csv_path in sorted(run.glob("curve_*.csv")):
            clip = csv_path.stem.removeprefix("curve_")
            out.setdefault(clip, {})[run.name] = read_curve(csv_path)
    return out


def plot(curves: dict[str, dict[str, list[CurvePoint]]], path: Path, sims: tuple[str, ...] = ("mujoco", "bcg"),
         x: str = "samples") -> Path:
    """Rows: fall rate, mean episode [s], E_track [cm] against ``x`` (samples, or training wall time for runs of
    different sizes with one budget); one column per clip. Solid: MuJoCo, dashed: our simulator (``sims``: which of
    the two to draw)."""
    plt = pyplot()
    order = ("run", "jump", "fight", "dance")  # the packaged clips first, in the paper's order; real clips after
    clips = sorted(curves, key=lambda c: (order.index(c) if c in order else len(order), c))
    fig, axes = plt.subplots(len(MEASURES), len(clips), figsize=(4.2 * len(clips), 8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, clip in enumerate(clips):
        for row, (ylabel, value) in enumerate(MEASURES):
            ax = axes[row][col]
            for k, (run, pts) in enumerate(curves[clip].items()):
                plot_lines(ax, run, pts, x, value, colors[k % len(colors)], sims)
            ax.set_ylabel(ylabel, fontsize=8)
            style_axis(ax)
            if row == 0:
                ax.set_title(clip, fontsize=9)
            if row == len(MEASURES) - 1:
                ax.set_xlabel(X_AXES[x], fontsize=8)
        axes[0][col].legend(fontsize=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=ROOT / "results" / "stay_up")
    ap.add_argument("--out", type=Path, default=ROOT.parent / "docs" / "img" / "mujoco_curves.png")
    ap.add_argument("--runs", nargs="*", default=None)
    ap.add_argument("--exclude", nargs="*", default=(), help="runs left out (with all runs)")
    ap.add_argument("--sims", nargs="+", choices=("mujoco", "bcg"), default=["mujoco", "bcg"])
    ap.add_argument("--x", choices=tuple(X_AXES), default="samples", help="the x axis")
    args = ap.parse_args()
    curves = gather(args.dir, args.runs, tuple(args.exclude))
    if not curves:
        raise SystemExit(f"no curve_*.csv under {args.dir} (run `bcg curve RUN` and copy its curve.csv there)")
    print(f"wrote {plot(curves, args.out, tuple(args.sims), args.x)}")


if __name__ == "__main__":
    main()
