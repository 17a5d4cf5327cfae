"""Domain randomisation of the G1 tracking environments (METHOD.md section 7.3).

The simulator model (:class:`bcg.sim.SimModel`) is shared by all environments of a batch and its kernels read
one parameter set per model, so randomisation comes in two kinds:

* **per environment** (drawn independently for every environment at each of its resets): default joint position
  offset, action latency (0 or 1 control step), pushes (detached velocity impulses every U(1, 3) s), reset noise on
  the root position, root orientation and joint positions, observation noise;
* **per batch** (one draw for the whole batch at every full reset, applied by building a new model from the base
  model): ground friction, PD gain scale (kp and kd), link mass scale, base mass offset, link COM offset, joint
  armature scale, joint damping scale (the engine has viscous joint damping only, no dry friction, so the "joint
  friction" range scales ``dof_damping``).

Per-environment versions of the per-batch quantities need per-environment parameter arrays in the Warp kernels
(``[N, ...]`` copies of ``kp``, ``kd``, ``mu``, ``body_mass``, ``body_com``, ``body_inertia``, ``dof_armature``,
``dof_damping`` indexed by the environment id); see ``docs/envs.md``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from bcg.sim.model import SimModel

__all__ = ["DomainRandomization", "randomize_model", "uniform"]

Range = tuple[float, float]


@dataclass(frozen=True)
class DomainRandomization:
    """Ranges of the randomised quantities; ``None`` switches a quantity off. Defaults are METHOD.md 7.3.

    Use ``DomainRandomization.off()`` for no randomisation (the environments' default).
    """

    # --- per batch (one draw per full reset) ---
    friction: Range | None = (0.3, 1.2)
    """Ground friction coefficient mu, U(lo, hi). Per batch."""
    gain_scale: Range | None = (0.8, 1.2)
    """Scale of the PD gains kp and kd (one factor each), U(lo, hi). Per batch."""
    link_mass_scale: Range | None = (0.8, 1.2)
    """Scale of every link's mass and inertia (one factor per link), U(lo, hi). Per batch."""
    base_mass_offset: Range | None = (-3.0, 3.0)
    """Mass added to the pelvis [kg], U(lo, hi) (inertia scaled along). Per batch."""
    com_offset: Range | None = (-0.03, 0.03)
    """Offset of every link's centre of mass per axis [m], U(lo, hi). Per batch."""
    armature_scale: Range | None = (0.75, 1.25)
    """Scale of each hinge's armature, U(lo, hi). Per batch."""
    damping_scale: Range | None = (0.5, 1.5)
    """Scale of each hinge's viscous damping, U(lo, hi) (METHOD's "joint friction"; no dry friction). Per batch."""
    # --- per environment ---
    joint_offset: Range | None = (-0.01, 0.01)
    """Offset of the default joint position (the action's centre) [rad], U(lo, hi) per joint. Per environment."""
    latency_prob: float = 0.5
    """Probability that an environment applies its actions one control step late (else 0 steps). Per environment."""
    push_interval: Range | None = (1.0, 3.0)
    """Time between pushes [s], U(lo, hi). Per environment."""
    push_lin_vel: tuple[float, float, float] = (0.5, 0.5, 0.2)
    """Half-widths of the pushes' linear velocity change (x, y, z; world frame) [m/s]."""
    push_ang_vel: tuple[float, float, float] = (0.52, 0.52, 0.78)
    """Half-widths of the pushes' angular velocity change (roll, pitch, yaw; body frame) [rad/s]."""
    reset_root_pos: tuple[float, float, float] | None = (0.05, 0.05, 0.01)
    """Half-widths of the root position noise at reset (x, y, z) [m]. Per environment."""
    reset_root_rot: tuple[float, float, float] | None = (0.1, 0.1, 0.2)
    """Half-widths of the root orientation noise at reset (roll, pitch, yaw) [rad]. Per environment."""
    reset_joint_pos: float | None = 0.1
    """Half-width of the joint position noise at reset [rad]. Per environment."""
    observation_noise: bool = True
    """Add the uniform observation noise of METHOD.md 7.1 (root orientation 0.05, velocities 0.5 / 0.2, body
    rotations 0.01, joint velocities 0.5, key bodies 0.01, reference root position 0.25). The noise-free
    observation is returned in ``info["critic_obs"]``."""

    @staticmethod
    def off() -> DomainRandomization:
        """No randomisation at all."""
        return DomainRandomization(
            friction=None, gain_scale=None, link_mass_scale=None, base_mass_offset=None, com_offset=None,
            armature_scale=None, damping_scale=None, joint_offset=None, latency_prob=0.0, push_interval=None,
            reset_root_pos=None, reset_root_rot=None, reset_joint_pos=None, observation_noise=False,
        )

    @property
    def per_batch_active(self) -> bool:
        return any(r is not None for r in (self.friction, self.gain_scale, self.link_mass_scale,
                                            self.base_mass_offset, self.com_offset, self.armature_scale,
                                            self.damping_scale))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple) and len(v) == 2 and f.name not in ("push_lin_vel", "push_ang_vel"):
                if not (np.isfinite(v).all() and v[0] <= v[1]):
                    raise ValueError(f"DomainRandomization.{f.name} must be a finite range (lo <= hi), got {v}")
        if not 0.0 <= self.latency_prob <= 1.0:
            raise ValueError(f"DomainRandomization.latency_prob must be in [0, 1], got {self.latency_prob}")
        if self.push_interval is not None and self.push_interval[0] <= 0:
            raise ValueError(f"DomainRandomization.push_interval must be > 0 s, got {self.push_interval}")


