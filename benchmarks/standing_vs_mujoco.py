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
import torch


def _bcg_run(kappa: float, seconds: float) -> dict:
    from bcg.robots import g1
    from bcg.sim import load_model, step

    model = load_model(kappa=kappa)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None]
    qd = torch.zeros(1, model.nv)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None]
    z, pen, imp = [], [], []
    with torch.no_grad():
        for _ in range(int(round(seconds / model.params.control_dt))):
            q, qd, rep = step(model, q, qd, targets)
            z.append(float(q[0, 2]))
            pen.append(float(rep.penetration.clamp(min=0).mean()))
            imp.append(float(rep.impulse.sum()))
    per_s = int(round(1 / model.params.control_dt))
    weight = model.total_mass * abs(model.gravity[2])
    t = np.arange(1, len(z) + 1) * model.params.control_dt
    return dict(t=t, z=np.array(z), pen=np.array(pen), balance=sum(imp[-per_s:]) / weight)


def _mujoco_run(seconds: float, dt: float) -> dict:
    import mujoco

    from bcg.robots import g1

    m = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))
    m.opt.timestep = dt
    d = mujoco.MjData(m)
    d.qpos[:] = g1.default_qpos()
    d.ctrl[:] = g1.DEFAULT_JOINT_POS
    spheres = [g for g in range(m.ngeom) if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE and m.geom_contype[g] > 0]
    per_step = 4
    z, pen, fz = [], [], []
    force = np.zeros(6)
    for _ in range(int(round(seconds / (dt * per_step)))):
        fsum = 0.0
        for _ in range(per_step):
            mujoco.mj_step(m, d)
            for c in range(d.ncon):
                mujoco.mj_contactForce(m, d, c, force)
                fsum += force[0] * dt
        z.append(float(d.qpos[2]))
        pen.append(np.mean([max(m.geom_size[g, 0] - d.geom_xpos[g, 2], 0.0) for g in spheres]))
        fz.append(fsum)
    per_s = int(round(1 / (dt * per_step)))
    weight = float(np.sum(m.body_mass)) * abs(m.opt.gravity[2])
    t = np.arange(1, len(z) + 1) * dt * per_step
    return dict(t=t, z=np.array(z), pen=np.array(pen), balance=sum(fz[-per_s:]) / weight)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("docs/img/standing_vs_mujoco.png"))
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"MuJoCo (h 5 ms)": _mujoco_run(args.seconds, 0.005)}
    for kappa in (50.0, 100.0, 300.0):
        runs[f"bcg kappa {kappa:g}"] = _bcg_run(kappa, args.seconds)
    print(f"{'model':<18} {'pelvis z 1 s':>13} {'pelvis z end':>13} {'mean pen. 2nd half [mm]':>24} "
          f"{'impulse/weight (last s)':>24}")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for name, r in runs.items():
        half = len(r["pen"]) // 2
        i1 = int(np.searchsorted(r["t"], 1.0))
        print(f"{name:<18} {r['z'][i1]:>13.4f} {r['z'][-1]:>13.4f} {1e3 * r['pen'][half:].mean():>24.2f} "
              f"{r['balance']:>24.4f}")
        axes[0].plot(r["t"], r["z"], label=name)
        axes[1].plot(r["t"], 1e3 * r["pen"], label=name)
    axes[0].set(xlabel="time [s]", ylabel="pelvis height [m]", title="Standing under PD (default pose)")
    axes[1].set(xlabel="time [s]", ylabel="mean foot-sphere penetration [mm]", title="Penetration")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
