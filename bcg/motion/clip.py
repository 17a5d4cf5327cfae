"""The :class:`Motion` clip (a reference at the control rate with batched lookups) and :func:`load_motion`.

All lookups of a :class:`Motion` take a tensor of times [s] of any shape, clamp them to ``[0, duration]`` (a time
before the start returns the first frame, a time after the end the last one), interpolate linearly between the two
neighbouring frames (quaternions: hemisphere-consistent normalised lerp) and are differentiable with respect to the
times inside a frame interval. Nothing loops over times in Python.

Reference features come from :class:`bcg.motion.features.FeatureFn`, the function the environments apply to the
simulated robot: ``motion.features`` is the table at every frame (computed in float64, stored in float32), and
:meth:`Motion.features_at` / :meth:`Motion.disc_features_at` evaluate it at interpolated reference states.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bcg.motion.features import FeatureFn, Features
from bcg.motion.formats import (
    BCG_FORMAT,
    MotionFormat,
    MotionFormatError,
    read_motion_file,
    resolve_motion_path,
)
from bcg.motion.resample import finite_difference_qvel, resample_qpos
from bcg.motion.rotations import (
    hemisphere_continuous_np,
    matrix_to_quat_wxyz,
    normalized_np,
    quat_mul_np,
    yaw_np,
    yaw_quat_np,
)

if TYPE_CHECKING:  # pragma: no cover
    from bcg.sim import SimModel

__all__ = ["Motion", "load_motion"]


def _sphere_centres(model: SimModel, rot: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """World positions [F, nc, 3] of the contact-sphere centres of body placements rot [F, nb, 3, 3], pos [F, nb, 3]."""
    spos = torch.as_tensor(model.sphere_pos, dtype=pos.dtype, device=pos.device)
    body = torch.as_tensor(model.sphere_body, dtype=torch.long, device=pos.device)
    return pos[:, body] + (rot[:, body] @ spos[None, :, :, None])[..., 0]


class Motion:
    """A reference motion at the control rate, with batched lookups (torch, float32, on ``device``).

    Attributes: ``dt`` (frame period [s]), ``num_frames``, ``duration`` (= (num_frames - 1) * dt), ``qpos`` [T, 36]
    (root quaternion w, x, y, z), ``qvel`` [T, 35] (MuJoCo layout: root linear velocity world frame, root angular
    velocity body frame, joint rates), ``features`` (:class:`Features` at every frame), ``body_pos_w`` [T, nb, 3],
    ``body_quat_w`` [T, nb, 4] (w, x, y, z, hemisphere-continuous in time), ``key_body_pos_w`` [T, nk, 3]
    (KEY_BODIES order, offsets applied), ``sphere_pos_w`` [T, nc, 3] (foot-sphere centres), ``body_names``,
    ``key_body_names``, ``name``, ``source``. Build one with :func:`load_motion` or :meth:`from_qpos`.
    """

    def __init__(self, qpos64: np.ndarray, dt: float, model: SimModel, *, name: str, source: str,
                 device: str | torch.device = "cpu") -> None:
        """Frames ``qpos64`` [T, 36] float64 at period ``dt`` [s] (use :meth:`from_qpos`, which checks them)."""
        from bcg.robots.g1 import KEY_BODIES

        self.name, self.source, self.dt = name, source, float(dt)
        self.model = model
        self._qpos64 = qpos64
        qvel = finite_difference_qvel(qpos64, dt)
        with torch.no_grad():
            fn64 = FeatureFn(model, torch.float64, "cpu")
            f64 = fn64(torch.as_tensor(qpos64), torch.as_tensor(qvel))
            spheres = _sphere_centres(model, f64.body_rot_w, f64.body_pos_w)
            bquat = matrix_to_quat_wxyz(f64.body_rot_w).numpy()
        bquat = np.stack([hemisphere_continuous_np(bquat[:, b]) for b in range(bquat.shape[1])], 1)
        f32 = dict(dtype=torch.float32, device=device)
        self.qpos = torch.as_tensor(qpos64, **f32)
        self.qvel = torch.as_tensor(qvel, **f32)
        self.features: Features = f64.cast(torch.float32, device)
        """Reference :class:`Features` at every frame [T, ...] (float64 kinematics, stored in float32)."""
        self.body_quat_w = torch.as_tensor(bquat, **f32)
        self.sphere_pos_w = spheres.to(**f32)
        self.sphere_radius = np.asarray(model.sphere_radius, dtype=np.float64)
        self.sphere_foot = np.asarray(model.sphere_foot)
        self.body_names = tuple(model.body_names)
        self.key_body_names = tuple(k.name for k in KEY_BODIES)
        self._feature_fn: FeatureFn | None = None

    # -- construction ------------------------------------------------------------------------------------------

    @classmethod
    def from_qpos(cls, qpos: np.ndarray, dt: float, *, name: str = "motion", source: str = "<array>",
                  device: str = "cpu", model: SimModel | None = None) -> Motion:
        """Build a motion from qpos frames [T, 36] (float64 advised) already at the period ``dt`` [s]."""
        qpos = np.asarray(qpos, dtype=np.float64)
        if qpos.ndim != 2 or qpos.shape[1] != 36:
            raise MotionFormatError(f"{source}: qpos has shape {qpos.shape}, expected (T, 36)")
        if len(qpos) < 2:
            raise MotionFormatError(f"{source}: a motion needs at least 2 frames at dt = {dt} s, got {len(qpos)}")
        if not np.isfinite(qpos).all():
            raise MotionFormatError(f"{source}: qpos has non-finite values")
        if model is None:
            from bcg.sim import load_model

            model = load_model()
        qpos = qpos.copy()
        qpos[:, 3:7] = hemisphere_continuous_np(normalized_np(qpos[:, 3:7]))
        return cls(qpos, dt, model, name=name, source=source, device=device)

    # -- basic properties --------------------------------------------------------------------------------------

    @property
    def num_frames(self) -> int:
        return int(self.qpos.shape[0])

    @property
    def duration(self) -> float:
        """(num_frames - 1) * dt [s]."""
        return (self.num_frames - 1) * self.dt

    @property
    def device(self) -> torch.device:
        return self.qpos.device

    @property
    def fps(self) -> float:
        return 1.0 / self.dt

    @property
    def body_pos_w(self) -> torch.Tensor:
        """[T, nb, 3] body origins [m] (``features.body_pos_w``)."""
        return self.features.body_pos_w

    @property
    def key_body_pos_w(self) -> torch.Tensor:
        """[T, nk, 3] key points [m] (``features.key_pos_w``)."""
        return self.features.key_pos_w

    def __repr__(self) -> str:
        return (f"Motion(name={self.name!r}, frames={self.num_frames}, dt={self.dt}, duration={self.duration:.3f} s, "
                f"device={self.device}, source={self.source!r})")

    def to(self, device: str | torch.device) -> Motion:
        """A copy with every tensor on ``device``."""
        new = object.__new__(Motion)
        for k, v in self.__dict__.items():
            if isinstance(v, torch.Tensor):
                v = v.to(device)
            elif isinstance(v, Features):
                v = v.cast(device=device)
            new.__dict__[k] = v
        new._feature_fn = None
        return new

    def inside_joint_limits(self, margin: float) -> Motion:
        """A copy whose joint angles are kept ``margin`` [rad] inside the model's joint ranges: each hinge clamped to
        ``[lower + m, upper - m]`` with ``m = min(margin, (upper - lower) / 4)``, velocities and features recomputed
        from the clamped frames. ``margin = 0`` returns ``self``. A reference held at a joint's stop asks the PD
        targets, the start states and the tracking reward to sit there too, where the joint-limit models of
        simulators part most (docs/envs.md)."""
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"margin must be a finite value >= 0 [rad], got {margin!r}")
        if margin == 0:
            return self
        rng = np.asarray(self.model.dof_range, dtype=np.float64)[6:]
        lo, hi = rng[:, 0], rng[:, 1]
        m = np.minimum(margin, np.where(np.isfinite(hi - lo), (hi - lo) / 4, np.inf))
        qpos = self._qpos64.copy()
        qpos[:, 7:] = np.clip(qpos[:, 7:], lo + m, hi - m)
        return Motion(qpos, self.dt, self.model, name=self.name, source=self.source, device=self.device)

    # -- lookups -----------------------------------------------------------------------------------------------

    def phase_to_time(self, phase: torch.Tensor | float) -> torch.Tensor:
        """Times [s] of phases in [0, 1] (0 = first frame, 1 = last frame); phases outside are clamped."""
        phase = torch.as_tensor(phase, dtype=torch.float32, device=self.device)
        return phase.clamp(0.0, 1.0) * self.duration

    def _index(self, times: torch.Tensor | float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = torch.as_tensor(times, device=self.device)
        if not t.is_floating_point():
            t = t.to(torch.float32)
        u = t.clamp(0.0, self.duration) / self.dt
        i0 = torch.floor(u.detach()).long().clamp(0, self.num_frames - 2)
        a = (u - i0.to(u.dtype)).clamp(0.0, 1.0).to(torch.float32)
        return i0, i0 + 1, a

    @staticmethod
    def _lerp(x: torch.Tensor, i0: torch.Tensor, i1: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x0, x1 = x[i0], x[i1]
        a = a.reshape(a.shape + (1,) * (x0.dim() - a.dim()))
        return x0 + a * (x1 - x0)

    @staticmethod
    def _nlerp(q: torch.Tensor, i0: torch.Tensor, i1: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        q0, q1 = q[i0], q[i1]
        q1 = torch.where((q0 * q1).sum(-1, keepdim=True) < 0, -q1, q1)
        a = a.reshape(a.shape + (1,) * (q0.dim() - a.dim()))
        out = q0 + a * (q1 - q0)
        return out / torch.linalg.norm(out, dim=-1, keepdim=True)

    def qpos_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """qpos [..., 36] at times [...] (s, clamped to [0, duration]); root quaternion by normalised lerp."""
        i0, i1, a = self._index(times)
        out = self._lerp(self.qpos, i0, i1, a)
        quat = self._nlerp(self.qpos[:, 3:7], i0, i1, a)
        return torch.cat([out[..., :3], quat, out[..., 7:]], -1)

    def qvel_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """qvel [..., 35] at times [...] (MuJoCo layout), linear interpolation of the frame velocities."""
        i0, i1, a = self._index(times)
        return self._lerp(self.qvel, i0, i1, a)

    def body_pos_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """Body origins [..., nb, 3] at times [...]."""
        i0, i1, a = self._index(times)
        return self._lerp(self.body_pos_w, i0, i1, a)

    def body_quat_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """Body orientations [..., nb, 4] (w, x, y, z) at times [...]."""
        i0, i1, a = self._index(times)
        return self._nlerp(self.body_quat_w, i0, i1, a)

    def key_body_pos_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """Key-point positions [..., nk, 3] at times [...] (KEY_BODIES order)."""
        i0, i1, a = self._index(times)
        return self._lerp(self.key_body_pos_w, i0, i1, a)

    def feature_fn(self) -> FeatureFn:
        """The float32 :class:`FeatureFn` of this motion's model on its device (the environments' own function)."""
        if self._feature_fn is None or self._feature_fn.device != self.device:
            self._feature_fn = FeatureFn(self.model, torch.float32, self.device)
        return self._feature_fn

    def features_at(self, times: torch.Tensor | float) -> Features:
        """:class:`Features` of the interpolated reference state at times [...] (each field ``[..., ...]``)."""
        t = torch.as_tensor(times, device=self.device)
        lead = t.shape
        flat = t.reshape(-1)
        f = self.feature_fn()(self.qpos_at(flat), self.qvel_at(flat))
        return Features(*[x.reshape(lead + x.shape[1:]) for x in f])

    def disc_features_at(self, times: torch.Tensor | float) -> torch.Tensor:
        """ADD discriminator features phi [..., 233] at times [...] (:func:`bcg.motion.features.disc_features`)."""
        t = torch.as_tensor(times, device=self.device)
        flat = t.reshape(-1)
        fn = self.feature_fn()
        phi = fn.disc(fn(self.qpos_at(flat), self.qvel_at(flat)))
        return phi.reshape(t.shape + phi.shape[-1:])

    # -- contacts ----------------------------------------------------------------------------------------------

    def contact_mask(self, contact_height: float = 0.01) -> np.ndarray:
        """[T, nc] bool: sphere bottom (centre z - radius) below ``contact_height`` [m]."""
        z = self.sphere_pos_w[..., 2].detach().cpu().double().numpy() - self.sphere_radius[None]
        return z < contact_height

    def foot_contact(self, contact_height: float = 0.01) -> np.ndarray:
        """[T, nf] bool: some sphere of the foot in contact."""
        c = self.contact_mask(contact_height)
        nf = int(self.sphere_foot.max()) + 1
        return np.stack([c[:, self.sphere_foot == f].any(1) for f in range(nf)], 1)

    # -- export ------------------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write the motion: ``.npz`` (bcg layout: float64 qpos, fps, name) or ``.csv`` (LAFAN1 / G1 Moves columns,
        quaternion x, y, z, w, full float64 precision, after a ``# fps: R`` comment line that the loader reads and
        that numpy and pandas skip). Loading either back at the same ``control_dt`` reproduces ``qpos`` exactly."""
        path = Path(path)
        q = self._qpos64
        if path.suffix.lower() == ".npz":
            np.savez_compressed(path, qpos=q, fps=np.float64(self.fps), name=np.str_(self.name),
                                format=np.str_(BCG_FORMAT))
        elif path.suffix.lower() == ".csv":
            rows = np.concatenate([q[:, 0:3], q[:, [4, 5, 6, 3]], q[:, 7:]], 1)
            np.savetxt(path, rows, delimiter=",", fmt="%.17g", header=f"fps: {self.fps:.17g}", comments="# ")
        else:
            raise ValueError(f"{path}: unknown suffix {path.suffix!r}; use .npz or .csv")
        return path


