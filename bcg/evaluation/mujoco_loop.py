"""The project's one MuJoCo PD loop: the G1 scene in C MuJoCo, one ``MjData`` per rollout, PD targets set once per
control step and ``substeps`` calls of ``mj_step`` after it.

The model is :data:`bcg.robots.g1.SCENE_PATH` (the MJCF our simulator is built from, on a ground plane) with MuJoCo's
own contacts (soft constraints, ``condim`` 3, pyramidal cones), its joint limits, the ``implicitfast`` integrator at
the 5 ms step of the MJCF, and its position actuators: ``ctrl`` is the joint target, the actuator applies
``kp (target - q) - kv qd`` clipped to its ``forcerange`` (the torque limits). Used by the contact scenarios
(:mod:`bcg.evaluation.contact_scenarios`), the throughput benchmarks and the sim-to-sim transfer
(:mod:`bcg.evaluation.mujoco_transfer`).

States are float64 in MuJoCo's layout (``qpos`` [nq = 36]: base position, base quaternion w x y z, 29 hinges;
``qvel`` [nv = 35]: base linear velocity in the world frame, base angular velocity in the body frame, hinge rates).
Per-sphere contact quantities follow :data:`bcg.robots.g1.FOOT_SPHERES` (8 spheres, 4 per foot, left foot first),
the same order and meaning as :class:`bcg.sim.ContactReport`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import mujoco

__all__ = ["MujocoContact", "MujocoLoop", "MujocoStep", "per_foot"]


class MujocoContact(NamedTuple):
    """Per-sphere contact quantities of one control step, float64 [K, nc] (nc = 8 foot spheres)."""

    impulse: np.ndarray
    """Normal contact impulse summed over the substeps [N s] (``mj_contactForce`` normal component x timestep)."""
    peak_force: np.ndarray
    """Largest normal contact force over the substeps [N]."""
    penetration: np.ndarray
    """Sphere radius minus sphere-centre height after the last substep [m] (positive when penetrating the floor)."""


class MujocoStep(NamedTuple):
    """State after one control step of K rollouts (float64)."""

    qpos: np.ndarray
    """[K, nq] positions."""
    qvel: np.ndarray
    """[K, nv] velocities."""
    contact: MujocoContact | None
    """Per-sphere contact quantities, or None when the step was asked not to measure them."""


def per_foot(x: np.ndarray, reduce: str = "sum") -> np.ndarray:
    """Reduce a per-sphere array [..., 8] to per foot [..., 2] (left, right) by ``"sum"``, ``"max"`` or ``"mean"``."""
    if x.shape[-1] != 8:
        raise ValueError(f"per_foot expects 8 foot spheres in the last dimension, got shape {x.shape}")
    feet = x.reshape(*x.shape[:-1], 2, 4)
    if reduce not in ("sum", "max", "mean"):
        raise ValueError(f"reduce must be 'sum', 'max' or 'mean', got {reduce!r}")
    return getattr(feet, reduce)(-1)


class MujocoLoop:
    """``num_envs`` independent G1 rollouts in C MuJoCo under joint-position PD.

    Args:
        num_envs: number of rollouts K (one ``MjData`` each).
        substeps: ``mj_step`` calls per control step (the targets are held over them).
        timestep: physics step [s] (the MJCF's is 5 ms).
        scene: the MJCF to load (default :data:`bcg.robots.g1.SCENE_PATH`).

    Every rollout starts in the default standing pose at rest; :meth:`set_state` replaces rows.
    """

    def __init__(self, num_envs: int = 1, substeps: int = 4, timestep: float = 0.005, scene: str | Path | None = None):
        import mujoco

        from bcg.robots import g1

        if int(num_envs) < 1 or int(substeps) < 1:
            raise ValueError(f"num_envs and substeps must be integers >= 1, got {num_envs!r} and {substeps!r}")
        if not (np.isfinite(timestep) and timestep > 0):
            raise ValueError(f"timestep must be a finite value > 0 [s], got {timestep!r}")
        self._mj = mujoco
        self.model: mujoco.MjModel = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH if scene is None else scene))
        self.model.opt.timestep = float(timestep)
        if self.model.opt.integrator != mujoco.mjtIntegrator.mjINT_IMPLICITFAST:
            raise ValueError(f"{scene}: the MJCF must use the implicitfast integrator (the project's MuJoCo "
                             f"reference), it uses {mujoco.mjtIntegrator(self.model.opt.integrator).name}")
        m = self.model
        self.num_envs, self.substeps, self.timestep = int(num_envs), int(substeps), float(timestep)
        self.nq, self.nv, self.nu = int(m.nq), int(m.nv), int(m.nu)
        # foot spheres in FOOT_SPHERES order (their MJCF names), and the sphere index of every geom (-1: none)
        names = [f"{side}_foot_sphere_{k}" for side in ("left", "right") for k in range(4)]
        self.sphere_geoms = np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n) for n in names])
        if (self.sphere_geoms < 0).any():
            missing = [n for n, g in zip(names, self.sphere_geoms, strict=True) if g < 0]
            raise ValueError(f"the MJCF lacks the foot sphere geoms {missing}")
        self.sphere_radius = m.geom_size[self.sphere_geoms, 0].copy()
        self._sphere_of_geom = np.full(m.ngeom, -1)
        self._sphere_of_geom[self.sphere_geoms] = np.arange(len(names))
        self.datas: list[mujoco.MjData] = [mujoco.MjData(m) for _ in range(self.num_envs)]
        q0 = g1.default_qpos()
        for d in self.datas:
            d.qpos[:] = q0
            d.ctrl[:] = g1.DEFAULT_JOINT_POS
        self._force = np.zeros(6)

    # ------------------------------------------------------------------------------------------------ state

    def _rows(self, rows: np.ndarray | list[int] | None, k: int | None = None) -> np.ndarray:
        idx = np.arange(self.num_envs) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_envs):
            raise IndexError(f"rows must lie in [0, {self.num_envs}), got {idx.tolist()[:8]}")
        if k is not None and idx.size != k:
            raise ValueError(f"{k} rows of values for {idx.size} rollouts")
        return idx

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray, rows: np.ndarray | list[int] | None = None) -> None:
        """Start rollouts ``rows`` (default: all) afresh at ``qpos`` [K, nq], ``qvel`` [K, nv] (solver warm start and
        time cleared, as a new episode)."""
        qpos = np.asarray(qpos, dtype=np.float64).reshape(-1, self.nq)
        qvel = np.asarray(qvel, dtype=np.float64).reshape(-1, self.nv)
        if len(qpos) != len(qvel):
            raise ValueError(f"qpos has {len(qpos)} rows, qvel {len(qvel)}")
        if not (np.isfinite(qpos).all() and np.isfinite(qvel).all()):
            raise ValueError("set_state: qpos and qvel must be finite")
        for k, i in enumerate(self._rows(rows, len(qpos))):
            d = self.datas[i]
            ctrl = d.ctrl.copy()
            self._mj.mj_resetData(self.model, d)
            d.qpos[:] = qpos[k]
            d.qvel[:] = qvel[k]
            d.ctrl[:] = ctrl

    def qpos(self, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
        """[K, nq] float64 copy of the positions of ``rows`` (default: all)."""
        return np.stack([self.datas[i].qpos.copy() for i in self._rows(rows)])

    def qvel(self, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
        """[K, nv] float64 copy of the velocities of ``rows`` (default: all)."""
        return np.stack([self.datas[i].qvel.copy() for i in self._rows(rows)])

    # ------------------------------------------------------------------------------------------------ step

    def step(self, targets: np.ndarray, rows: np.ndarray | list[int] | None = None,
             contacts: bool = True) -> MujocoStep:
        """One control step of rollouts ``rows`` (default: all): ``ctrl = targets`` [K, nu] (joint targets [rad]),
        then ``substeps`` x ``mj_step``. ``contacts=False`` skips the contact measurement (benchmarks)."""
        mj, m = self._mj, self.model
        targets = np.asarray(targets, dtype=np.float64).reshape(-1, self.nu)
        idx = self._rows(rows, len(targets))
        if not np.isfinite(targets).all():
            raise ValueError("step: the PD targets must be finite")
        k, nc, dt = len(idx), len(self.sphere_geoms), self.timestep
        qpos, qvel = np.empty((k, self.nq)), np.empty((k, self.nv))
        if contacts:
            impulse, peak, pen = np.zeros((k, nc)), np.zeros((k, nc)), np.empty((k, nc))
        f, sphere_of = self._force, self._sphere_of_geom
        for r, i in enumerate(idx):
            d = self.datas[i]
            d.ctrl[:] = targets[r]
            if not contacts:
                mj.mj_step(m, d, nstep=self.substeps)
            else:
                for _ in range(self.substeps):
                    mj.mj_step(m, d)
                    # contacts of this substep (detected at its start) and the constraint forces it applied
                    normal = np.zeros(nc)
                    for c in range(d.ncon):
                        con = d.contact[c]
                        s = max(sphere_of[con.geom1], sphere_of[con.geom2])
                        if s >= 0:
                            mj.mj_contactForce(m, d, c, f)  # contact frame: f[0] is the normal component
                            normal[s] += f[0]
                    impulse[r] += normal * dt
                    np.maximum(peak[r], normal, out=peak[r])
                mj.mj_kinematics(m, d)  # positions of the end of the step (mj_step leaves those of its start)
                pen[r] = self.sphere_radius - d.geom_xpos[self.sphere_geoms, 2]
            qpos[r] = d.qpos
            qvel[r] = d.qvel
        return MujocoStep(qpos, qvel, MujocoContact(impulse, peak, pen) if contacts else None)
