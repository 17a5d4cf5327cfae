"""How rows of the G1 tracking environments start new episodes: start frames, reset noise and per-episode draws.

A new episode of a row starts at the reference state of a frame of the clip (uniform over the clip, or where episodes
fail with :class:`~bcg.envs.start_sampling.AdaptiveStartSampler`), with the domain randomisation's reset noise on the
root and joints, lifted so that no foot starts below the ground, and with the episode's own draws: default-pose
offsets, action latency, the first push and the physical parameters. Every draw is a function of the row's new key
and index (:class:`~bcg.envs.draws.CounterDraws` and a generator seeded from them), so a restored state repeats its
resets bit for bit.

Without reset noise a reset state depends on its frame alone; :meth:`EpisodeStarts.table` then holds the state and
first observation of every frame, computed once, and a whole autoreset can be one Warp launch
(:class:`~bcg.envs.warp_reset.WarpTableReset`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bcg.envs.actions import ActionMap
from bcg.envs.config import MAX_SEED
from bcg.envs.draws import NEXT_KEY_ADD, STREAM_PUSH, STREAM_RESET, STREAM_START, CounterDraws
from bcg.envs.instability import InstabilityGuard
from bcg.envs.randomization import DomainRandomization, sample_physics, uniform
from bcg.envs.start_sampling import AdaptiveStartSampler
from bcg.envs.state import EnvState
from bcg.envs.warp_reset import WarpTableReset
from bcg.motion.features import FeatureFn, Features
from bcg.motion.rotations import euler_to_quat_wxyz, quat_mul_wxyz
from bcg.sim import Physics, SimModel

__all__ = ["EpisodeStarts"]

class EpisodeStarts:
    """The start states of new episodes (see the module docstring).

    Args:
        model: the simulator model (sizes, foot spheres, parameter ranges of ``sample_physics``).
        features: the env's :class:`~bcg.motion.FeatureFn` (its ``kin`` lifts reset poses onto the ground).
        reference: the reference :class:`Features` at every frame [F rows].
        ref_qpos: [F, nq] reference qpos.
        actions: the env's :class:`~bcg.envs.actions.ActionMap`.
        target_base: ``(joint_offset [K, nu], frame [K], ahead) -> [K, nu]`` the action map's offset (the env's).
        observe: ``(features, frame [K]) -> [K, obs_dim]`` the env's noise-free observation.
        randomization: the env's :class:`~bcg.envs.randomization.DomainRandomization`.
        default_physics: the model's own physical parameters, one row per environment.
        control_dt: control period [s] (push intervals are drawn in seconds).
        draws: the env's :class:`~bcg.envs.draws.CounterDraws`.
        start_sampler: adaptive start sampling, or None for uniform start frames.
        use_warp: take the one-launch table reset where it applies (CPU); settable later.
    """

    def __init__(self, model: SimModel, features: FeatureFn, reference: Features, ref_qpos: torch.Tensor,
                 actions: ActionMap, target_base: Callable[..., torch.Tensor],
                 observe: Callable[[Features, torch.Tensor], torch.Tensor], randomization: DomainRandomization,
                 default_physics: Physics, control_dt: float, draws: CounterDraws,
                 start_sampler: AdaptiveStartSampler | None, use_warp: bool) -> None:
        self.model, self.randomization, self.draws, self.start_sampler = model, randomization, draws, start_sampler
        self._use_warp = bool(use_warp)
        self._features, self._ref, self._ref_qpos = features, reference, ref_qpos
        self._actions, self._target_base, self._observe = actions, target_base, observe
        self._default_physics, self._control_dt = default_physics, float(control_dt)
        self.num_frames = int(ref_qpos.shape[0])
        self.device = ref_qpos.device
        f32 = dict(dtype=torch.float32, device=self.device)
        self._sphere_body = torch.as_tensor(model.sphere_body, device=self.device)
        self._sphere_pos = torch.as_tensor(model.sphere_pos, **f32)
        self._sphere_radius = torch.as_tensor(model.sphere_radius, **f32)
        self._table: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._held: torch.Tensor | None = None
        self._warp_reset: WarpTableReset | None = None  # made with the table, on the first autoreset
        self._stable: dict[tuple, bool] = {}

    @property
    def use_warp(self) -> bool:
        """Whether the one-launch table reset may be taken (CPU); switching drops the table, whose first
        observations the other path made."""
        return self._use_warp

    @use_warp.setter
    def use_warp(self, on: bool) -> None:
        if bool(on) != self._use_warp:
            self._use_warp, self._table, self._warp_reset = bool(on), None, None

    # ------------------------------------------------------------------------------------------------ poses

    def lift(self, q: torch.Tensor) -> torch.Tensor:
        """``q`` [K, nq] with root heights raised so that no foot sphere starts below z = 0."""
        kin = self._features.kin(q)
        R = kin.rot[:, self._sphere_body]
        c = kin.pos[:, self._sphere_body] + (R @ self._sphere_pos[None, :, :, None])[..., 0]
        low = (c[..., 2] - self._sphere_radius).amin(1)
        return torch.cat([q[:, :2], q[:, 2:3] + torch.clamp(-low, min=0.0)[:, None], q[:, 3:]], 1)

    def pose(self, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference state (q [K, nq], qd [K, nv]) at motion frames ``frame`` [K], before reset noise and lift."""
        ref = self._ref.rows(frame.clamp(0, self.num_frames - 1))
        q = torch.cat([ref.root_pos_w, self._ref_qpos[frame.clamp(0, self.num_frames - 1), 3:7], ref.joint_pos], 1)
        qd = torch.cat([ref.root_lin_vel_w, ref.root_ang_vel_b, ref.joint_vel], 1)
        return q, qd

    @property
    def noiseless(self) -> bool:
        """Whether a reset state depends on its frame alone (no reset noise on the root or the joints)."""
        dr = self.randomization
        return dr.reset_root_pos is None and dr.reset_root_rot is None and dr.reset_joint_pos is None

    def table(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [F, nq], qd [F, nv], noise-free observation [F, obs_dim]) of the reset state at every frame of the
        clip, for resets without reset noise: computed once (the forward kinematics of the lift and of the first
        observation otherwise cost two kinematics passes per reset step), row by row the same numbers."""
        if self._table is None:
            with torch.no_grad():
                frames = torch.arange(self.num_frames, device=self.device)
                q, qd = self.pose(frames)
                q = self.lift(q)
                self._table = (q, qd, self._observe(self._features(q, qd), frames))
        return self._table

    def held_actions(self) -> torch.Tensor:
        """[F, nu] the action whose PD target is the reference pose at every frame with zero joint offsets: a new
        episode's previous action (so a policy that tracks the reference pays no action-rate cost). Computed once,
        one table for every path, so a reset row is the same bits whichever path reset it."""
        if self._held is None:
            with torch.no_grad():
                frames = torch.arange(self.num_frames, device=self.device)
                zeros = torch.zeros(self.num_frames, self.model.nu, device=self.device)
                self._held = self._actions.to_action(self._ref.joint_pos, self._target_base(zeros, frames))
        return self._held

    # ------------------------------------------------------------------------------------------------ draws

    def push_draw(self, key: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(countdown [K] long >= 1, velocity change [K, 6]) of the next push, from the rows' keys and counters."""
        dr, dev = self.randomization, self.device
        if dr.push_interval is None:  # no draw needed (the draws are a function of key and counter: nothing is lost)
            return torch.full_like(key, -1), torch.zeros(len(key), 6, device=dev)
        u = self.draws.uniform(key, counter, 7, STREAM_PUSH)
        t = dr.push_interval[0] + (dr.push_interval[1] - dr.push_interval[0]) * u[:, 0]
        half = torch.tensor(dr.push_lin_vel + dr.push_ang_vel, dtype=torch.float32, device=dev)
        return torch.clamp((t / self._control_dt).round().long(), min=1), (2 * u[:, 1:] - 1) * half

    def frames(self, idx: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Start frames [K] long, uniform in [0, F - 2], of rows ``idx`` [K] starting new episodes with ``keys`` [K]:
        24 bits of the counter-based draw (key, row index) times F - 1, shifted down (exact integers, so the Warp
        reset draws the same frames). With adaptive start sampling, the sampler turns two such draws into a frame."""
        if self.start_sampler is not None:
            return self.start_sampler.frames_from_uniform(self.draws.uniform(keys, idx, 2, STREAM_START))
        bits = (self.draws.uniform(keys, idx, 1, STREAM_RESET)[:, 0] * float(1 << 24)).long()
        return (bits * (self.num_frames - 1)) >> 24

    def _row_generator(self, idx: torch.Tensor, keys: torch.Tensor) -> torch.Generator:
        """One generator for the K rows' other draws (reset noise, joint offsets, latency, physics), seeded from
        their keys and indices, so the draws are a function of the state."""
        mix = self.draws.hash32(keys ^ (idx * 0x9E3779B1))
        g = torch.Generator(device=self.device)
        seed = int((mix * (torch.arange(len(idx), device=self.device) + 1)).sum().item())
        g.manual_seed(seed & MAX_SEED)  # a valid torch seed
        return g

    # ------------------------------------------------------------------------------------------------ resets

    def reset_rows(self, s: EnvState, idx: torch.Tensor, keys: torch.Tensor) -> EnvState:
        """``s`` with rows ``idx`` [K] starting new episodes drawn from the new per-row ``keys`` [K]. The new rows are
        constants; the scatter is out of place and outside ``no_grad``, so the other rows keep their autograd graphs
        (an episode ending inside a differentiable window cuts only its own row)."""
        with torch.no_grad():
            rows = self.start_rows(s, idx, keys)
        return s.scatter(idx, rows)

    def start_rows(self, s: EnvState, idx: torch.Tensor, keys: torch.Tensor) -> EnvState:
        """The K rows (a state of K rows) that rows ``idx`` [K] of ``s`` start their new episodes with, drawn from
        their new ``keys`` [K]."""
        k, dev, dr = len(idx), self.device, self.randomization
        nu = self.model.nu
        frame = self.frames(idx, keys)
        needs_gen = (not self.noiseless or dr.joint_offset is not None or dr.latency_prob > 0
                     or s.physics is not None)
        g = self._row_generator(idx, keys) if needs_gen else None
        if self.noiseless:  # the reset state is a function of the frame alone: read it from the table
            q, qd, _ = self.table()
            q, qd = q[frame], qd[frame]
        else:
            q, qd = self.pose(frame)
            if dr.reset_root_pos is not None:
                h = torch.as_tensor(dr.reset_root_pos, dtype=torch.float32, device=dev)
                q = torch.cat([q[:, 0:3] + uniform(g, -h, h, (k, 3), dev), q[:, 3:]], 1)
            if dr.reset_root_rot is not None:
                h = torch.as_tensor(dr.reset_root_rot, dtype=torch.float32, device=dev)
                rot = quat_mul_wxyz(euler_to_quat_wxyz(uniform(g, -h, h, (k, 3), dev)), q[:, 3:7])
                q = torch.cat([q[:, :3], rot, q[:, 7:]], 1)
            if dr.reset_joint_pos is not None:
                q = torch.cat([q[:, :7], q[:, 7:] + uniform(g, -dr.reset_joint_pos, dr.reset_joint_pos, (k, nu), dev)],
                              1)
            q = self.lift(q)
        # the previous action reproduces the reference pose, so a policy that tracks it pays no action-rate cost
        if dr.joint_offset is None:
            offset, prev = torch.zeros(k, nu, device=dev), self.held_actions()[frame]
        else:
            offset = uniform(g, dr.joint_offset[0], dr.joint_offset[1], (k, nu), dev)
            # frame < num_frames - 1: no clamp needed
            prev = self._actions.to_action(self._ref.joint_pos[frame], self._target_base(offset, frame))
        lat = (torch.rand(k, generator=g, device=dev) < dr.latency_prob
               if dr.latency_prob > 0 else torch.zeros(k, dtype=torch.bool, device=dev))
        countdown, push_vel = self.push_draw(keys, torch.zeros_like(keys))
        physics = None
        if s.physics is not None:
            base = Physics(*(t[s.env_id[idx]] for t in self._default_physics))
            physics = sample_physics(base, dr, g, self.model.params) if dr.physics_active else base
        return EnvState(q=q, qd=qd, frame=frame, episode_steps=torch.zeros_like(frame), prev_actions=prev,
                        delayed_actions=prev, joint_offset=offset, latency=lat, push_countdown=countdown,
                        push_vel=push_vel, rng_key=keys, env_id=s.env_id[idx], physics=physics)

    def autoreset(self, s: EnvState, done: torch.Tensor, obs: torch.Tensor, noisy: torch.Tensor,
                  noise: Callable[[EnvState], torch.Tensor] | None) -> tuple[EnvState, torch.Tensor, torch.Tensor]:
        """The same-step autoreset: rows ``done`` [N] bool of ``s`` start new episodes. Returns ``(state, obs,
        noisy obs)`` [N, obs_dim] with the new rows' first observations put into ``obs`` and ``noisy`` (``noisy``
        is ``obs`` when ``noise``, ``(rows) -> [K, obs_dim]`` observation noise, is None). Out of place with autograd
        on: the rows that go on keep their graphs."""
        if self.table_reset_applies(s, obs, noise is not None):
            with torch.no_grad():  # one launch: the rows' new episodes and first observations (bcg.envs.warp_reset)
                s, obs = self.table_reset()(s, done, obs)
            return s, obs, obs
        idx = done.nonzero().flatten()
        s = self.reset_rows(s, idx, self.draws.next_keys(s.rng_key[idx]))
        with torch.no_grad():
            table = self.noiseless
            rows = None if table and noise is None else s[idx].detach()  # the rows' other fields only when read
            if table:  # the new episodes' first observations depend on their frames alone
                obs_new = self.table()[2][s.frame[idx]]
            else:
                obs_new = self._observe(self._features(rows.q, rows.qd), rows.frame)
            noisy_new = obs_new + noise(rows) if noise is not None else None
        obs = obs.index_put((idx,), obs_new)
        return s, obs, (noisy.index_put((idx,), noisy_new) if noise is not None else obs)

    def table_reset_applies(self, s: EnvState, obs: torch.Tensor, noise_on: bool) -> bool:
        """Whether an autoreset of ``s`` is the reset table alone (no randomisation, no observation noise) and can
        take the one-launch Warp path (:meth:`table_reset`, the same bits). Not for rows with autograd graphs: the
        launch writes fresh tensors, which would cut the graphs of the rows that go on."""
        dr = self.randomization
        return (self.use_warp and self.noiseless and dr.joint_offset is None and dr.latency_prob == 0
                and dr.push_interval is None and not noise_on and self.start_sampler is None
                and not any(t.requires_grad for t in (s.q, s.qd, s.prev_actions, s.delayed_actions, obs))
                and WarpTableReset.accepts(s, obs))

    def table_reset(self) -> WarpTableReset:
        """The one-launch autoreset from :meth:`table` (made on first use)."""
        if self._warp_reset is None:
            q, qd, obs = self.table()
            self._warp_reset = WarpTableReset((q, qd, self.held_actions(), obs), NEXT_KEY_ADD, STREAM_RESET)
        return self._warp_reset

    def table_stable(self, guard: InstabilityGuard) -> bool:
        """Whether every reset-table state and every reference pose at rest (what an unstable row is replaced by)
        passes ``guard`` with its current bounds (computed once per set of bounds)."""
        key = guard.key()
        ok = self._stable.get(key)
        if ok is None:
            with torch.no_grad():
                q, qd, _ = self.table()
                rest = torch.zeros(self.num_frames, self.model.nv, device=self.device)
                ok = not bool(guard(q, qd).any() or guard(self._ref_qpos, rest).any())
            self._stable[key] = ok
        return ok