# ----------------------------------------------------------------------------------------------------------------
# loader


def _align(qpos: np.ndarray, model: SimModel, ground: bool, heading: bool) -> np.ndarray:
    from bcg.sim import forward_kinematics

    qpos = qpos.copy()
    if heading:
        yaw0 = float(yaw_np(qpos[0, 3:7]))
        qz = yaw_quat_np(-yaw0)
        c, s = math.cos(-yaw0), math.sin(-yaw0)
        xy = qpos[:, :2] - qpos[0, :2]
        qpos[:, 0] = c * xy[:, 0] - s * xy[:, 1]
        qpos[:, 1] = s * xy[:, 0] + c * xy[:, 1]
        qpos[:, 3:7] = quat_mul_np(np.broadcast_to(qz, qpos[:, 3:7].shape), qpos[:, 3:7])
    if ground:
        with torch.no_grad():
            kin = forward_kinematics(model, torch.as_tensor(qpos[:1], dtype=torch.float64))
            sp = _sphere_centres(model, kin.rot, kin.pos)[0].numpy()
        lowest = float((sp[:, 2] - model.sphere_radius).min())
        qpos[:, 2] -= lowest
    return qpos


def load_motion(
    source: str | Path,
    *,
    fps: float | None = None,
    control_dt: float = 0.02,
    align_ground: bool = False,
    align_heading: bool = False,
    clip_joint_limits: bool = False,
    min_duration: float = 0.0,
    format: MotionFormat = "auto",
    device: str = "cpu",
    model: SimModel | None = None,
) -> Motion:
    """Load a motion file or a packaged clip and resample it to the control rate.

    Args:
        source: a packaged clip name (:data:`bcg.motion.PACKAGED_MOTIONS`) or a path: ``.npz`` (bcg or BeyondMimic
            layout) or ``.csv`` (36 columns, quaternion x, y, z, w).
        fps: frame rate of the file [Hz]. Default: the NPZ's ``fps``; for a CSV what the file or its name says
            (``# fps:`` line; LAFAN1 ``*_subject*`` names 30, G1 Moves ``B_/J_/M_`` names 60), else an error asking
            for ``fps`` or ``format``.
        control_dt: period of the resampled frames [s] (default 0.02 = 50 Hz).
        align_ground: shift the clip vertically so that the lowest foot sphere of the first frame touches z = 0.
        align_heading: rotate and translate the clip about z so that the first frame is at x = y = 0 facing +x.
        clip_joint_limits: clip joint angles into the MJCF ranges instead of raising :class:`MotionFormatError`.
        min_duration: raise :class:`MotionFormatError` if the clip is shorter than this [s] (a requested window).
        format: ``"auto"``, ``"lafan1"`` (CSV at 30 FPS), ``"g1moves"`` (CSV at 60 FPS) or ``"npz"``.
        device: torch device of the motion's tensors.
        model: the :class:`bcg.sim.SimModel` for forward kinematics (default: ``bcg.sim.load_model()``, our G1).
    """
    if not (control_dt > 0 and math.isfinite(control_dt)):
        raise ValueError(f"control_dt must be a finite value > 0 [s], got {control_dt!r}")
    path = resolve_motion_path(source)
    qpos, rate, name = read_motion_file(path, fps=fps, format=format, clip_joint_limits=clip_joint_limits)
    if len(qpos) < 2:
        raise MotionFormatError(f"{path}: a motion needs at least 2 frames, the file has {len(qpos)}")
    dur = (len(qpos) - 1) / rate
    if dur + 1e-9 < max(min_duration, control_dt):
        raise MotionFormatError(f"{path}: the clip lasts {dur:.4f} s ({len(qpos)} frames at {rate:g} FPS), shorter "
                                f"than the requested {max(min_duration, control_dt):.4f} s")
    if model is None:
        from bcg.sim import load_model

        model = load_model()
    if align_ground or align_heading:
        qpos = _align(qpos, model, align_ground, align_heading)
    qpos = resample_qpos(qpos, rate, control_dt)
    return Motion.from_qpos(qpos, control_dt, name=name, source=str(path), device=device, model=model)
