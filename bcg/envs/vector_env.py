"""The natively batched, optionally differentiable G1 motion-tracking environment (torch tensors on ``device``).

One :func:`bcg.sim.step` call advances all ``N`` environments. Observations, rewards, terminations and the info
dict are torch tensors. With ``differentiable=True`` the state carries the autograd graph from step to step, so
``obs`` and ``reward`` of a step are differentiable w.r.t. that step's ``actions`` and the state at its start (and,
through it, earlier actions until :meth:`G1TrackingVectorEnv.detach` is called, e.g. at a SHAC window boundary).
With ``differentiable=False`` every step runs under ``torch.no_grad()`` and keeps no graph.

Autoreset is :data:`gymnasium.vector.AutoresetMode.SAME_STEP`: an environment that terminates or is truncated is
reset inside the same ``step`` call; the returned observation is the first one of the new episode and
``info["final_obs"]`` holds the last observation of the finished one (rows of environments that did not finish
equal ``obs``), with ``info["_final_obs"]`` the mask of finished environments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from bcg.envs.observations import (
    Features,
    KeyPoints,
    KinematicsFn,
    features,
    heading_inverse,
    observation_layout,
    reference_observation,
    robot_observation,
    tan_norm,
)
from bcg.envs.randomization import DomainRandomization, sample_physics, uniform
from bcg.envs.rewards import StepContext, TrackingReward
from bcg.sim.physics import Physics, default_physics
from bcg.sim.reference import quat_mul_wxyz

__all__ = ["G1TrackingVectorEnv", "OBS_NOISE"]

OBS_NOISE: dict[str, float] = {
    "root_rot_h": 0.05,
    "root_lin_vel_h": 0.5,
    "root_ang_vel_h": 0.2,
    "body_rot_h": 0.01,
    "joint_vel": 0.5,
    "key_pos_h": 0.01,
    "root_pos_h": 0.25,  # reference root position relative to the robot (each reference step)
}
"""Half-widths of the uniform observation noise per term (METHOD.md 7.1), used when domain randomisation asks."""


class _GradMask(torch.autograd.Function):
    """Identity whose backward zeroes the rows flagged in ``holder["bad"]`` (filled after the forward pass).

    Placed on the simulator's inputs, it blocks the gradient of an environment whose step became non-finite
    without touching the gradient paths of the other environments or the other uses of the same tensor.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, holder: dict) -> torch.Tensor:  # type: ignore[override]
        ctx.holder = holder
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        bad = ctx.holder.get("bad")
        if bad is not None and bool(bad.any()):
            g = torch.where(bad[:, None], torch.zeros_like(g), g)
        return g, None


def _euler_quat(rpy: torch.Tensor) -> torch.Tensor:
    """Quaternions (w, x, y, z) [N, 4] of roll, pitch, yaw [N, 3] (z-y-x intrinsic)."""
    r, p, y = (rpy * 0.5).unbind(-1)
    cr, sr, cp, sp, cy, sy = r.cos(), r.sin(), p.cos(), p.sin(), y.cos(), y.sin()
    return torch.stack([
        cr * cp * cy + sr * sp * sy,
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
    ], -1)


