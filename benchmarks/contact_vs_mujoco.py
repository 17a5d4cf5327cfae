"""Contact against C MuJoCo: standing (10 s), a 5 cm drop, a 0.5 m/s sideways slide, a 2 rad/s spin and a jump's
push-off, bcg at several kappa and with MuJoCo's PD law.

Runs every scenario of :mod:`bcg.evaluation.contact_scenarios` in MuJoCo (its own contacts at the MJCF's 5 ms step,
and at 1 ms: ``--mujoco-refine``, where its push-off converges) and in bcg.sim at
each ``--kappa`` (N = 1, CPU), prints a table of the compared metrics (the quantities
``tests/test_sim_contact_mujoco.py`` bounds) and writes one figure with the scenarios side by side
(``docs/img/contact_vs_mujoco.png`` or ``--out``): pelvis height on top; below it the mean foot-sphere penetration
(stand), the deepest sphere's penetration (drop) and the horizontal distance moved by the feet and the pelvis
(slide); a fourth column shows the standing drift (pelvis x) and the feet's creep, a fifth the heading turned by the
pelvis (top) and the feet (below) in the spin, a sixth the centre of mass's height (top) and vertical velocity
(below) in the push-off. The last row is bcg at the default kappa with the PD law's position term at the start of
the substep, as MuJoCo's position actuators read it (``pd_lookahead=False``, docs/simulator.md).

Usage::

    python benchmarks/contact_vs_mujoco.py [--kappa 50 100 300] [--mujoco-refine 5] [--stand-seconds 10]
        [--out FIGURE.png]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from bcg.evaluation.contact_scenarios import (
    DROP,
    PUSH,
    SLIDE,
    SPIN,
    STAND,
    ContactTrace,
    metrics,
    run_bcg,
    run_mujoco,
)

# metric -> (column header, scale to the printed unit)
_UNITS = {"penetration": ("mm", 1e3), "pelvis_z": ("m", 1.0), "height": ("m", 1.0), "pelvis": ("mm", 1e3),
          "drift": ("mm", 1e3), "feet": ("mm", 1e3), "creep": ("mm/s", 1e3), "time": ("s", 1.0),
          "impulse": ("", 1.0), "speed": ("m/s", 1.0), "rise": ("m", 1.0), "lift_off": ("s", 1.0)}


def _unit(metric: str, scenario: str = "") -> tuple[str, float]:
    if scenario == SPIN.name:  # every spin metric is a heading
        return "mrad", 1e3
    if scenario == PUSH.name and metric == "push_impulse":
        return "N s", 1.0
    for key, unit in _UNITS.items():
        if key in metric:
            return unit
    return "", 1.0


def print_table(runs: dict[str, dict[str, ContactTrace]]) -> None:
    """One markdown table per scenario: a row per model, a column per metric (in printed units)."""
    for scenario in next(iter(runs.values())):
        rows = {model: metrics(traces[scenario]) for model, traces in runs.items()}
        units = {n: _unit(n, scenario) for n in next(iter(rows.values()))}
        heads = [f"{n} [{unit}]" if unit else n for n, (unit, _) in units.items()]
        print(f"\n{scenario}\n| model | " + " | ".join(heads) + " |")
        print("|---|" + "---|" * len(units))
        for model, row in rows.items():
            cells = []
            for n, (_, scale) in units.items():
                v = row[n] * scale
                cells.append(f"{v:.4f}" if abs(v) < 10 else f"{v:.1f}")
            print(f"| {model} | " + " | ".join(cells) + " |")


def plot(runs: dict[str, dict[str, ContactTrace]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 6, figsize=(26, 6.4), sharex="col")
    for model, traces in runs.items():
        # MuJoCo at the MJCF's 5 ms step in black, at finer steps in grey
        style = (dict(color="k" if "(5 ms)" in model else "0.55", lw=2.0, alpha=0.6) if model.startswith("MuJoCo")
                 else dict(lw=1.0))
        st, dr, sl = traces[STAND.name], traces[DROP.name], traces[SLIDE.name]
        axes[0, 0].plot(st.t, st.pelvis[:, 2], label=model, **style)
        axes[1, 0].plot(st.t, 1e3 * np.clip(st.penetration, 0, None).mean(1), label=model, **style)
        axes[0, 1].plot(dr.t, dr.pelvis[:, 2], label=model, **style)
        axes[1, 1].plot(dr.t, 1e3 * dr.penetration.max(1), label=model, **style)
        axes[0, 2].plot(sl.t, sl.pelvis[:, 2], label=model, **style)
        line, = axes[1, 2].plot(sl.t, 1e3 * np.linalg.norm(sl.feet[:, :2] - sl.start_feet[:2], axis=1),
                                label=f"{model} feet", **style)
        axes[1, 2].plot(sl.t, 1e3 * np.linalg.norm(sl.pelvis[:, :2] - sl.start_pelvis[:2], axis=1),
                        ls="--", color=line.get_color(), lw=style["lw"], alpha=style.get("alpha", 1.0))
        # the standing drift (forward lean, signed along x) and the feet's creep
        axes[0, 3].plot(st.t, 1e3 * (st.pelvis[:, 0] - st.start_pelvis[0]), label=model, **style)
        axes[1, 3].plot(st.t, 1e3 * np.linalg.norm(st.feet[:, :2] - st.start_feet[:2], axis=1), label=model, **style)
        sp = traces[SPIN.name]
        axes[0, 4].plot(sp.t, 1e3 * (sp.pelvis_yaw - sp.start_pelvis_yaw), label=model, **style)
        axes[1, 4].plot(sp.t, 1e3 * (sp.feet_yaw - sp.start_feet_yaw), label=model, **style)
        pu = traces[PUSH.name]
        axes[0, 5].plot(pu.t, pu.com[:, 2], label=model, **style)
        axes[1, 5].plot(pu.t, np.gradient(pu.com[:, 2], pu.t), label=model, **style)
    axes[0, 0].set(title=f"stand ({STAND.seconds:g} s, PD at the default pose)", ylabel="pelvis height [m]")
    axes[1, 0].set(xlabel="time [s]", ylabel="mean sphere penetration [mm]")
    axes[0, 1].set(title=f"drop from {100 * DROP.height:g} cm", ylabel="pelvis height [m]")
    # the drop starts 50 mm above the ground: show the landing, not the fall
    axes[1, 1].set(xlabel="time [s]", ylabel="deepest sphere penetration [mm]", ylim=(-4.0, None))
    axes[0, 2].set(title=f"slide, {SLIDE.velocity[1]:g} m/s sideways", ylabel="pelvis height [m]")
    axes[1, 2].set(xlabel="time [s]", ylabel="horizontal distance [mm]\n(solid feet, dashed pelvis)")
    axes[0, 3].set(title="stand: drift", ylabel="pelvis x - start [mm] (+ forward)")
    axes[1, 3].set(xlabel="time [s]", ylabel="feet horizontal distance from start [mm]")
    axes[0, 4].set(title=f"spin, {SPIN.yaw_rate:g} rad/s about the vertical", ylabel="pelvis heading turned [mrad]")
    axes[1, 4].set(xlabel="time [s]", ylabel="feet heading turned [mrad]")
    axes[0, 5].set(title="push-off: crouch, then legs straight at once", ylabel="centre-of-mass height [m]")
    axes[1, 5].set(xlabel="time [s]", ylabel="centre-of-mass vertical velocity [m/s]", xlim=(0.8, PUSH.seconds))
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"\nwrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kappa", type=float, nargs="+", default=[50.0, 100.0, 300.0])
    parser.add_argument("--mujoco-refine", type=int, nargs="*", default=[5],
                        help="also MuJoCo with this many steps per 5 ms (5: 1 ms steps)")
    parser.add_argument("--stand-seconds", type=float, default=STAND.seconds)
    parser.add_argument("--out", type=Path, default=Path("docs/img/contact_vs_mujoco.png"))
    args = parser.parse_args(argv)

    scenarios = (replace(STAND, seconds=args.stand_seconds), DROP, SLIDE, SPIN, PUSH)
    runs = {"MuJoCo (5 ms)": {s.name: run_mujoco(s) for s in scenarios}}
    for refine in args.mujoco_refine:
        runs[f"MuJoCo ({5 / refine:g} ms)"] = {s.name: run_mujoco(s, refine=refine) for s in scenarios}
    for kappa in args.kappa:
        runs[f"bcg kappa {kappa:g}"] = {s.name: run_bcg(s, kappa=kappa) for s in scenarios}
    runs["bcg, MuJoCo's PD law"] = {s.name: run_bcg(s, pd_lookahead=False) for s in scenarios}
    print_table(runs)
    plot(runs, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