def uniform(gen: torch.Generator, lo: torch.Tensor | float, hi: torch.Tensor | float, shape: tuple[int, ...],
            device: torch.device | str = "cpu") -> torch.Tensor:
    """U(lo, hi) samples of ``shape`` (float32) from ``gen``."""
    u = torch.rand(shape, generator=gen, device=device)
    return lo + (torch.as_tensor(hi) - torch.as_tensor(lo)).to(u) * u


def randomize_model(base: SimModel, dr: DomainRandomization, rng: np.random.Generator) -> tuple[SimModel, dict]:
    """A copy of ``base`` with the per-batch quantities of ``dr`` drawn from ``rng``; returns it and the draws."""
    draws: dict = {}
    model = base
    if dr.friction is not None:
        draws["friction"] = float(rng.uniform(*dr.friction))
        model = model.with_params(mu=draws["friction"])
    if dr.gain_scale is not None:
        s = rng.uniform(*dr.gain_scale, size=2)
        draws["kp_scale"], draws["kd_scale"] = float(s[0]), float(s[1])
        model = model.with_gains(kp=base.kp * s[0], kd=base.kd * s[1])
    changes: dict = {}
    mass = base.body_mass.copy()
    inertia = base.body_inertia.copy()
    if dr.link_mass_scale is not None:
        s = rng.uniform(*dr.link_mass_scale, size=base.nb)
        draws["link_mass_scale"] = s
        mass = mass * s
        inertia = inertia * s[:, None, None]
    if dr.base_mass_offset is not None:
        dm = float(rng.uniform(*dr.base_mass_offset))
        draws["base_mass_offset"] = dm
        new = max(mass[0] + dm, 0.1 * mass[0])
        inertia[0] = inertia[0] * (new / mass[0])
        mass[0] = new
    if dr.link_mass_scale is not None or dr.base_mass_offset is not None:
        changes.update(body_mass=mass, body_inertia=inertia, total_mass=float(mass.sum()))
    if dr.com_offset is not None:
        d = rng.uniform(*dr.com_offset, size=(base.nb, 3))
        draws["com_offset"] = d
        changes["body_com"] = base.body_com + d
    if dr.armature_scale is not None:
        s = rng.uniform(*dr.armature_scale, size=base.nv)
        s[:6] = 1.0
        draws["armature_scale"] = s[6:]
        changes["dof_armature"] = base.dof_armature * s
    if dr.damping_scale is not None:
        s = rng.uniform(*dr.damping_scale, size=base.nv)
        s[:6] = 1.0
        draws["damping_scale"] = s[6:]
        changes["dof_damping"] = base.dof_damping * s
    if changes:
        model = dataclasses.replace(model, warp=None, **changes)
    return model, draws
