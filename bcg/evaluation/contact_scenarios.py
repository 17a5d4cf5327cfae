"""Contact scenarios run in the bcg simulator and in C MuJoCo from the same initial state with the same PD targets:
standing, a drop onto the feet, a sideways slide and a spin about the vertical (the default pose held), and a jump's
push-off (targets following keyframes). The traces and metrics serve both the tests
(``tests/test_sim_contact_mujoco.py``, ``tests/test_sim_contact.py``, ``tests/test_sim_pd_law.py``) and
``benchmarks/contact_vs_mujoco.py``.

Both simulators are sampled at every 5 ms physics step, and every geometric quantity (pelvis and foot positions,
sphere penetrations) is computed from the recorded ``qpos`` with MuJoCo's own forward kinematics
(:func:`mujoco.mj_kinematics` on :data:`bcg.robots.g1.SCENE_PATH`), so the two traces are measured by one and the
same code and differ only in their dynamics. MuJoCo keeps its own contact model (soft constraints, ``condim`` 3,
pyramidal cones, ``implicitfast``); its joint limits and actuator force ranges are active as in the MJCF.

All positions are in metres, times in seconds, impulses in N s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import mujoco

    from bcg.sim import Physics, SimModel

__all__ = [
    "DROP",
    "PUSH",
    "PUSH_START",
    "SCENARIOS",
    "SLIDE",
    "SPIN",
    "STAND",
    "ContactTrace",
    "Scenario",
    "metrics",
    "run_bcg",
    "run_bcg_batch",
    "run_mujoco",
]

DT = 0.005
"""Physics step of both simulators [s] (the G1 MJCF's timestep and bcg's default substep)."""


@functools.lru_cache(maxsize=16)
def _keyframe_table(keyframes: tuple[tuple[float, tuple[tuple[str, float], ...]], ...]) -> tuple[
        np.ndarray, np.ndarray]:
    """(times [K + 1] s, offsets [K + 1, 29] rad, read-only) of :attr:`Scenario.keyframes`, with the default pose
    (zero offset) at t = 0 ahead of them (at t = -1 when the first keyframe is at 0, so that it governs), resolved
    once per schedule rather than at every step."""
    from bcg.robots import g1

    frames = [np.zeros(len(g1.JOINT_NAMES))]
    for _, offsets in keyframes:
        off = np.zeros(len(g1.JOINT_NAMES))
        for suffix, value in offsets:
            hit = [j for j, name in enumerate(g1.JOINT_NAMES) if name.endswith(suffix)]
            if not hit:
                raise ValueError(f"Scenario.keyframes: no G1 joint name ends with {suffix!r}")
            off[hit] = value
        frames.append(off)
    times = np.array([0.0 if keyframes[0][0] > 0 else -1.0] + [t for t, _ in keyframes])
    table = np.stack(frames)
    times.setflags(write=False)
    table.setflags(write=False)
    return times, table


@dataclass(frozen=True)
class Scenario:
    """Initial condition and duration of one contact scenario; the PD targets are the default pose throughout."""

    name: str
    """Short name (``stand``, ``drop``, ``slide``)."""
    seconds: float
    """Simulated time [s]."""
    height: float = 0.0
    """Added to the default base height [m]: the lowest foot sphere starts this far above the ground."""
    velocity: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Initial root linear velocity, world frame [m/s]; the hinges start at rest, so every body moves with it."""
    yaw_rate: float = 0.0
    """Initial root angular velocity about the vertical [rad/s] (the pelvis starts upright, so its local z axis is the
    world's); the whole robot turns with it about the pelvis, the feet sliding on an arc."""
    keyframes: tuple[tuple[float, tuple[tuple[str, float], ...]], ...] = ()
    """PD-target schedule: ``(time [s], ((joint-name suffix, offset [rad]), ...))`` pairs in increasing time; the
    targets are the default pose plus the offsets, interpolated linearly between keyframes and held after the last
    (before the first, the default pose is held). A suffix names every joint ending with it (``knee_joint`` both
    knees). Empty: the default pose throughout."""

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and np.isfinite(self.seconds)):
            raise ValueError(f"Scenario.seconds must be a finite value > 0, got {self.seconds!r}")
        if not (self.height >= 0 and np.isfinite(self.height)):
            raise ValueError(f"Scenario.height must be a finite value >= 0 [m], got {self.height!r}")
        if len(self.velocity) != 3 or not np.all(np.isfinite(self.velocity)):
            raise ValueError(f"Scenario.velocity must be three finite values [m/s], got {self.velocity!r}")
        if not np.isfinite(self.yaw_rate):
            raise ValueError(f"Scenario.yaw_rate must be a finite value [rad/s], got {self.yaw_rate!r}")
        times = [t for t, _ in self.keyframes]
        if any(not np.isfinite(t) or t < 0 for t in times) or times != sorted(times):
            raise ValueError(f"Scenario.keyframes times must be finite, >= 0 and increasing [s], got {times}")
        self.targets(0.0)  # every joint suffix names a joint

    def targets(self, t: float) -> np.ndarray:
        """PD targets [29] at time ``t`` [s] (float64, radians): the default pose plus the interpolated
        keyframe offsets."""
        from bcg.robots import g1

        base = np.asarray(g1.DEFAULT_JOINT_POS, dtype=np.float64)
        if not self.keyframes:
            return base.copy()
        times, offsets = _keyframe_table(self.keyframes)
        return base + np.array([np.interp(t, times, offsets[:, j]) for j in range(base.shape[0])])

    def initial_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos [36], qvel [35]) float64 in MuJoCo's layout: the default standing pose, raised, moving and
        turning."""
        from bcg.robots import g1

        q = g1.default_qpos()
        q[2] += self.height
        qd = np.zeros(q.shape[0] - 1)
        qd[:3] = self.velocity
        qd[5] = self.yaw_rate
        return q, qd


STAND = Scenario("stand", 10.0)
"""Standing still under PD for 10 s, feet just touching."""
DROP = Scenario("drop", 1.5, height=0.05)
"""Released with the feet 5 cm above the ground: touch-down after 0.10 s at 0.99 m/s."""
SLIDE = Scenario("slide", 1.0, velocity=(0.0, 0.5, 0.0))
"""Standing, the whole robot given 0.5 m/s to its left (+y): friction stops the feet within about 0.1 s."""
SPIN = Scenario("spin", 1.0, yaw_rate=2.0)
"""Standing, the whole robot turned at 2 rad/s about the vertical through the pelvis: the feet, 0.12 m either side of
it, slide on an arc until friction, resisting the turn as a pair and each foot's own pivot, stops them (the loaded
foot turning under the torque of a spin, as in a kick)."""
PUSH_START = 0.9
"""Time [s] at which :data:`PUSH` starts extending from its crouch."""
_CROUCH = (("hip_pitch_joint", -0.9), ("knee_joint", 1.2), ("ankle_pitch_joint", -0.6))
PUSH = Scenario("push", 1.5, keyframes=((0.5, _CROUCH), (PUSH_START, _CROUCH),
                                        (PUSH_START + 0.05, (("ankle_pitch_joint", 0.4),))))
"""A jump: from standing, the targets crouch both legs over 0.5 s (hip pitch -0.9, knee +1.2, ankle pitch -0.6 rad),
hold it for 0.4 s, then snap in 50 ms to the straight leg with the ankles pointed (+0.4 rad): the knees and hips drive
at their torque limits and the toes push off, as in a kick's or a jump's take-off. The landing that follows is not
compared (open loop, the robot comes down crouched, its pelvis at 0.60-0.64 m by the end)."""
SCENARIOS: tuple[Scenario, ...] = (STAND, DROP, SLIDE, SPIN)
"""The scenarios that hold the default pose and stay upright (:data:`PUSH`, a jump, is apart)."""


def _kinematics_model() -> tuple[mujoco.MjModel, np.ndarray, np.ndarray, int]:
    """The scene model, its collision spheres' geom ids [nc], the contact bodies' ids [2] and the pelvis body id
    (loaded afresh for every trace, about 30 ms, rather than cached in module state)."""
    import mujoco

    from bcg.robots import g1

    m = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))
    spheres = np.array([g for g in range(m.ngeom)
                        if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE and m.geom_contype[g] > 0])
    feet = np.unique(m.geom_bodyid[spheres])
    root = int(m.jnt_bodyid[np.nonzero(m.jnt_type == mujoco.mjtJoint.mjJNT_FREE)[0][0]])  # the pelvis
    return m, spheres, feet, root


@dataclass(frozen=True)
class ContactTrace:
    """One environment's trajectory, sampled after every 5 ms step (``T`` samples; the initial state is not one).

    ``pelvis`` [T, 3] and ``feet`` [T, 3] (mean of the two foot bodies' origins) are world positions [m];
    ``penetration`` [T, nc] is radius - centre height of every foot sphere [m] (positive when penetrating);
    ``impulse`` [T] the summed normal contact impulse of each step [N s]; ``feet_yaw`` [T] (mean of the two foot
    bodies') and ``pelvis_yaw`` [T] are heading angles [rad], unwrapped over time; ``com`` [T, 3] the whole robot's
    centre of mass [m]; ``start_*`` the same at t = 0.
    """

    name: str
    t: np.ndarray
    qpos: np.ndarray
    pelvis: np.ndarray
    feet: np.ndarray
    penetration: np.ndarray
    impulse: np.ndarray
    start_pelvis: np.ndarray
    start_feet: np.ndarray
    weight: float
    """m g [N]."""
    feet_yaw: np.ndarray
    pelvis_yaw: np.ndarray
    start_feet_yaw: float
    start_pelvis_yaw: float
    com: np.ndarray
    start_com: np.ndarray

    @classmethod
    def from_qpos(cls, name: str, q0: np.ndarray, qpos: np.ndarray, impulse: np.ndarray,
                  kinematics: tuple[mujoco.MjModel, np.ndarray, np.ndarray, int] | None = None) -> ContactTrace:
        """Measure a trajectory: ``q0`` [nq] initial qpos, ``qpos`` [T, nq] after each step, ``impulse`` [T];
        ``kinematics``: a :func:`_kinematics_model` to reuse across traces (default: loaded for this one)."""
        import mujoco

        m, spheres, feet, pelvis = kinematics if kinematics is not None else _kinematics_model()
        d = mujoco.MjData(m)
        qs = np.concatenate([q0[None], qpos]).astype(np.float64)
        pel, foot, pen = np.empty((len(qs), 3)), np.empty((len(qs), 3)), np.empty((len(qs), len(spheres)))
        yaw = np.empty((len(qs), 3))  # the two feet's and the pelvis's heading
        com = np.empty((len(qs), 3))
        for k, q in enumerate(qs):
            d.qpos[:] = q
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            com[k] = d.subtree_com[pelvis]  # the pelvis is the root of the robot's tree
            pel[k] = d.xpos[pelvis]
            foot[k] = d.xpos[feet].mean(0)
            pen[k] = m.geom_size[spheres, 0] - d.geom_xpos[spheres, 2]
            R = d.xmat[[*feet, pelvis]].reshape(-1, 3, 3)
            yaw[k] = np.arctan2(R[:, 1, 0], R[:, 0, 0])
        yaw = np.unwrap(yaw, axis=0)
        feet_yaw, pelvis_yaw = yaw[:, :2].mean(1), yaw[:, 2]
        weight = float(np.sum(m.body_mass)) * abs(float(m.opt.gravity[2]))
        t = np.arange(1, len(qpos) + 1) * DT
        return cls(name, t, qs[1:], pel[1:], foot[1:], pen[1:], np.asarray(impulse, dtype=np.float64), pel[0],
                   foot[0], weight, feet_yaw[1:], pelvis_yaw[1:], float(feet_yaw[0]), float(pelvis_yaw[0]), com[1:],
                   com[0])

    # --- metrics -------------------------------------------------------------------------------------------------
    def _window(self, t0: float, t1: float | None) -> np.ndarray:
        return (self.t > t0 - 1e-9) & (self.t < (np.inf if t1 is None else t1) + 1e-9)

    def at(self, t: float) -> int:
        """Index of the sample at time ``t`` [s] (the nearest one)."""
        return int(np.argmin(np.abs(self.t - t)))

    def peak_penetration(self, t0: float = 0.0, t1: float | None = None) -> float:
        """Largest penetration of any foot sphere in [t0, t1] [m]."""
        return float(self.penetration[self._window(t0, t1)].max())

    def mean_penetration(self, t0: float = 0.0, t1: float | None = None) -> float:
        """Time mean over [t0, t1] of the mean over the spheres of max(penetration, 0) [m]."""
        return float(np.clip(self.penetration[self._window(t0, t1)], 0.0, None).mean())

    def settled_height(self, last: float = 0.5) -> float:
        """Mean pelvis height over the last ``last`` seconds [m]."""
        return float(self.pelvis[self.t > self.t[-1] - last, 2].mean())

    def settling_time(self, tol: float = 2e-3, last: float = 0.5) -> float:
        """First time [s] after which the pelvis height stays within ``tol`` [m] of :meth:`settled_height`
        (inf if the last sample is still outside: the pelvis has not settled)."""
        off = np.abs(self.pelvis[:, 2] - self.settled_height(last)) > tol
        if not off.any():
            return float(self.t[0])
        last_off = int(np.nonzero(off)[0][-1])
        return float(self.t[last_off + 1]) if last_off + 1 < len(self.t) else float("inf")

    def horizontal_displacement(self, t: float, of: str = "feet") -> float:
        """Horizontal distance [m] the ``feet`` (mean foot origin) or the ``pelvis`` moved from t = 0 to ``t``."""
        now, start = (self.feet, self.start_feet) if of == "feet" else (self.pelvis, self.start_pelvis)
        return float(np.linalg.norm(now[self.at(t), :2] - start[:2]))

    def turned(self, t: float, of: str = "feet") -> float:
        """Heading change [rad] of the ``feet`` (mean of the two foot bodies) or the ``pelvis`` from t = 0 to ``t``."""
        now, start = (self.feet_yaw, self.start_feet_yaw) if of == "feet" else (self.pelvis_yaw, self.start_pelvis_yaw)
        return float(now[self.at(t)] - start)

    def creep_rate(self, t0: float = 1.0) -> float:
        """Mean horizontal speed of the feet from ``t0`` to the end [m/s] (the foot slip over time)."""
        i = self.at(t0)
        return float(np.linalg.norm(self.feet[-1, :2] - self.feet[i, :2]) / (self.t[-1] - self.t[i]))

    def impulse_over_weight(self, seconds: float = 1.0) -> float:
        """Normal impulse of the last ``seconds`` over the weight impulse m g x seconds (1 = balanced)."""
        return float(self.impulse[self.t > self.t[-1] - seconds + 1e-9].sum() / (self.weight * seconds))

    def lift_off(self, t0: float) -> float:
        """First sample time after ``t0`` [s] at which no sphere carries any normal impulse (inf if none)."""
        free = (self.t > t0 + 1e-9) & (self.impulse <= 0.0)
        return float(self.t[np.argmax(free)]) if free.any() else float("inf")

    def takeoff_speed(self, t0: float) -> float:
        """Largest upward velocity of the centre of mass after ``t0`` [m/s] (central differences of its height)."""
        vz = np.gradient(self.com[:, 2], self.t)
        return float(vz[self.t > t0 + 1e-9].max())

    def com_rise(self, t0: float) -> float:
        """Highest centre-of-mass height after ``t0`` minus its height at ``t0`` [m]."""
        return float(self.com[self._window(t0, None), 2].max() - self.com[self.at(t0), 2])

    def fell(self, height: float = 0.6) -> bool:
        """Whether the pelvis went below ``height`` [m] at any sample."""
        return bool(self.pelvis[:, 2].min() < height)


SLIDE_TIMES = (0.1, 0.2, 0.5)
"""Times [s] at which the slide distances are compared."""


def metrics(trace: ContactTrace) -> dict[str, float]:
    """The compared quantities of a trace of :data:`STAND`, :data:`DROP` or :data:`SLIDE` (by ``trace.name``),
    in SI units (m, s, m/s; ``impulse_over_weight`` is dimensionless):

    * stand: ``pelvis_z`` at the end, ``mean_penetration`` and ``peak_penetration`` over the second half,
      ``drift_1s`` / ``drift_end`` (horizontal pelvis displacement at 1 s / at the end), ``creep`` (foot speed
      after 1 s), ``impulse_over_weight`` (last second);
    * drop: ``peak_penetration``, ``settled_height`` (mean pelvis height of the last 0.5 s), ``settling_time``
      (to 2 mm of it), ``lowest_pelvis_z``;
    * slide: ``feet_<t>`` and ``pelvis_<t>``, the horizontal distance moved by t = 0.1, 0.2, 0.5 s;
    * spin: ``feet_<t>`` and ``pelvis_<t>``, the heading turned [rad] by t = 0.1, 0.2, 0.5 s;
    * push: ``takeoff_speed`` (the centre of mass's largest upward velocity after :data:`PUSH_START`),
      ``com_rise`` (its apex above its height at the start of the push), ``push_impulse`` (the normal impulse from
      the start of the push to lift-off) and ``lift_off`` (the time from the start of the push to the first step
      without contact).
    """
    if trace.name == "stand":
        half = 0.5 * float(trace.t[-1])
        return {
            "pelvis_z": float(trace.pelvis[-1, 2]),
            "mean_penetration": trace.mean_penetration(half),
            "peak_penetration": trace.peak_penetration(half),
            "drift_1s": trace.horizontal_displacement(1.0, "pelvis"),
            "drift_end": trace.horizontal_displacement(float(trace.t[-1]), "pelvis"),
            "creep": trace.creep_rate(1.0),
            "impulse_over_weight": trace.impulse_over_weight(1.0),
        }
    if trace.name == "drop":
        return {
            "peak_penetration": trace.peak_penetration(),
            "settled_height": trace.settled_height(),
            "settling_time": trace.settling_time(),
            "lowest_pelvis_z": float(trace.pelvis[:, 2].min()),
        }
    if trace.name == "slide":
        out = {f"feet_{t:g}": trace.horizontal_displacement(t, "feet") for t in SLIDE_TIMES}
        out.update({f"pelvis_{t:g}": trace.horizontal_displacement(t, "pelvis") for t in SLIDE_TIMES})
        return out
    if trace.name == "spin":
        out = {f"feet_{t:g}": trace.turned(t, "feet") for t in SLIDE_TIMES}
        out.update({f"pelvis_{t:g}": trace.turned(t, "pelvis") for t in SLIDE_TIMES})
        return out
    if trace.name == "push":
        off = trace.lift_off(PUSH_START)
        return {
            "takeoff_speed": trace.takeoff_speed(PUSH_START),
            "com_rise": trace.com_rise(PUSH_START),
            "push_impulse": float(trace.impulse[(trace.t > PUSH_START + 1e-9) & (trace.t < off - 1e-9)].sum()),
            "lift_off": off - PUSH_START,
        }
    raise ValueError("metrics are defined for the scenarios 'stand', 'drop', 'slide', 'spin' and 'push', "
                     f"got {trace.name!r}")


def run_bcg(scenario: Scenario, torque_scale: float = 1.0, **params: Any) -> ContactTrace:
    """The scenario in :mod:`bcg.sim` (float32 Warp kernels, CPU, N = 1); ``params`` go to
    :func:`bcg.sim.load_model` (e.g. ``kappa``), ``torque_scale`` multiplies every actuator's torque limit. The model
    takes one substep per call so that every 5 ms step is sampled; with the targets held this is the same dynamics as
    ``substeps`` of them per call."""
    from bcg.sim import load_model

    if not (torque_scale > 0 and np.isfinite(torque_scale)):
        raise ValueError(f"torque_scale must be a finite value > 0, got {torque_scale!r}")
    model = load_model(**{**params, "substeps": 1, "dt": DT})
    if torque_scale != 1.0:
        model = model.with_gains(torque_limit=np.asarray(model.torque_limit) * torque_scale)
    return _simulate_bcg(scenario, model, None)[0]


def run_bcg_batch(scenario: Scenario, model: SimModel, physics: Physics) -> list[ContactTrace]:
    """The scenario in :mod:`bcg.sim` for every row of ``physics`` at once (per-environment masses, gains, torque
    limits, ground; e.g. drawn by :func:`bcg.envs.randomization.sample_physics`), all from the same initial state
    with the same targets. ``model`` must take one substep of :data:`DT` per call (``load_model(substeps=1,
    dt=DT)``), so that every step is sampled."""
    if model.params.substeps != 1 or abs(model.params.dt - DT) > 1e-12:
        raise ValueError(f"run_bcg_batch needs a model of one {DT:g} s substep per call "
                         f"(load_model(substeps=1, dt={DT:g})), got {model.params.substeps} x {model.params.dt:g} s")
    return _simulate_bcg(scenario, model, physics)


def _simulate_bcg(scenario: Scenario, model: SimModel, physics: Physics | None) -> list[ContactTrace]:
    """Step ``model`` (one substep per call) through ``scenario`` for the rows of ``physics`` (one environment with
    the model's own parameters if None) and measure each trajectory."""
    import torch

    from bcg.sim import step

    n_env = 1 if physics is None else int(physics.kp.shape[0])
    q0, qd0 = scenario.initial_state()
    q = torch.tensor(q0, dtype=torch.float32)[None].repeat(n_env, 1)
    qd = torch.tensor(qd0, dtype=torch.float32)[None].repeat(n_env, 1)
    n = int(round(scenario.seconds / DT))
    qs, imp = np.empty((n, n_env, model.nq)), np.empty((n, n_env))
    with torch.no_grad():
        for k in range(n):
            targets = torch.tensor(scenario.targets(k * DT), dtype=torch.float32)[None].expand(n_env, -1)
            q, qd, rep = step(model, q, qd, targets, physics)
            qs[k] = q.double().numpy()
            imp[k] = rep.impulse.reshape(n_env, -1).sum(1).double().numpy()
    kinematics = _kinematics_model()
    return [ContactTrace.from_qpos(scenario.name, q0, qs[:, e], imp[:, e], kinematics) for e in range(n_env)]


def run_mujoco(scenario: Scenario, refine: int = 1) -> ContactTrace:
    """The scenario in C MuJoCo on :data:`bcg.robots.g1.SCENE_PATH` (its own contacts, 5 ms, ``implicitfast``), through
    the project's one MuJoCo PD loop (:class:`bcg.evaluation.mujoco_loop.MujocoLoop`), sampled every 5 ms; ``refine``
    MuJoCo steps of 5 / ``refine`` ms make each sample (1: one step of the MJCF's own 5 ms)."""
    from bcg.evaluation.mujoco_loop import MujocoLoop
    from bcg.evaluation.transfer_protocol import check_refine

    refine = check_refine(refine, "refine")
    loop = MujocoLoop(1, substeps=refine, timestep=DT / refine)
    q0, qd0 = scenario.initial_state()
    loop.set_state(q0[None], qd0[None])
    n = int(round(scenario.seconds / DT))
    qs, imp = np.empty((n, loop.nq)), np.empty(n)
    for k in range(n):
        out = loop.step(scenario.targets(k * DT)[None])
        qs[k] = out.qpos[0]
        imp[k] = float(out.contact.impulse.sum())
    return ContactTrace.from_qpos(scenario.name, q0, qs, imp)
