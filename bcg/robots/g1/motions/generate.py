"""Generator of the packaged G1 reference clips ``run``, ``jump``, ``fight`` and ``dance`` (15 s at 50 Hz).

Deterministic and rerunnable (no randomness): ``python -m bcg.robots.g1.motions.generate`` rewrites the four
``<name>.npz`` files next to this script (``qpos`` [751, 36] float32 in MuJoCo's layout, quaternion w, x, y, z;
``fps`` = 50; ``name``; ``format`` = ``"bcg-motion-v1"``), readable by :func:`bcg.envs.motion.load_motion`.

Method: every clip is a set of keyframed (or, for the run, analytic periodic) tracks on the G1's own kinematics:
pelvis position and roll / pitch / yaw, the pose of each foot (the ``*_ankle_roll_link`` frame: position and roll /
pitch / yaw in the world), and the 17 waist and arm angles. The six angles of each leg are then solved per frame by
damped least squares on MuJoCo's body Jacobian of the foot (``mj_jacBody`` on ``g1.xml``), warm-started from the
previous frame and clipped to the joint ranges. A stance foot is held flat at ankle height 0.035 m, where all four
of its contact spheres just touch z = 0 (centre at z = radius), so a stance foot neither slides nor sinks; swing feet
follow smooth arcs. Keyframes use cubic Hermite segments (zero slope unless given), so a held value is exactly
constant. The motions are kinematic references: plausible, not dynamically optimised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FPS = 50
DT = 1.0 / FPS
DURATION = 15.0
NUM_FRAMES = int(round(DURATION * FPS)) + 1
ANKLE_Z = 0.035
"""Height of the ankle-roll origin of a flat foot whose spheres touch the ground (sphere z -0.03, radius 0.005)."""
G = 9.81
OUT_DIR = Path(__file__).resolve().parent

# indices into the 17 upper-body angles (qpos 19..35)
WY, WR, WP = 0, 1, 2
LSP, LSR, LSY, LEL, LWR, LWP, LWY = 3, 4, 5, 6, 7, 8, 9
RSP, RSR, RSY, REL, RWR, RWP, RWY = 10, 11, 12, 13, 14, 15, 16
UPPER_DEFAULT = np.array([0, 0, 0, 0.2, 0.2, 0, 1.28, 0, 0, 0, 0.2, -0.2, 0, 1.28, 0, 0, 0], dtype=np.float64)


# ---------------------------------------------------------------------------------------------------------------
# keyframe tracks


class Track:
    """A scalar signal through keyframes (time [s], value, slope); cubic Hermite between keys, held outside."""

    def __init__(self, value: float = 0.0) -> None:
        self.keys: list[tuple[float, float, float]] = [(0.0, float(value), 0.0)]

    def key(self, t: float, value: float, slope: float = 0.0) -> Track:
        self.keys = [k for k in self.keys if abs(k[0] - t) > 1e-9] + [(float(t), float(value), float(slope))]
        self.keys.sort(key=lambda k: k[0])
        return self

    def hold(self, t0: float, t1: float, value: float | None = None) -> Track:
        """Hold ``value`` (default: the value at t0) from t0 to t1."""
        v = self.last_value(t0) if value is None else value
        return self.key(t0, v).key(t1, v)

    def last_value(self, t: float) -> float:
        return float(self(np.array([t]))[0])

    def __call__(self, t: np.ndarray) -> np.ndarray:
        k = np.array(self.keys)
        kt, kv, ks = k[:, 0], k[:, 1], k[:, 2]
        if len(kt) == 1:
            return np.full_like(t, kv[0], dtype=np.float64)
        i = np.clip(np.searchsorted(kt, t, side="right") - 1, 0, len(kt) - 2)
        h = kt[i + 1] - kt[i]
        s = np.clip((t - kt[i]) / h, 0.0, 1.0)
        h00, h10, h01, h11 = 2 * s**3 - 3 * s**2 + 1, s**3 - 2 * s**2 + s, -2 * s**3 + 3 * s**2, s**3 - s**2
        out = h00 * kv[i] + h10 * h * ks[i] + h01 * kv[i + 1] + h11 * h * ks[i + 1]
        out = np.where(t <= kt[0], kv[0], out)
        return np.where(t >= kt[-1], kv[-1], out)


@dataclass
class Plan:
    """Targets per frame: pelvis position [T, 3] and roll/pitch/yaw [T, 3]; foot (ankle-roll origin) position
    [T, 2, 3] and roll/pitch/yaw [T, 2, 3] (left, right); upper-body angles [T, 17]."""

    pelvis_pos: np.ndarray
    pelvis_rpy: np.ndarray
    foot_pos: np.ndarray
    foot_rpy: np.ndarray
    upper: np.ndarray


def _tracks(names: Sequence[str], init: dict[str, float] | None = None) -> dict[str, Track]:
    init = init or {}
    return {n: Track(init.get(n, 0.0)) for n in names}


def _eval(tracks: dict[str, Track], names: Sequence[str], t: np.ndarray) -> np.ndarray:
    return np.stack([tracks[n](t) for n in names], -1)


def _rot2(yaw: float, x: float, y: float) -> tuple[float, float]:
    c, s = math.cos(yaw), math.sin(yaw)
    return c * x - s * y, s * x + c * y


# ---------------------------------------------------------------------------------------------------------------
# leg inverse kinematics


def _rpy_to_mat(rpy: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    return Rotation.from_euler("ZYX", rpy[..., ::-1].reshape(-1, 3)).as_matrix().reshape(rpy.shape[:-1] + (3, 3))


def _rpy_to_quat_wxyz(rpy: np.ndarray) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    xyzw = Rotation.from_euler("ZYX", rpy[:, ::-1]).as_quat()
    q = xyzw[:, [3, 0, 1, 2]]
    return q


def _rot_err(Rt: np.ndarray, Rc: np.ndarray) -> np.ndarray:
    """World-frame rotation vector taking Rc to Rt."""
    from scipy.spatial.transform import Rotation

    return Rotation.from_matrix(Rt @ Rc.T).as_rotvec()


def solve(plan: Plan, iters: int = 100, tol: float = 1e-7) -> tuple[np.ndarray, np.ndarray]:
    """Leg IK for every frame. Returns (qpos [T, 36] float64, foot-position residual [T, 2] [m])."""
    import mujoco

    from bcg.robots.g1 import JOINT_NAMES, MJCF_PATH

    m = mujoco.MjModel.from_xml_path(str(MJCF_PATH))
    d = mujoco.MjData(m)
    rng = np.array([m.joint(n).range for n in JOINT_NAMES])
    T = len(plan.pelvis_pos)
    quat = _rpy_to_quat_wxyz(plan.pelvis_rpy)
    Rfoot = _rpy_to_mat(plan.foot_rpy)
    feet = [m.body("left_ankle_roll_link").id, m.body("right_ankle_roll_link").id]
    legs = [np.arange(6, 12), np.arange(12, 18)]
    qleg = np.array([-0.2, 0, 0, 0.4, -0.2, 0] * 2)
    out = np.zeros((T, 36))
    worst = np.zeros((T, 2))
    q_nominal = qleg.copy()
    for k in range(T):
        qleg = _ik_frame(m, d, plan, k, quat[k], Rfoot[k], rng, feet, legs, qleg, iters, tol)
        if _residual(d, plan, k, feet) > 1e-3:  # stuck on a bad branch: retry from the nominal bent legs
            q2 = _ik_frame(m, d, plan, k, quat[k], Rfoot[k], rng, feet, legs, q_nominal.copy(), iters, tol)
            if _residual(d, plan, k, feet) < 1e-3:
                qleg = q2
            else:
                qleg = _ik_frame(m, d, plan, k, quat[k], Rfoot[k], rng, feet, legs, qleg, iters, tol)
        for f in range(2):
            worst[k, f] = np.linalg.norm(plan.foot_pos[k, f] - d.xpos[feet[f]])
        out[k] = d.qpos[:36]
    return out, worst


def _residual(d, plan: Plan, k: int, feet: list[int]) -> float:
    return max(float(np.linalg.norm(plan.foot_pos[k, f] - d.xpos[feet[f]])) for f in range(2))


def _ik_frame(m, d, plan: Plan, k: int, quat: np.ndarray, Rfoot: np.ndarray, rng: np.ndarray, feet: list[int],
              legs: list[np.ndarray], qleg: np.ndarray, iters: int, tol: float) -> np.ndarray:
    """Damped least squares on both legs of frame k from the start ``qleg`` (12); leaves d at the solution."""
    import mujoco

    jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
    lam2 = 1e-4
    qleg = qleg.copy()
    d.qpos[:3] = plan.pelvis_pos[k]
    d.qpos[3:7] = quat
    d.qpos[19:] = np.clip(plan.upper[k], rng[12:, 0], rng[12:, 1])
    for _ in range(iters):
        d.qpos[7:19] = qleg
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)  # cdof, needed by mj_jacBody
        errs = []
        for f in range(2):
            b = feet[f]
            ep = plan.foot_pos[k, f] - d.xpos[b]
            er = _rot_err(Rfoot[f], d.xmat[b].reshape(3, 3))
            e = np.concatenate([ep, er])
            errs.append(float(np.abs(e).max()))
            e = e * min(1.0, 0.05 / max(float(np.linalg.norm(e)), 1e-12))
            mujoco.mj_jacBody(m, d, jacp, jacr, b)
            J = np.concatenate([jacp, jacr])[:, legs[f]]
            dq = J.T @ np.linalg.solve(J @ J.T + lam2 * np.eye(6), e)
            dq *= min(1.0, 0.2 / max(float(np.abs(dq).max()), 1e-12))
            qleg[6 * f: 6 * f + 6] += dq
        qleg = np.clip(qleg, rng[:12, 0], rng[:12, 1])
        if max(errs) < tol:
            break
    d.qpos[7:19] = qleg
    mujoco.mj_kinematics(m, d)
    return qleg


# ---------------------------------------------------------------------------------------------------------------
# clips

def _time() -> np.ndarray:
    return np.arange(NUM_FRAMES) * DT


def run_plan() -> Plan:
    """Steady running at 2.2 m/s: step period 0.30 s, stance 0.14 s, flight 0.16 s per step."""
    t = _time()
    v, Ts, ts = 2.2, 0.30, 0.14
    tf = Ts - ts
    vz = G * tf / 2
    z_lo = 0.69
    # stance k (k even: left, odd: right) centred at c_k = k Ts; stance on [c_k - ts/2, c_k + ts/2]
    ks = np.arange(-4, int(DURATION / Ts) + 5)
    c = ks * Ts
    # pelvis height: ballistic in flight, a sine dip in stance (C1 at the switches)
    ph = np.mod(t + ts / 2, Ts)  # time since the last touchdown
    z = np.where(ph < ts, z_lo - vz * ts / math.pi * np.sin(math.pi * ph / ts),
                 z_lo + vz * (ph - ts) - 0.5 * G * (ph - ts) ** 2)
    stride = 2 * math.pi * t / (2 * Ts)  # 0 at the centre of a left stance
    pelvis = np.stack([v * t, 0.015 * np.cos(stride), z], -1)
    rpy = np.stack([0.03 * np.cos(stride), 0.16 + 0.02 * np.cos(2 * stride), -0.12 * np.sin(stride)], -1)
    foot_pos = np.zeros((len(t), 2, 3))
    for f in range(2):
        cf = c[ks % 2 == f]
        y = 0.10 if f == 0 else -0.10
        # index of the current or previous stance of this foot
        j = np.clip(np.searchsorted(cf - ts / 2, t, side="right") - 1, 0, len(cf) - 2)
        t_on, t_off = cf[j] - ts / 2, cf[j] + ts / 2
        x0 = v * cf[j] + 0.02
        x1 = v * cf[j + 1] + 0.02
        in_stance = t <= t_off
        s = np.clip((t - t_off) / (cf[j + 1] - ts / 2 - t_off), 0.0, 1.0)
        mj = 10 * s**3 - 15 * s**4 + 6 * s**5
        foot_pos[:, f, 0] = np.where(in_stance, x0, x0 + (x1 - x0) * mj)
        foot_pos[:, f, 1] = y
        lift = 0.20 * np.sin(math.pi * s) ** 1.2 * (1 + 0.6 * np.sin(math.pi * s) * np.cos(math.pi * s))
        foot_pos[:, f, 2] = np.where(in_stance, ANKLE_Z, ANKLE_Z + lift)
        del t_on
    foot_rpy = np.zeros((len(t), 2, 3))
    up = np.tile(UPPER_DEFAULT, (len(t), 1))
    up[:, WY] = 0.15 * np.sin(stride)
    up[:, LSP] = 0.15 + 0.7 * np.sin(stride)
    up[:, RSP] = 0.15 - 0.7 * np.sin(stride)
    up[:, LSR], up[:, RSR] = 0.15, -0.15
    up[:, LEL] = 0.35 - 0.25 * np.sin(stride)
    up[:, REL] = 0.35 + 0.25 * np.sin(stride)
    return Plan(pelvis, rpy, foot_pos, foot_rpy, up)


def jump_plan() -> Plan:
    """Ten two-footed jumps, one per 1.5 s: crouch, push, 0.4 s flight (about 0.22 m of pelvis rise above standing),
    landing, recovery. Some travel forward up to 0.3 m, two turn by +-90 degrees in the air."""
    t = _time()
    cycle = 1.5
    z_stand, z_crouch, z_to, h_flight = 0.745, 0.60, 0.775, 0.20
    v0 = math.sqrt(2 * G * h_flight)
    t_flight = 2 * v0 / G
    jumps = [(0.0, 0.0), (0.3, 0.0), (0.3, 0.0), (0.0, math.pi / 2), (0.25, 0.0), (0.0, 0.0), (0.0, -math.pi / 2),
             (0.3, 0.0), (0.2, 0.0), (0.0, 0.0)]
    tr = _tracks(["x", "y", "z", "yaw", "pitch"], {"z": z_stand})
    feet = [_tracks(["x", "y", "z", "yaw"], {"y": 0.11 * s, "z": ANKLE_Z}) for s in (1, -1)]
    up = _tracks([str(i) for i in range(17)], {str(i): UPPER_DEFAULT[i] for i in range(17)})
    x = y = yaw = 0.0
    for n, (dist, dyaw) in enumerate(jumps):
        t0 = n * cycle
        t_c, t_to = t0 + 0.30, t0 + 0.50
        t_ld = t_to + t_flight
        t_c2, t_end = t_ld + 0.25, t0 + cycle
        tr["z"].key(t0, z_stand).key(t_c, z_crouch).key(t_to, z_to, v0).key(t_ld, z_to, -v0).key(t_c2, z_crouch)
        tr["z"].key(t_end, z_stand)
        tr["pitch"].key(t0, 0.0).key(t_c, 0.35).key(t_to, 0.1).key(t_ld, 0.1).key(t_c2, 0.35).key(t_end, 0.0)
        vx = dist / 0.6
        a = (dist - vx * t_flight) / 2
        fx, fy = _rot2(yaw, 1.0, 0.0)
        for key_t, s, vel in ((t_c, 0.0, 0.0), (t_to, a, vx), (t_ld, a + vx * t_flight, vx), (t_c2, dist, 0.0)):
            tr["x"].key(key_t, x + fx * s, fx * vel)
            tr["y"].key(key_t, y + fy * s, fy * vel)
        tr["x"].key(t_end, x + fx * dist)
        tr["y"].key(t_end, y + fy * dist)
        tr["yaw"].key(t_to, yaw).key(t_ld, yaw + dyaw)
        nx, ny, nyaw = x + fx * dist, y + fy * dist, yaw + dyaw
        for f, side in enumerate((1, -1)):
            ox, oy = _rot2(yaw, 0.0, 0.11 * side)
            nox, noy = _rot2(nyaw, 0.0, 0.11 * side)
            ft = feet[f]
            ft["x"].hold(t0, t_to, x + ox).key(t_ld, nx + nox).key(t_end, nx + nox)
            ft["y"].hold(t0, t_to, y + oy).key(t_ld, ny + noy).key(t_end, ny + noy)
            ft["yaw"].hold(t0, t_to, yaw).key(t_ld, nyaw).key(t_end, nyaw)
            ft["z"].hold(t0, t_to - 1e-3, ANKLE_Z).key(t_to, ANKLE_Z, 0.8 * v0)
            ft["z"].key(t_to + 0.5 * t_flight, z_to + h_flight - 0.68)
            ft["z"].key(t_ld, ANKLE_Z, -0.8 * v0).hold(t_ld + 1e-3, t_end, ANKLE_Z)
        x, y, yaw = nx, ny, nyaw
        # arms: back in the crouch, up and forward at take-off, forward on landing
        for i, v in ((LSP, [0.2, 0.7, -1.6, -0.9, -0.4, 0.2]), (RSP, [0.2, 0.7, -1.6, -0.9, -0.4, 0.2]),
                     (LEL, [1.28, 1.2, 0.9, 0.7, 0.9, 1.28]), (REL, [1.28, 1.2, 0.9, 0.7, 0.9, 1.28]),
                     (LSR, [0.2, 0.25, 0.3, 0.45, 0.3, 0.2]), (RSR, [-0.2, -0.25, -0.3, -0.45, -0.3, -0.2]),
                     (WP, [0.0, 0.15, -0.05, 0.0, 0.15, 0.0])):
            for key_t, val in zip((t0, t_c, t_to + 0.1, t_ld, t_c2, t_end), v, strict=True):
                up[str(i)].key(key_t, val)
    return _assemble(t, tr, feet, up, foot_pitch=None)


def _assemble(t: np.ndarray, tr: dict[str, Track], feet: list[dict[str, Track]], up: dict[str, Track],
              foot_pitch: list[Track] | None) -> Plan:
    pelvis = _eval(tr, ["x", "y", "z"], t)
    rpy = np.stack([tr["roll"](t) if "roll" in tr else 0 * t, tr["pitch"](t), tr["yaw"](t)], -1)
    fp = np.stack([_eval(ft, ["x", "y", "z"], t) for ft in feet], 1)
    frpy = np.zeros((len(t), 2, 3))
    for f in range(2):
        frpy[:, f, 2] = feet[f]["yaw"](t)
        if foot_pitch is not None:
            frpy[:, f, 1] = foot_pitch[f](t)
    upper = _eval(up, [str(i) for i in range(17)], t)
    return Plan(pelvis, rpy, fp, frpy, upper)


class _Stance:
    """Bookkeeping of a keyframed stance: current foot placements and the tracks that record them."""

    def __init__(self, feet: list[dict[str, Track]], placements: list[tuple[float, float, float]]) -> None:
        self.feet = feet
        self.place = list(placements)
        for f, (x, y, yaw) in enumerate(placements):
            feet[f]["x"].key(0.0, x)
            feet[f]["y"].key(0.0, y)
            feet[f]["yaw"].key(0.0, yaw)
            feet[f]["z"].key(0.0, ANKLE_Z)

    def step(self, f: int, t0: float, t1: float, target: tuple[float, float, float], height: float = 0.08) -> None:
        """Swing foot f from its placement to ``target`` (x, y, yaw) between t0 and t1."""
        ft = self.feet[f]
        x, y, yaw = self.place[f]
        a, b = t0 + 0.2 * (t1 - t0), t1 - 0.2 * (t1 - t0)  # the foot moves sideways only once it is lifted
        for key, v0, v1 in (("x", x, target[0]), ("y", y, target[1]), ("yaw", yaw, target[2])):
            ft[key].hold(t0 - 1e-3, a, v0).hold(b, t1, v1)
        ft["z"].hold(t0 - 1e-3, t0, ANKLE_Z).key(a, ANKLE_Z + 0.6 * height).key(0.5 * (t0 + t1), ANKLE_Z + height)
        ft["z"].key(b, ANKLE_Z + 0.6 * height).key(t1, ANKLE_Z)
        self.place[f] = target

    def mid(self) -> tuple[float, float]:
        return (0.5 * (self.place[0][0] + self.place[1][0]), 0.5 * (self.place[0][1] + self.place[1][1]))


def fight_plan() -> Plan:
    """Guard stance with a bounce, jabs and crosses (arm extension with waist twist), front kicks with the rear leg
    while the lead leg stands, and switches between orthodox and southpaw stance (two steps each)."""
    t = _time()
    tr = _tracks(["x", "y", "z", "roll", "pitch", "yaw"], {"z": 0.70, "pitch": 0.08})
    feet = [_tracks(["x", "y", "z", "yaw"]) for _ in range(2)]
    pitch = [Track(0.0), Track(0.0)]
    up = _tracks([str(i) for i in range(17)])
    # orthodox: left foot forward
    ortho = [(0.15, 0.13, -0.25), (-0.15, -0.11, -0.5)]
    south = [(-0.15, 0.11, 0.5), (0.15, -0.13, 0.25)]
    st = _Stance(feet, ortho)
    guard = {WY: 0.0, WR: 0.0, WP: 0.1, LSP: -0.6, LSR: 0.25, LSY: 0.0, LEL: -0.45, RSP: -0.5, RSR: -0.25, RSY: 0.0,
             REL: -0.6, LWR: 0.0, RWR: 0.0}
    for i, v in guard.items():
        up[str(i)].key(0.0, v)
    stance_yaw = {"o": -0.35, "s": 0.35}
    tr["yaw"].key(0.0, stance_yaw["o"])

    def bounce(t0: float, t1: float, z: float = 0.70) -> None:
        n = int((t1 - t0) / 0.25)
        for i in range(n + 1):
            tr["z"].key(t0 + i * (t1 - t0) / max(n, 1), z - (0.012 if i % 2 else 0.0))

    def punch(t0: float, arm: str, lead: str) -> float:
        sp, sr, el = (LSP, LSR, LEL) if arm == "L" else (RSP, RSR, REL)
        sign = 1.0 if arm == "L" else -1.0
        twist = -0.35 * sign if lead == "o" else -0.35 * sign
        base = {i: up[str(i)].last_value(t0) for i in (sp, sr, el, WY)}
        for i in (sp, sr, el, WY):
            up[str(i)].key(t0, base[i])
        up[str(sp)].key(t0 + 0.18, -1.45).key(t0 + 0.26, -1.45).key(t0 + 0.45, base[sp])
        up[str(sr)].key(t0 + 0.18, 0.05 * sign).key(t0 + 0.26, 0.05 * sign).key(t0 + 0.45, base[sr])
        up[str(el)].key(t0 + 0.18, 1.35).key(t0 + 0.26, 1.35).key(t0 + 0.45, base[el])
        up[str(WY)].key(t0 + 0.18, twist).key(t0 + 0.26, twist).key(t0 + 0.45, 0.0)
        return t0 + 0.45

    def kick(t0: float, f: int) -> float:
        """Front kick with foot f (the rear one); the other foot stands."""
        other = 1 - f
        ox, oy, _ = st.place[other]
        x, y, yaw = st.place[f]
        mx, my = st.mid()
        tr["x"].hold(t0 - 0.01, t0, mx).key(t0 + 0.3, 0.8 * ox + 0.2 * mx)
        tr["y"].hold(t0 - 0.01, t0, my).key(t0 + 0.3, 0.8 * oy + 0.2 * my)
        tr["z"].key(t0, 0.70).key(t0 + 0.3, 0.72).key(t0 + 1.1, 0.72).key(t0 + 1.4, 0.70)
        heading = tr["yaw"].last_value(t0)
        kx, ky = _rot2(heading + (0.35 if f == 1 else -0.35), 0.55, 0.0)
        ft = feet[f]
        ft["x"].hold(t0, t0 + 0.36, x).key(t0 + 0.5, 0.5 * (x + ox + kx)).key(t0 + 0.65, ox + kx)
        ft["x"].key(t0 + 0.75, ox + kx).key(t0 + 0.95, 0.5 * (x + ox + kx)).hold(t0 + 1.05, t0 + 1.1, x)
        ft["y"].hold(t0, t0 + 0.36, y).key(t0 + 0.65, oy + ky).key(t0 + 0.75, oy + ky).hold(t0 + 1.05, t0 + 1.1, y)
        ft["z"].hold(t0, t0 + 0.3, ANKLE_Z).key(t0 + 0.36, ANKLE_Z + 0.05).key(t0 + 0.5, 0.35)
        ft["z"].key(t0 + 0.65, 0.50).key(t0 + 0.75, 0.50)
        ft["z"].key(t0 + 0.95, 0.30).key(t0 + 1.05, ANKLE_Z + 0.05).key(t0 + 1.1, ANKLE_Z)
        ft["z"].hold(t0 + 1.1, t0 + 1.4, ANKLE_Z)
        ft["yaw"].hold(t0, t0 + 0.36, yaw).key(t0 + 0.65, heading).key(t0 + 0.75, heading)
        ft["yaw"].hold(t0 + 1.05, t0 + 1.1, yaw)
        pitch[f].key(t0 + 0.4, 0.0).key(t0 + 0.55, -0.5).key(t0 + 0.75, -0.5).key(t0 + 0.95, -0.3)
        pitch[f].key(t0 + 1.02, 0.0)
        tr["pitch"].key(t0, 0.08).key(t0 + 0.65, -0.12).key(t0 + 0.75, -0.12).key(t0 + 1.1, 0.08)
        tr["x"].key(t0 + 1.1, 0.8 * ox + 0.2 * mx).key(t0 + 1.4, mx)
        tr["y"].key(t0 + 1.1, 0.8 * oy + 0.2 * my).key(t0 + 1.4, my)
        return t0 + 1.4

    def switch(t0: float, to: str) -> float:
        """Two steps: the rear foot forward, then the old lead foot back."""
        target = south if to == "s" else ortho
        rear = 1 if to == "s" else 0
        x0, y0 = st.mid()
        tr["x"].hold(t0 - 0.01, t0, x0)
        tr["y"].hold(t0 - 0.01, t0, y0)
        st.step(rear, t0 + 0.15, t0 + 0.5, target[rear], height=0.07)
        tr["yaw"].key(t0 + 0.15, tr["yaw"].last_value(t0)).key(t0 + 0.9, stance_yaw[to])
        st.step(1 - rear, t0 + 0.55, t0 + 0.9, target[1 - rear], height=0.07)
        x1, y1 = st.mid()
        tr["x"].key(t0 + 0.5, 0.5 * (x0 + x1)).key(t0 + 1.0, x1)
        tr["y"].key(t0 + 0.5, 0.5 * (y0 + y1)).key(t0 + 1.0, y1)
        return t0 + 1.0

    bounce(0.0, 1.0)
    punch(1.0, "L", "o")
    punch(1.6, "R", "o")
    kick(2.4, 1)
    bounce(3.8, 4.2)
    punch(4.2, "L", "o")
    punch(4.75, "L", "o")
    switch(5.4, "s")
    bounce(6.4, 6.8)
    punch(6.8, "R", "s")
    punch(7.4, "L", "s")
    kick(8.2, 0)
    bounce(9.6, 10.0)
    switch(10.0, "o")
    punch(11.2, "L", "o")
    punch(11.75, "R", "o")
    kick(12.5, 1)
    bounce(13.9, 15.0)
    return _assemble(t, tr, feet, up, foot_pitch=pitch)


def dance_plan() -> Plan:
    """Step-touches from side to side with arm waves, a full turn in eight pivot steps, forward and back steps with
    waist twists, and side steps with alternating overhead waves; 120 beats per minute, hip sway and bounce."""
    t = _time()
    beat = 0.5
    w = 0.11
    tr = _tracks(["x", "y", "z", "roll", "pitch", "yaw"], {"z": 0.74})
    feet = [_tracks(["x", "y", "z", "yaw"]) for _ in range(2)]
    up = _tracks([str(i) for i in range(17)], {str(i): UPPER_DEFAULT[i] for i in range(17)})
    st = _Stance(feet, [(0.0, w, 0.0), (0.0, -w, 0.0)])

    def place(cx: float, cy: float, yaw: float, f: int) -> tuple[float, float, float]:
        ox, oy = _rot2(yaw, 0.0, w if f == 0 else -w)
        return (cx + ox, cy + oy, yaw)

    def pelvis_over(t0: float, f: int | None, z: float = 0.72, shift: float = 0.7) -> None:
        mx, my = st.mid()
        if f is None:
            px, py = mx, my
        else:
            px = (1 - shift) * mx + shift * st.place[f][0]
            py = (1 - shift) * my + shift * st.place[f][1]
        tr["x"].key(t0, px)
        tr["y"].key(t0, py)
        tr["z"].key(t0, z)

    # 0-4 s: step-touch side to side (8 beats), arm waves
    cx, cy, yaw = 0.0, 0.0, 0.0
    tb = 0.0
    for n in range(8):
        side = 1 if n % 2 == 0 else -1  # move left then right
        f_lead = 0 if side == 1 else 1
        cy += 0.15 * side
        pelvis_over(tb, f_lead if n else None, z=0.74)
        st.step(f_lead, tb + 0.05, tb + 0.25, place(cx, cy, yaw, f_lead), height=0.06)
        pelvis_over(tb + 0.3, f_lead, z=0.70)
        st.step(1 - f_lead, tb + 0.3, tb + 0.48, place(cx, cy, yaw, 1 - f_lead), height=0.05)
        tr["roll"].key(tb + 0.3, -0.08 * side)
        tb += beat
    pelvis_over(tb, None, z=0.74)
    tr["roll"].key(tb, 0.0)
    for k in range(9):
        ph = k * beat
        s = 1 if k % 2 == 0 else -1
        up[str(LSR)].key(ph, 0.9 + 0.5 * s)
        up[str(RSR)].key(ph, -(0.9 - 0.5 * s))
        up[str(LEL)].key(ph, 0.4 - 0.6 * s)
        up[str(REL)].key(ph, 0.4 + 0.6 * s)
        up[str(LSP)].key(ph, -0.3)
        up[str(RSP)].key(ph, -0.3)
        up[str(WR)].key(ph, 0.12 * s)
    # 4-8 s: full turn in eight pivot steps (45 degrees each), arms out
    for n in range(8):
        f = n % 2
        yaw += math.pi / 4
        tr["yaw"].key(tb, yaw - math.pi / 4).key(tb + 0.45, yaw)
        pelvis_over(tb, 1 - f, z=0.74, shift=0.35)
        st.step(f, tb + 0.05, tb + 0.4, place(cx, cy, yaw, f), height=0.07)
        pelvis_over(tb + 0.3, None, z=0.72)
        tb += beat
    for k in range(9):
        ph = 4.0 + k * beat
        up[str(LSR)].key(ph, 1.4)
        up[str(RSR)].key(ph, -1.4)
        up[str(LSP)].key(ph, 0.0)
        up[str(RSP)].key(ph, 0.0)
        up[str(LEL)].key(ph, 1.3 - 0.4 * (k % 2))
        up[str(REL)].key(ph, 1.3 - 0.4 * ((k + 1) % 2))
        up[str(WR)].key(ph, 0.0)
        up[str(LWR)].key(ph, 0.6 * (1 if k % 2 else -1))
        up[str(RWR)].key(ph, -0.6 * (1 if k % 2 else -1))
    # 8-12 s: forward / back steps (cha-cha), waist twists, punching-the-air arms
    fx, fy = _rot2(yaw, 1.0, 0.0)
    for n in range(8):
        f = n % 2
        d = 0.22 if (n // 2) % 2 == 0 else -0.22
        cx += 0.5 * d * fx
        cy += 0.5 * d * fy
        pelvis_over(tb, 1 - f, z=0.74, shift=0.5)
        st.step(f, tb + 0.05, tb + 0.35, place(cx + 0.5 * d * fx, cy + 0.5 * d * fy, yaw, f), height=0.06)
        pelvis_over(tb + 0.3, f, z=0.71, shift=0.5)
        tb += beat
    for k in range(9):
        ph = 8.0 + k * beat
        s = 1 if k % 2 == 0 else -1
        up[str(WY)].key(ph, 0.35 * s)
        up[str(LSP)].key(ph, -1.2 if s > 0 else 0.0)
        up[str(RSP)].key(ph, 0.0 if s > 0 else -1.2)
        up[str(LSR)].key(ph, 0.3)
        up[str(RSR)].key(ph, -0.3)
        up[str(LEL)].key(ph, 0.2)
        up[str(REL)].key(ph, 0.2)
        up[str(LWR)].key(ph, 0.0)
        up[str(RWR)].key(ph, 0.0)
    # 12-15 s: side steps back to centre with alternating overhead waves, then a final pose
    for n in range(5):
        f = 1 if n % 2 == 0 else 0
        side = -1 if f == 1 else 1
        ox, oy = _rot2(yaw, 0.0, 0.12 * side)
        cx += ox
        cy += oy
        pelvis_over(tb, 1 - f, z=0.74, shift=0.5)
        st.step(f, tb + 0.05, tb + 0.3, place(cx, cy, yaw, f), height=0.06)
        pelvis_over(tb + 0.35, f, z=0.70, shift=0.6)
        tb += beat
    pelvis_over(tb, None, z=0.74)
    pelvis_over(15.0, None, z=0.75)
    for k in range(7):
        ph = 12.0 + k * beat
        s = 1 if k % 2 == 0 else -1
        up[str(WY)].key(ph, 0.0)
        up[str(LSP)].key(ph, -2.4 if s > 0 else -0.8)
        up[str(RSP)].key(ph, -0.8 if s > 0 else -2.4)
        up[str(LSR)].key(ph, 0.4 + 0.3 * s)
        up[str(RSR)].key(ph, -(0.4 - 0.3 * s))
        up[str(LEL)].key(ph, 1.2 + 0.3 * s)
        up[str(REL)].key(ph, 1.2 - 0.3 * s)
        up[str(WR)].key(ph, -0.1 * s)
    tr["roll"].key(14.0, 0.0)
    for i in (LSP, RSP, LSR, RSR, LEL, REL, WR, WY):
        up[str(i)].key(15.0, [0, 0, 0, -2.6, 0.3, 0, 1.4, 0, 0, 0, -2.6, -0.3, 0, 1.4, 0, 0, 0][i])
    return _assemble(t, tr, feet, up, foot_pitch=None)


CLIPS: dict[str, Callable[[], Plan]] = {"run": run_plan, "jump": jump_plan, "fight": fight_plan, "dance": dance_plan}


def generate(name: str, out_dir: Path = OUT_DIR, verbose: bool = True) -> Path:
    """Build one clip and write ``<out_dir>/<name>.npz``; returns the path."""
    plan = CLIPS[name]()
    qpos, worst = solve(plan)
    path = Path(out_dir) / f"{name}.npz"
    np.savez_compressed(path, qpos=qpos.astype(np.float32), fps=np.float64(FPS), name=np.str_(name),
                        format=np.str_("bcg-motion-v1"),
                        generator=np.str_("bcg/robots/g1/motions/generate.py"))
    if verbose:
        print(f"{name}: {len(qpos)} frames -> {path} (worst foot-position residual {1000 * worst.max():.3f} mm)")
    return path


def main(names: Sequence[str] | None = None) -> None:
    for n in names or CLIPS:
        generate(n)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:] or None)
