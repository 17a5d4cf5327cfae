"""Standing under PD at the default pose, in the bcg simulator and in MuJoCo: the traces both the tests and the
``standing_vs_mujoco`` benchmark compare."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["StandingTrace", "stand_bcg", "stand_mujoco"]


@dataclass(frozen=True)
class StandingTrace:
    """Per control step (20 ms) of one environment: time [s], pelvis height [m], mean positive foot-sphere
    penetration [m] and summed normal impulse [N s]; ``weight`` is m g [N]."""

    t: np.ndarray
    z: np.ndarray
    penetration: np.ndarray
    impulse: np.ndarray
    weight: float

    def impulse_over_weight(self, seconds: float = 1.0) -> float:
        """Normal impulse of the last ``seconds`` over the weight impulse m g x seconds (1 = balanced)."""
        dt = float(self.t[1] - self.t[0])
        k = int(round(seconds / dt))
        return float(self.impulse[-k:].sum() / (self.weight * seconds))


def stand_bcg(seconds: float = 10.0, **params: float) -> StandingTrace:
    """Our simulator (``params`` go to :func:`bcg.sim.load_model`, e.g. ``kappa``), targets = default pose."""
    import torch

    from bcg.robots import g1
    from bcg.sim import load_model, step

    model = load_model(**params)
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
    t = np.arange(1, len(z) + 1) * model.params.control_dt
    return StandingTrace(t, np.array(z), np.array(pen), np.array(imp),
                         model.total_mass * abs(float(model.gravity[2])))


def stand_mujoco(seconds: float = 10.0, dt: float = 0.005, substeps: int = 4) -> StandingTrace:
    """C MuJoCo on our scene (its own soft contacts, ``implicitfast``), sampled every ``substeps`` steps."""
    import mujoco

    from bcg.robots import g1

    m = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))
    m.opt.timestep = dt
    d = mujoco.MjData(m)
    d.qpos[:] = g1.default_qpos()
    d.ctrl[:] = g1.DEFAULT_JOINT_POS
    spheres = [g for g in range(m.ngeom) if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE and m.geom_contype[g] > 0]
    z, pen, imp = [], [], []
    force = np.zeros(6)
    for _ in range(int(round(seconds / (dt * substeps)))):
        total = 0.0
        for _ in range(substeps):
            mujoco.mj_step(m, d)
            for c in range(d.ncon):
                mujoco.mj_contactForce(m, d, c, force)
                total += force[0] * dt
        z.append(float(d.qpos[2]))
        pen.append(float(np.mean([max(m.geom_size[g, 0] - d.geom_xpos[g, 2], 0.0) for g in spheres])))
        imp.append(total)
    t = np.arange(1, len(z) + 1) * dt * substeps
    weight = float(np.sum(m.body_mass)) * abs(float(m.opt.gravity[2]))
    return StandingTrace(t, np.array(z), np.array(pen), np.array(imp), weight)