class G1TrackingVectorEnv(VectorEnv):
    """Batched G1 motion tracking (``BCG-G1-{Run,Jump,Fight,Dance}-v0`` via ``gym.make_vec``).

    Args:
        num_envs: number of environments N.
        motion_file: a packaged clip name (``"run"``, ``"jump"``, ``"fight"``, ``"dance"``), any path the motion
            library loads, or a :class:`bcg.envs.motion.Motion` already at the control period.
        kappa: contact stiffness of the simulator [1/m] (default the simulator's, 300).
        substeps: physics substeps per control step (default 4); the substep stays ``sim_dt``.
        sim_dt: physics substep [s] (default 0.005); the control period is ``substeps * sim_dt``.
        device: ``"cpu"`` or ``"cuda[:K]"``; all tensors live there.
        differentiable: keep the autograd graph through the simulator (see the module docstring).
        domain_randomization: ``False`` (default), ``True`` (METHOD.md 7.3 ranges) or a
            :class:`~bcg.envs.randomization.DomainRandomization`.
        reward: ``"tracking"`` (:class:`~bcg.envs.rewards.TrackingReward`) or a callable
            ``reward(sim_features, ref_features, ctx) -> [N]``.
        action_scale: s_a of q_des = q_default + s_a tanh(a), a scalar or [nu] [rad]; default half of each joint's
            range in the MJCF.
        max_episode_steps: optional extra time limit (the clip's end always truncates).
        termination_height: a pelvis below this height [m] ends the episode (fall).
        termination_distance: a key body farther than this from its reference [m] ends the episode.
        ref_steps: number of future reference frames in the observation (3).
        state_limit: a state entry beyond this magnitude counts as diverged (as a NaN).
        autoreset: reset finished environments inside ``step`` (SAME_STEP); ``False`` is for the single env.
        render_mode: ``None`` or ``"rgb_array"`` (renders environment 0 and its reference).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50, "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        motion_file: Any = "run",
        *,
        kappa: float | None = None,
        substeps: int | None = None,
        sim_dt: float | None = None,
        device: str = "cpu",
        differentiable: bool = False,
        domain_randomization: bool | DomainRandomization = False,
        reward: str | Callable[..., torch.Tensor] = "tracking",
        action_scale: float | np.ndarray | None = None,
        max_episode_steps: int | None = None,
        termination_height: float = 0.3,
        termination_distance: float = 1.0,
        ref_steps: int = 3,
        state_limit: float = 1e4,
        autoreset: bool = True,
        render_mode: str | None = None,
    ):
        from bcg.robots.g1 import DEFAULT_JOINT_POS, KEY_BODIES, MJCF_PATH
        from bcg.sim import load_model

        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an integer >= 1, got {num_envs!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if ref_steps < 1:
            raise ValueError(f"ref_steps must be >= 1, got {ref_steps}")
        params: dict[str, Any] = {}
        if kappa is not None:
            params["kappa"] = float(kappa)
        if substeps is not None:
            params["substeps"] = int(substeps)
        if sim_dt is not None:
            params["dt"] = float(sim_dt)
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.differentiable = bool(differentiable)
        self.render_mode = render_mode
        self.autoreset = bool(autoreset)
        self.max_episode_steps = max_episode_steps
        self.termination_height = float(termination_height)
        self.termination_distance = float(termination_distance)
        self.state_limit = float(state_limit)
        self.ref_steps = int(ref_steps)

        self.model = load_model(MJCF_PATH, device=str(device), **params)
        self.control_dt = self.model.params.control_dt
        self.motion = self._load_motion(motion_file)

        if domain_randomization is True:
            domain_randomization = DomainRandomization()
        elif domain_randomization is False or domain_randomization is None:
            domain_randomization = DomainRandomization.off()
        if not isinstance(domain_randomization, DomainRandomization):
            raise TypeError("domain_randomization must be a bool or a DomainRandomization, got "
                            f"{type(domain_randomization).__name__}")
        self.domain_randomization = domain_randomization
        if reward == "tracking":
            reward = TrackingReward()
        if not callable(reward):
            raise ValueError(f"reward must be 'tracking' or a callable reward(sim, ref, ctx), got {reward!r}")
        self.reward_fn = reward

        m = self.model
        nu, dev = m.nu, self.device
        f32 = dict(dtype=torch.float32, device=dev)
        self.default_joint_pos = torch.as_tensor(np.array(DEFAULT_JOINT_POS), **f32)
        if action_scale is None:
            import mujoco

            mj = mujoco.MjModel.from_xml_path(str(MJCF_PATH))
            rng = mj.jnt_range[[mj.actuator_trnid[a, 0] for a in range(mj.nu)]]
            action_scale = 0.5 * (rng[:, 1] - rng[:, 0])
        scale = np.broadcast_to(np.asarray(action_scale, dtype=np.float64), (nu,))
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ValueError(f"action_scale must be finite and > 0 (scalar or [{nu}]), got {action_scale!r}")
        self.action_scale = torch.as_tensor(scale.copy(), **f32)

        self._kin = KinematicsFn(m, torch.float32, dev)
        key_body = [m.body_names.index(k.body) for k in KEY_BODIES]
        self._keys = KeyPoints(torch.as_tensor(key_body, device=dev),
                               torch.tensor([k.offset for k in KEY_BODIES], **f32))
        self._sphere_body = torch.as_tensor(m.sphere_body, device=dev)
        self._sphere_pos = torch.as_tensor(m.sphere_pos, **f32)
        self._sphere_radius = torch.as_tensor(m.sphere_radius, **f32)
        self._build_reference()

        nb, nk, nj = m.nb, len(KEY_BODIES), m.nv - 6
        self.observation_layout = observation_layout(nb, nk, nj, self.ref_steps)
        self.obs_dim = sum(s for _, s in self.observation_layout)
        self._obs_noise = self._noise_vector()

        # finite bounds: states beyond state_limit count as diverged and are reset, so no entry exceeds this
        bound = np.float32(10.0 * self.state_limit)
        self.single_observation_space = gym.spaces.Box(-bound, bound, (self.obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (nu,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

        n = num_envs
        self.q = torch.zeros(n, m.nq, **f32)
        self.qd = torch.zeros(n, m.nv, **f32)
        self.frame = torch.zeros(n, dtype=torch.long, device=dev)
        self.episode_steps = torch.zeros(n, dtype=torch.long, device=dev)
        self.prev_actions = torch.zeros(n, nu, **f32)
        self._delayed_actions = torch.zeros(n, nu, **f32)
        self.joint_offset = torch.zeros(n, nu, **f32)
        self.latency = torch.zeros(n, dtype=torch.bool, device=dev)
        self.push_countdown = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.nonfinite_count = 0
        self._default_physics = default_physics(self.model, n, dev)
        self.physics: Physics | None = None
        """Per-environment physical parameters (domain randomisation), or None for the model's own."""
        self._gen = torch.Generator(device=dev)
        self._np_rng = np.random.default_rng()
        self._gen.manual_seed(int(self._np_rng.integers(2**62)))
        self._needs_reset = True
        self._renderer = None

    # ------------------------------------------------------------------------------------------------ setup

    def _load_motion(self, source: Any):
        from bcg.envs.motion import Motion, load_motion

        if isinstance(source, Motion):
            motion = source.to(self.device)
        elif isinstance(source, (str, Path)):
            motion = load_motion(source, control_dt=self.control_dt, device=str(self.device), model=self.model)
        else:
            raise TypeError("motion_file must be a packaged clip name, a path or a Motion, got "
                            f"{type(source).__name__}")
        if not math.isclose(motion.dt, self.control_dt, rel_tol=1e-6):
            raise ValueError(f"the motion's frame period {motion.dt} s differs from the control period "
                             f"{self.control_dt} s; load it with load_motion(..., control_dt={self.control_dt})")
        if motion.num_frames < 2:
            raise ValueError(f"the motion has {motion.num_frames} frames; at least 2 are needed")
        return motion

    def _build_reference(self) -> None:
        """Reference features at every motion frame, from the motion's qpos/qvel and our own kinematics."""
        q = self.motion.qpos.to(self.device, torch.float32)
        qd = self.motion.qvel.to(self.device, torch.float32)
        with torch.no_grad():
            kin64 = KinematicsFn(self.model, torch.float64, self.device)
            f = features(kin64, KeyPoints(self._keys.body, self._keys.offset.double()), q.double(), qd.double())
            Hi = heading_inverse(f.root_rot_w)
            rot6 = tan_norm(Hi[:, None] @ f.body_rot_w)
        self._ref = Features(*[x.float() for x in f])
        self._ref_rot6 = rot6.float()  # [T, nb, 6], reference bodies in the reference heading frame
        self.num_frames = int(q.shape[0])

    def _noise_vector(self) -> torch.Tensor:
        parts = []
        for name, size in self.observation_layout:
            base = name.split("_", 1)[1] if name.startswith("ref") else name
            n = OBS_NOISE.get(base, 0.0) if (not name.startswith("ref") or base == "root_pos_h") else 0.0
            parts.append(torch.full((size,), n, dtype=torch.float32, device=self.device))
        return torch.cat(parts)

    # ------------------------------------------------------------------------------------------------ state

    def ref_features(self, frame: torch.Tensor) -> Features:
        """Reference :class:`Features` at integer motion frames ``frame`` [N] (clamped to the clip)."""
        f = frame.clamp(0, self.num_frames - 1)
        return Features(*[x[f] for x in self._ref])

    def detach(self) -> None:
        """Cut the autograd graph at the current state (the start of a new differentiable window)."""
        self.q, self.qd = self.q.detach(), self.qd.detach()
        self.prev_actions = self.prev_actions.detach()
        self._delayed_actions = self._delayed_actions.detach()

    def get_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Current ``(q [N, 36], qd [N, 35])`` (MuJoCo qpos / qvel layout)."""
        return self.q, self.qd

    def set_state(self, q: torch.Tensor, qd: torch.Tensor) -> None:
        """Replace the simulator state (same shapes as :meth:`get_state`; may require grad)."""
        if q.shape != self.q.shape or qd.shape != self.qd.shape:
            raise ValueError(f"set_state expects q {list(self.q.shape)} and qd {list(self.qd.shape)}, got "
                             f"{list(q.shape)} and {list(qd.shape)}")
        self.q, self.qd = q.to(self.q), qd.to(self.qd)

    def _lift_to_ground(self, q: torch.Tensor) -> torch.Tensor:
        """Raise root heights so that no foot sphere starts below z = 0."""
        kin = self._kin(q)
        R = kin.rot[:, self._sphere_body]
        c = kin.pos[:, self._sphere_body] + (R @ self._sphere_pos[None, :, :, None])[..., 0]
        low = (c[..., 2] - self._sphere_radius).amin(1)
        q = q.clone()
        q[:, 2] = q[:, 2] + torch.clamp(-low, min=0.0)
        return q

    def _reset_rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New episode states for environments ``idx`` (detached); updates the per-environment bookkeeping."""
        k, dev, dr, g = len(idx), self.device, self.domain_randomization, self._gen
        frame = torch.randint(0, self.num_frames - 1, (k,), generator=g, device=dev)
        ref = self.ref_features(frame)
        q = torch.cat([ref.root_pos_w, self.motion.qpos.to(dev, torch.float32)[frame, 3:7], ref.joint_pos], 1)
        qd = torch.cat([ref.root_lin_vel_w, ref.root_ang_vel_b, ref.joint_vel], 1)
        if dr.reset_root_pos is not None:
            h = torch.as_tensor(dr.reset_root_pos, dtype=torch.float32, device=dev)
            q[:, 0:3] += uniform(g, -h, h, (k, 3), dev)
        if dr.reset_root_rot is not None:
            h = torch.as_tensor(dr.reset_root_rot, dtype=torch.float32, device=dev)
            q[:, 3:7] = quat_mul_wxyz(_euler_quat(uniform(g, -h, h, (k, 3), dev)), q[:, 3:7])
        if dr.reset_joint_pos is not None:
            q[:, 7:] += uniform(g, -dr.reset_joint_pos, dr.reset_joint_pos, (k, self.model.nu), dev)
        q = self._lift_to_ground(q)
        nu = self.model.nu
        # out of place: these tensors may be saved for backward by the step that triggered the reset
        self.frame = self.frame.index_put((idx,), frame)
        self.episode_steps = self.episode_steps.index_fill(0, idx, 0)
        offset = (uniform(g, dr.joint_offset[0], dr.joint_offset[1], (k, nu), dev)
                  if dr.joint_offset is not None else torch.zeros(k, nu, device=dev))
        self.joint_offset = self.joint_offset.index_put((idx,), offset)
        lat = (torch.rand(k, generator=g, device=dev) < dr.latency_prob
               if dr.latency_prob > 0 else torch.zeros(k, dtype=torch.bool, device=dev))
        self.latency = self.latency.index_put((idx,), lat)
        self.push_countdown = self.push_countdown.index_put((idx,), self._push_steps(k))
        if dr.physics_active:
            if self.physics is None:
                self.physics = self._default_physics
            base = Physics(*(t[idx] for t in self._default_physics))
            self.physics = self.physics.index_put(idx, sample_physics(base, dr, g))
        return q, qd

    def _push_steps(self, k: int) -> torch.Tensor:
        pi = self.domain_randomization.push_interval
        if pi is None:
            return torch.full((k,), -1, dtype=torch.long, device=self.device)
        t = uniform(self._gen, pi[0], pi[1], (k,), self.device)
        return torch.clamp((t / self.control_dt).round().long(), min=1)

    # ------------------------------------------------------------------------------------------------ observation

    def _observe(self, sim: Features, frame: torch.Tensor) -> torch.Tensor:
        obs_r, Hi = robot_observation(sim)
        fut = torch.stack([frame + k for k in range(1, self.ref_steps + 1)], 1).clamp(max=self.num_frames - 1)
        ref = self._ref
        obs_ref = reference_observation(sim.root_pos_w, Hi, ref.root_pos_w[fut], ref.root_rot_w[fut],
                                        self._ref_rot6[fut], ref.key_pos_w[fut])
        return torch.cat([obs_r, obs_ref], -1)

    def _noisy(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.domain_randomization.observation_noise:
            return obs
        u = torch.rand(obs.shape, generator=self._gen, device=self.device) * 2 - 1
        return obs + (u * self._obs_noise).detach()

    def observe(self) -> torch.Tensor:
        """Noise-free observation [N, obs_dim] of the current state."""
        return self._observe(features(self._kin, self._keys, self.q, self.qd), self.frame)

    # ------------------------------------------------------------------------------------------------ API

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[torch.Tensor, dict]:
        """Reset all environments (or those of ``options["reset_mask"]``) at random reference phases.

        Every reset environment draws new domain-randomisation values (its row of ``self.physics`` among them).
        ``seed`` reseeds the environment's torch and numpy generators; the same seed gives the same episodes on the
        same device.
        """
        super().reset(seed=seed)
        if seed is not None:
            self._gen.manual_seed(int(seed))
            self._np_rng = np.random.default_rng(int(seed))
        mask = None if options is None else options.get("reset_mask")
        n, dev = self.num_envs, self.device
        if mask is None:
            idx = torch.arange(n, device=dev)
        else:
            mask = torch.as_tensor(np.asarray(mask) if not isinstance(mask, torch.Tensor) else mask,
                                   dtype=torch.bool, device=dev)
            if mask.shape != (n,):
                raise ValueError(f"options['reset_mask'] must have shape ({n},), got {tuple(mask.shape)}")
            idx = mask.nonzero().flatten()
        q, qd = self._reset_rows(idx)
        with torch.no_grad():
            self.q = self.q.detach().index_put((idx,), q)
            self.qd = self.qd.detach().index_put((idx,), qd)
            self.prev_actions = self.prev_actions.detach().index_fill(0, idx, 0.0)
            self._delayed_actions = self._delayed_actions.detach().index_fill(0, idx, 0.0)
        self._needs_reset = False
        with torch.no_grad():
            obs = self.observe()
        info: dict[str, Any] = {"frame": self.frame.clone()}
        noisy = self._noisy(obs)
        if noisy is not obs:
            info["critic_obs"] = obs
        return noisy, info

    def _check_actions(self, actions: Any) -> torch.Tensor:
        if isinstance(actions, np.ndarray) or not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=self.device)
        want = (self.num_envs, self.model.nu)
        if tuple(actions.shape) != want:
            raise ValueError(f"actions must have shape {list(want)}, got {list(actions.shape)}")
        if not actions.is_floating_point():
            raise TypeError(f"actions must be floating point, got {actions.dtype}")
        if actions.device != self.device:
            raise ValueError(f"actions are on {actions.device}, the environment on {self.device}")
        bad = ~torch.isfinite(actions.detach()).all(1)
        if bool(bad.any()):
            raise ValueError(f"actions contain NaN or inf (environments {bad.nonzero().flatten()[:8].tolist()})")
        return actions.to(torch.float32)

    def step(self, actions: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance all environments by one control step.

        Args:
            actions: [N, nu] (torch on ``device`` or array-like); q_des = q_default + offset + s_a tanh(a).
        Returns:
            ``(obs [N, D], reward [N], terminated [N] bool, truncated [N] bool, info)``. ``info`` holds
            ``final_obs`` / ``_final_obs`` (SAME_STEP autoreset), ``nonfinite`` [N] (environments whose state
            diverged this step: reset, reward 0, terminated, gradient blocked), ``fell`` [N], ``frame`` [N],
            ``contact_impulse`` [N, nc] and, with observation noise, ``critic_obs``.
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = self._check_actions(actions)
        if self.differentiable:
            return self._step(actions)
        with torch.no_grad():
            return self._step(actions)

    def _step(self, actions: torch.Tensor):
        from bcg.sim import step as sim_step

        dev, dr = self.device, self.domain_randomization
        # action latency: an environment with latency applies the previous step's action
        applied = torch.where(self.latency[:, None], self._delayed_actions, actions)
        self._delayed_actions = actions
        targets = self.default_joint_pos + self.joint_offset + self.action_scale * torch.tanh(applied)

        q0, qd0 = self.q, self.qd
        if dr.push_interval is not None:
            push = self.push_countdown == 0
            if bool(push.any()):
                k = int(push.sum())
                dv = torch.zeros(self.num_envs, self.model.nv, device=dev)
                lin = torch.as_tensor(dr.push_lin_vel, dtype=torch.float32, device=dev)
                ang = torch.as_tensor(dr.push_ang_vel, dtype=torch.float32, device=dev)
                dv[push, 0:3] = uniform(self._gen, -lin, lin, (k, 3), dev)
                dv[push, 3:6] = uniform(self._gen, -ang, ang, (k, 3), dev)
                qd0 = qd0 + dv.detach()
                self.push_countdown = torch.where(push, self._push_steps(self.num_envs), self.push_countdown)
            self.push_countdown = self.push_countdown - 1

        holder: dict = {}
        if torch.is_grad_enabled():
            q_in, qd_in, t_in = (_GradMask.apply(x, holder) for x in (q0, qd0, targets))
        else:
            q_in, qd_in, t_in = q0, qd0, targets
        q1, qd1, contact = sim_step(self.model, q_in, qd_in, t_in, self.physics)
        with torch.no_grad():
            bad = ~(torch.isfinite(q1).all(1) & torch.isfinite(qd1).all(1))
            bad |= (q1.abs().amax(1) > self.state_limit) | (qd1.abs().amax(1) > self.state_limit)
        holder["bad"] = bad
        any_bad = bool(bad.any())
        if any_bad:
            self.nonfinite_count += int(bad.sum())
            q1 = torch.where(bad[:, None], q0.detach(), q1)
            qd1 = torch.where(bad[:, None], torch.zeros_like(qd1), qd1)

        self.frame = self.frame + 1
        self.episode_steps = self.episode_steps + 1
        sim = features(self._kin, self._keys, q1, qd1)
        ref = self.ref_features(self.frame)
        reward = self.reward_fn(sim, ref, StepContext(actions, self.prev_actions, contact))
        if reward.shape != (self.num_envs,):
            raise ValueError(f"the reward function returned shape {list(reward.shape)}, expected [{self.num_envs}]")
        if any_bad:
            reward = torch.where(bad, torch.zeros_like(reward), reward)
        obs = self._observe(sim, self.frame)

        with torch.no_grad():
            fell = sim.root_pos_w[:, 2] < self.termination_height
            far = (sim.key_pos_w - ref.key_pos_w).norm(dim=-1).amax(1) > self.termination_distance
            terminated = fell | far | bad
            truncated = self.frame >= self.num_frames - 1
            if self.max_episode_steps is not None:
                truncated |= self.episode_steps >= self.max_episode_steps
            truncated &= ~terminated
            done = terminated | truncated

        self.q, self.qd = q1, qd1
        self.prev_actions = actions
        info: dict[str, Any] = {
            "nonfinite": bad,
            "fell": fell,
            "frame": self.frame.clone(),
            "contact_impulse": contact.impulse,
        }
        final_obs = obs
        if self.autoreset and bool(done.any()):
            idx = done.nonzero().flatten()
            qr, qdr = self._reset_rows(idx)
            self.q = self.q.index_put((idx,), qr)
            self.qd = self.qd.index_put((idx,), qdr)
            self.prev_actions = self.prev_actions.index_fill(0, idx, 0.0)
            self._delayed_actions = self._delayed_actions.index_fill(0, idx, 0.0)
            with torch.no_grad():
                f_new = features(self._kin, self._keys, qr, qdr)
                obs_new = self._observe(f_new, self.frame[idx])
            obs = obs.index_put((idx,), obs_new)
        info["final_obs"] = final_obs
        info["_final_obs"] = done if self.autoreset else torch.zeros_like(done)
        noisy = self._noisy(obs)
        if noisy is not obs:
            info["critic_obs"] = obs
        return noisy, reward, terminated, truncated, info

    # ------------------------------------------------------------------------------------------------ render

    def render(self) -> np.ndarray | None:
        """An RGB frame [H, W, 3] uint8 of environment 0 and its reference ghost (``render_mode="rgb_array"``)."""
        if self.render_mode is None:
            gym.logger.warn("render() called without a render_mode; pass render_mode='rgb_array'")
            return None
        from bcg.envs.rendering import GhostRenderer

        if self._renderer is None:
            self._renderer = GhostRenderer()
        ref_q = self.motion.qpos[int(self.frame[0].clamp(max=self.num_frames - 1))]
        return self._renderer.render(self.q[0].detach().cpu().double().numpy(), ref_q.cpu().double().numpy())

    def close_extras(self, **kwargs: Any) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
