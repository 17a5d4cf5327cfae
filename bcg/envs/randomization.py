"""Domain randomisation of the G1 tracking environments (docs/method.md §7.3).

Everything is drawn independently for every environment at each of its resets:

* physical parameters, passed to the simulator as per-environment :class:`bcg.sim.Physics` rows: ground
  friction, PD gain scale (kp and kd), link mass scale, base mass offset, link COM offset, joint armature scale,
  joint damping scale (the engine has viscous joint damping only, no dry friction, so the "joint friction" range
  scales ``dof_damping``), and, when asked for, how the ground gives under the feet (the contacts' Baumgarte factor,
  and a soft ground's time constant for a share of the environments) and the actuators' torque limits;
* default joint position offset, action latency (0 or 1 control step), pushes (detached velocity impulses every
  U(1, 3) s), reset noise on the root position, root orientation and joint positions, observation noise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from bcg.sim import ContactParams, Physics

__all__ = ["DomainRandomization", "sample_physics", "uniform"]

Range = tuple[float, float]


@dataclass(frozen=True)
class DomainRandomization:
    """Ranges of the randomised quantities; ``None`` switches a quantity off. Defaults are docs/method.md §7.3.

    Use ``DomainRandomization.off()`` for no randomisation (the environments' default).
    """

    # --- physical parameters (bcg.sim.Physics rows) ---
    friction: Range | None = (0.3, 1.2)
    """Ground friction coefficient mu, U(lo, hi)."""
    gain_scale: Range | None = (0.8, 1.2)
    """Scale of the PD gains kp and kd (one factor each per environment), U(lo, hi)."""
    link_mass_scale: Range | None = (0.8, 1.2)
    """Scale of every link's mass and inertia (one factor per link), U(lo, hi)."""
    base_mass_offset: Range | None = (-3.0, 3.0)
    """Mass added to the pelvis [kg], U(lo, hi) (inertia scaled along)."""
    com_offset: Range | None = (-0.03, 0.03)
    """Offset of every link's centre of mass per axis [m], U(lo, hi)."""
    armature_scale: Range | None = (0.75, 1.25)
    """Scale of each hinge's armature, U(lo, hi)."""
    damping_scale: Range | None = (0.5, 1.5)
    """Scale of each hinge's viscous damping, U(lo, hi) (the paper's "joint friction"; no dry friction)."""
    contact_beta: Range | None = None
    """Baumgarte factor of the foot contacts (a penetration d is pushed out at beta d / h), U(lo, hi) in [0, 1];
    None: the model's (0.5). Lower is a softer, deeper ground."""
    contact_soft_timeconst: Range | None = None
    """Time constant [s] of a soft ground (``ContactParams.soft_timeconst``, MuJoCo's solref[0]: an impact braked over
    several substeps instead of stopped within one), U(lo, hi), for a share ``contact_soft_share`` of the environments;
    the others keep the model's contact. Each value must be at least two substeps."""
    contact_soft_share: float = 0.5
    """Probability that an environment gets the soft ground of ``contact_soft_timeconst``."""
    torque_limit_scale: Range | None = None
    """Scale of each actuator's torque limit (the level the PD torque saturates at), U(lo, hi) per actuator; None:
    the model's. MuJoCo clamps at the limit where our smooth saturation gives 16 % less there."""
    dropout_probability: Range | None = None
    """Probability that a foot sphere near the ground has no contact in a substep (``bcg.sim.ContactParams.dropout``),
    U(lo, hi) in [0, 1] per environment; None: the model's (0). MuJoCo, finding contacts once per 5 ms step, misses
    toes that rock off the ground for a step, and they sink deep into its soft ground (docs/envs.md)."""
    # --- actions, pushes, resets, observations ---
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
    """Add the uniform observation noise of docs/method.md §7.1 (root orientation 0.05, velocities 0.5 / 0.2, body
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
    def physics_active(self) -> bool:
        """Whether any physical parameter is randomised (the environments then pass bcg.sim.Physics rows)."""
        return any(r is not None for r in (self.friction, self.gain_scale, self.link_mass_scale,
                                            self.base_mass_offset, self.com_offset, self.armature_scale,
                                            self.damping_scale, self.contact_beta, self.contact_soft_timeconst,
                                            self.torque_limit_scale, self.dropout_probability))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple) and len(v) == 2 and f.name not in ("push_lin_vel", "push_ang_vel"):
                if not (np.isfinite(v).all() and v[0] <= v[1]):
                    raise ValueError(f"DomainRandomization.{f.name} must be a finite range (lo <= hi), got {v}")
        if not 0.0 <= self.latency_prob <= 1.0:
            raise ValueError(f"DomainRandomization.latency_prob must be in [0, 1], got {self.latency_prob}")
        if self.torque_limit_scale is not None and self.torque_limit_scale[0] <= 0:
            raise ValueError(f"DomainRandomization.torque_limit_scale must be > 0, got {self.torque_limit_scale}")
        if self.contact_beta is not None and not 0.0 <= self.contact_beta[0] <= self.contact_beta[1] <= 1.0:
            raise ValueError(f"DomainRandomization.contact_beta must lie in [0, 1], got {self.contact_beta}")
        p = self.dropout_probability
        if p is not None and not 0.0 <= p[0] <= p[1] <= 1.0:
            raise ValueError(f"DomainRandomization.dropout_probability must lie in [0, 1], got {p}")
        if self.contact_soft_timeconst is not None and self.contact_soft_timeconst[0] <= 0:
            raise ValueError("DomainRandomization.contact_soft_timeconst must be > 0 s, got "
                             f"{self.contact_soft_timeconst}")
        if not 0.0 <= self.contact_soft_share <= 1.0:
            raise ValueError(f"DomainRandomization.contact_soft_share must be in [0, 1], got {self.contact_soft_share}")
        if self.push_interval is not None and self.push_interval[0] <= 0:
            raise ValueError(f"DomainRandomization.push_interval must be > 0 s, got {self.push_interval}")


def uniform(gen: torch.Generator, lo: torch.Tensor | float, hi: torch.Tensor | float, shape: tuple[int, ...],
            device: torch.device | str = "cpu") -> torch.Tensor:
    """U(lo, hi) samples of ``shape`` (float32) from ``gen``."""
    u = torch.rand(shape, generator=gen, device=device)
    return lo + (torch.as_tensor(hi) - torch.as_tensor(lo)).to(u) * u


def sample_physics(base: Physics, dr: DomainRandomization, gen: torch.Generator,
                   params: ContactParams | None = None) -> Physics:
    """Independent draws of the physical quantities of ``dr`` for each row of ``base`` (the model's own values,
    e.g. from :func:`bcg.sim.default_physics`); quantities switched off keep the base values. ``params`` (the
    model's contact parameters: substep, soft impedance) is needed when ``dr`` draws a soft ground."""
    k, nb = base.body_mass.shape
    nv = base.dof_armature.shape[1]
    dev = base.body_mass.device
    mass, inertia, com = base.body_mass.clone(), base.body_inertia.clone(), base.body_com.clone()
    arm, damp, kp, kd, mu = base.dof_armature, base.dof_damping, base.kp, base.kd, base.mu
    if dr.friction is not None:
        mu = uniform(gen, dr.friction[0], dr.friction[1], (k,), dev)
    if dr.gain_scale is not None:
        kp = kp * uniform(gen, dr.gain_scale[0], dr.gain_scale[1], (k, 1), dev)
        kd = kd * uniform(gen, dr.gain_scale[0], dr.gain_scale[1], (k, 1), dev)
    if dr.link_mass_scale is not None:
        s = uniform(gen, dr.link_mass_scale[0], dr.link_mass_scale[1], (k, nb), dev)
        mass = mass * s
        inertia = inertia * s[:, :, None, None]
    if dr.base_mass_offset is not None:
        dm = uniform(gen, dr.base_mass_offset[0], dr.base_mass_offset[1], (k,), dev)
        new = torch.maximum(mass[:, 0] + dm, 0.1 * mass[:, 0])
        inertia[:, 0] = inertia[:, 0] * (new / mass[:, 0])[:, None, None]
        mass[:, 0] = new
    if dr.com_offset is not None:
        com = com + uniform(gen, dr.com_offset[0], dr.com_offset[1], (k, nb, 3), dev)
    hinge = torch.ones(k, nv, device=dev, dtype=torch.bool)
    hinge[:, :6] = False
    if dr.armature_scale is not None:
        s = uniform(gen, dr.armature_scale[0], dr.armature_scale[1], (k, nv), dev)
        arm = torch.where(hinge, arm * s, arm)
    if dr.damping_scale is not None:
        s = uniform(gen, dr.damping_scale[0], dr.damping_scale[1], (k, nv), dev)
        damp = torch.where(hinge, damp * s, damp)
    gains = _contact_gains(base.contact_bias, dr, gen, params)
    limit = base.torque_limit
    if dr.torque_limit_scale is not None:
        lo, hi = dr.torque_limit_scale
        limit = limit * uniform(gen, lo, hi, tuple(limit.shape), dev)
    dropout = base.contact_dropout
    if dr.dropout_probability is not None:
        dropout = uniform(gen, dr.dropout_probability[0], dr.dropout_probability[1], (k,), dev)
    return Physics(body_mass=mass, body_com=com, body_inertia=inertia, dof_armature=arm, dof_damping=damp, kp=kp,
                   kd=kd, mu=mu, contact_bias=gains, torque_limit=limit, contact_dropout=dropout)


def _contact_gains(base: torch.Tensor, dr: DomainRandomization, gen: torch.Generator,
                   params: ContactParams | None) -> torch.Tensor:
    """[k, 3] normal-row bias gains (g_free, g_start, g_depth) with the contact draws of ``dr`` applied to ``base``:
    a drawn Baumgarte factor replaces g_depth; a soft ground of time constant T sets (g_free, g_start) = (i, 2 h / T
    - i) as ``ContactParams.normal_bias_gains`` does (impedance i, substep h)."""
    k, dev = base.shape[0], base.device
    gains = base
    if dr.contact_beta is not None:
        gains = gains.clone()
        gains[:, 2] = uniform(gen, dr.contact_beta[0], dr.contact_beta[1], (k,), dev)
    if dr.contact_soft_timeconst is not None:
        if params is None:
            raise ValueError("sample_physics needs the model's ContactParams to draw a soft ground")
        lo, hi = dr.contact_soft_timeconst
        if lo < 2 * params.dt:
            raise ValueError(f"DomainRandomization.contact_soft_timeconst must be >= 2 substeps ({2 * params.dt:g} s), "
                             f"got {dr.contact_soft_timeconst}")
        t = uniform(gen, lo, hi, (k,), dev)
        soft = torch.rand(k, generator=gen, device=dev) < dr.contact_soft_share
        i = float(params.soft_impedance)
        gains = gains.clone()
        gains[:, 0] = torch.where(soft, torch.full_like(t, i), gains[:, 0])
        gains[:, 1] = torch.where(soft, 2.0 * params.dt / t - i, gains[:, 1])
    return gains
