"""Standing under PD for 10 s on the smoothed impulse contact (kappa 50, 100, 300) beside MuJoCo: a figure and a table.

For every model: pelvis height over time, mean positive foot-sphere penetration, and the summed normal impulse of
the last second over the weight impulse m g x 1 s. Writes ``docs/img/standing_vs_mujoco.png`` (or ``--out``).

Usage::

    python benchmarks/standing_vs_mujoco.py [--seconds 10] [--out docs/img/standing_vs_mujoco.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bcg.evaluation.standing import stand_bcg, stand_mujoco


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("docs/img/standing_vs_mujoco.png"))
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"MuJoCo (h 5 ms)": stand_mujoco(args.seconds)}
    for kappa in (50.0, 100.0, 300.0):
        runs[f"bcg kappa {kappa:g}"] = stand_bcg(args.seconds, kappa=kappa)
    print(f"{'model':<18} {'pelvis z 1 s':>13} {'pelvis z end':>13} {'mean pen. 2nd half [mm]':>24} "
          f"{'impulse/weight (last s)':>24}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for name, r in runs.items():
        half = len(r.penetration) // 2
        i1 = int(np.searchsorted(r.t, 1.0))
        print(f"{name:<18} {r.z[i1]:>13.4f} {r.z[-1]:>13.4f} {1e3 * r.penetration[half:].mean():>24.2f} "
              f"{r.impulse_over_weight():>24.4f}")
        axes[0].plot(r.t, r.z, label=name)
        axes[1].plot(r.t, 1e3 * r.penetration, label=name)
    axes[0].set(xlabel="time [s]", ylabel="pelvis height [m]", title="Standing under PD (default pose)")
    axes[1].set(xlabel="time [s]", ylabel="mean foot-sphere penetration [mm]", title="Penetration")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
