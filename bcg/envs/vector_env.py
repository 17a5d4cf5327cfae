"""The natively batched, optionally differentiable G1 motion-tracking environment (torch tensors on ``device``).

Shape of the environment (see ``docs/envs.md``):

* **State.** Everything a step reads is one :class:`~bcg.envs.state.EnvState` of per-environment tensors:
  ``env.state`` returns it, ``env.load_state(s)`` restores it. The environment never modifies a state's tensors in
  place, so a snapshot stays valid, and a snapshot, a few steps and a restore reproduce the same numbers bit for bit
  (observation noise, pushes and the draws of autoresets are functions of the state's per-row ``rng_key``).
* **Pure transition.** :meth:`G1TrackingVectorEnv.transition` ``(state, actions) -> (next_state, reward,
  terminated, truncated, contact)`` does one control step of any batch of rows (e.g. a state repeated into B
  branches) with no hidden randomness and no side effect (``env.core``, :class:`~bcg.envs.step_core.TrackingCore`).
  :meth:`~G1TrackingVectorEnv.step` wraps it with the instability guard, autoreset, observation noise and the info
  dict.
* **Optional layers**, each its own component and off by default (``docs/start_states_and_replay.md``): start frames
  drawn where episodes fail (:class:`~bcg.envs.start_sampling.AdaptiveStartSampler`, used by the resets), replay of
  rows that drifted from the reference (:class:`~bcg.envs.demo_replay.DemonstrationReplay`, after the transition in
  :meth:`~G1TrackingVectorEnv.step`), and deviation rules added to ``terminated``
  (:class:`~bcg.envs.termination.DeviationTermination`, inside the transition).
* **Transition function.** The physics inside the transition goes through ``env.transition_fn``
  (:class:`~bcg.envs.transition.TransitionFn`: :func:`bcg.sim.step`'s signature plus ``env_ids`` and ``state``),
  by default :func:`bcg.sim.step`; gradient estimators replace it.

With ``differentiable=True`` the state carries the autograd graph from step to step, so ``obs`` and ``reward`` of a
step are differentiable w.r.t. that step's ``actions`` and the state at its start (and, through it, earlier actions
until :meth:`G1TrackingVectorEnv.detach` is called, e.g. at a SHAC window boundary). With ``differentiable=False``
every step runs under ``torch.no_grad()``.

Autoreset is :data:`gymnasium.vector.AutoresetMode.SAME_STEP`: an environment that terminates or is truncated is
reset inside the same ``step`` call; the returned observation is the first one of the new episode and
``info["final_obs"]`` holds the last observation of the finished one (rows of environments that did not finish
equal ``obs``), with ``info["_final_obs"]`` the mask of finished environments. ``obs`` and ``final_obs`` carry the
same observation noise; their noise-free versions are ``info["critic_obs"]`` and ``info["final_critic_obs"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from bcg.envs.actions import check_actions
from bcg.envs.assembly import TrackingParts
from bcg.envs.config import MAX_SEED, EnvConfig, check_count, check_seed
from bcg.envs.state import EnvState
from bcg.envs.transition import TransitionFn
from bcg.motion.features import FeatureFn, Features
from bcg.sim import ContactReport

__all__ = ["G1TrackingVectorEnv", "MAX_SEED"]

class G1TrackingVectorEnv(VectorEnv):
    """Batched G1 motion tracking (``BCG-G1-{Run,Jump,Fight,Dance}-v0`` via ``gym.make_vec``).

    Args:
        num_envs: number of environments N (a Python or numpy integer >= 1).
        motion_file: shorthand for ``config.motion_file``.
        config: an :class:`~bcg.envs.config.EnvConfig`; keywords beside it override its fields.
        default_motion: the clip used when neither ``motion_file`` nor the config names one (the registered ids
            pass their own).
        transition_fn: the physics of one control step (default :func:`bcg.sim.step`); see
            :class:`~bcg.envs.transition.TransitionFn`. Also settable later as ``env.transition_fn``.
        **kwargs: any :class:`EnvConfig` field (``kappa``, ``device``, ``differentiable``, ...).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50, "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(
        self,
        num_envs: int = 1,
        motion_file: Any = None,
        *,
        config: EnvConfig | None = None,
        default_motion: str = "run",
        transition_fn: TransitionFn | None = None,
        **kwargs: Any,
    ):
        num_envs = check_count("num_envs", num_envs)
        if motion_file is not None:
            kwargs["motion_file"] = motion_file
        cfg = EnvConfig.from_kwargs(config, **kwargs)
        if cfg.motion_file is None:
            cfg = dataclasses.replace(cfg, motion_file=default_motion)
        self.config = cfg
        """The :class:`EnvConfig` this environment was made with."""
        self.num_envs = num_envs
        self.device = torch.device(cfg.device)
        self.differentiable = bool(cfg.differentiable)
        self.render_mode = cfg.render_mode
        self.autoreset = bool(cfg.autoreset)
        self.ref_steps = int(cfg.ref_steps)
        self.domain_randomization = cfg.randomization

        self.parts = p = TrackingParts.build(cfg, num_envs, transition_fn)
        """Every component of the env (bcg.envs.assembly); the most used ones are also attributes below."""
        self.model, self.motion, self.control_dt = p.model, p.motion, p.model.params.control_dt
        self.default_joint_pos, self.action_scale = p.default_joint_pos, p.action_scale
        self._features, self._ref, self._ref_qpos = p.features, p.reference, p.ref_qpos
        self.num_frames = p.motion.num_frames
        self.observer = p.observer
        """The noise-free observation of simulated features at motion frames (bcg.envs.observer)."""
        self.guard = p.guard
        """The instability guard: rows reset before the physics and ended after it (bcg.envs.instability)."""
        self.draws = p.draws
        """The counter-based random draws of steps and resets (bcg.envs.draws)."""
        self.start_sampler, self.replay = p.start_sampler, p.replay
        """The optional layers: start frames where episodes fail, replay of drifted rows (None when off)."""
        self.rules = p.rules
        """The reward and the termination and truncation rules (bcg.envs.episode_rules)."""
        self.obs_noise = p.obs_noise
        """Observation noise (bcg.envs.obs_noise); ``obs_noise.on`` says whether steps add it."""
        self.actions = p.actions
        """What an action means at a row's frame (bcg.envs.actions)."""
        self.starts = p.starts
        """Where and how rows start new episodes (bcg.envs.resets)."""
        self.core = p.core
        """The pure step of any batch of rows (bcg.envs.step_core), which :meth:`step` wraps with its layers."""

        # finite bounds: states beyond state_limit count as diverged and are reset, so no entry exceeds this
        bound = np.float32(10.0 * self.state_limit)
        self.single_observation_space = gym.spaces.Box(-bound, bound, (self.obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (self.model.nu,), np.float32)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

        self.nonfinite_count = 0
        """Environments reset by the instability guard since construction (non-finite or too fast states)."""
        self._state = p.initial_state(self.domain_randomization.physics_active)
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(int(np.random.default_rng().integers(2**62)))
        self._needs_reset = True
        self._renderer = None
        self._checked: EnvState | None = None  # a state the instability check is known to pass (see _step)
        self._checked_bounds: tuple[float, float, float] | None = None

    # ------------------------------------------------------------------------------------------------ state

    @property
    def state(self) -> EnvState:
        """The current :class:`EnvState` (N rows). Never modified in place by the environment: keep it as a
        snapshot and restore it with :meth:`load_state`."""
        return self._state

    def load_state(self, state: EnvState) -> None:
        """Make ``state`` (N rows, e.g. a snapshot from :attr:`state`) the current state, exactly."""
        if not isinstance(state, EnvState):
            raise TypeError(f"load_state expects an EnvState, got {type(state).__name__}")
        if state.num_envs != self.num_envs:
            raise ValueError(f"load_state expects a state of {self.num_envs} rows (num_envs), got {state.num_envs}; "
                             "a branched state is stepped with env.transition(state, actions)")
        state.check_like(self._state)
        self._state = state
        self._needs_reset = False

    # read-only views of the state's fields (the state object is the one source)
    q = property(lambda self: self._state.q, doc="[N, 36] qpos of the current state.")
    qd = property(lambda self: self._state.qd, doc="[N, 35] qvel of the current state.")
    frame = property(lambda self: self._state.frame, doc="[N] reference frame of the current state.")
    episode_steps = property(lambda self: self._state.episode_steps, doc="[N] steps since each episode began.")
    prev_actions = property(lambda self: self._state.prev_actions, doc="[N, nu] previous actions.")
    joint_offset = property(lambda self: self._state.joint_offset, doc="[N, nu] default-pose offsets [rad].")
    latency = property(lambda self: self._state.latency, doc="[N] bool: actions applied one step late.")
    physics = property(lambda self: self._state.physics,
                       doc="Per-environment physical parameters (domain randomisation), or None for the model's own.")

    def get_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Current ``(q [N, 36], qd [N, 35])`` (MuJoCo qpos / qvel layout)."""
        return self._state.q, self._state.qd

    def set_state(self, q: torch.Tensor, qd: torch.Tensor) -> None:
        """Replace the simulator state (same shapes as :meth:`get_state`; may require grad). The transition
        function's memory is cleared: the rows carry nothing of the steps that led to the old state."""
        if q.shape != self.q.shape or qd.shape != self.qd.shape:
            raise ValueError(f"set_state expects q {list(self.q.shape)} and qd {list(self.qd.shape)}, got "
                             f"{list(q.shape)} and {list(qd.shape)}")
        self._state = dataclasses.replace(self._state, q=q.to(self.q), qd=qd.to(self.qd), memory={})

    @property
    def reset_generator(self) -> torch.Generator:
        """The generator of the keys :meth:`reset` draws for the episodes it starts (seeded by ``reset(seed=...)``);
        a trainer saves its state (``get_state`` / ``set_state``) with a checkpoint for an exact resume."""
        return self._gen

    def layers_state_dict(self) -> dict[str, Any]:
        """The state of the env's layers that lives outside :class:`EnvState` (the adaptive start sampler's failure
        scores); empty when none is on. Agents save it in their checkpoints."""
        return {} if self.start_sampler is None else {"start_sampler": self.start_sampler.state_dict()}

    def load_layers_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`layers_state_dict`'s output (made by an environment with the same layers on)."""
        if set(state) != set(self.layers_state_dict()):
            raise ValueError(f"the layer state holds {sorted(state)}, this environment's layers "
                             f"{sorted(self.layers_state_dict())} (is adaptive start sampling on in both?)")
        if self.start_sampler is not None:
            self.start_sampler.load_state_dict(state["start_sampler"])

    def detach(self) -> None:
        """Cut the autograd graph at the current state (the start of a new differentiable window)."""
        self._state = self._state.detach()

    def _use_warp(self, on: bool) -> None:
        """Switch the Warp paths of the step (CPU only) on or off (:meth:`TrackingParts.set_warp`)."""
        self.parts.set_warp(on)

    _warp = property(lambda self: self.parts.use_warp, doc="Whether the CPU's Warp paths are on.")

    @property
    def feature_fn(self) -> FeatureFn:
        """The :class:`bcg.motion.FeatureFn` that turns states into :class:`Features` (also used for the reference)."""
        return self._features

    def features(self, state: EnvState | None = None) -> Features:
        """Simulated :class:`Features` of ``state`` (default: the current state), differentiable in its q and qd."""
        s = self._state if state is None else state
        return self._features(s.q, s.qd)

    def disc_features(self, state: EnvState | None = None) -> torch.Tensor:
        """233-D ADD discriminator features [N, 233] of ``state`` (default: the current state); compare them with
        ``env.motion.disc_features_at(times)`` of the reference (:func:`bcg.motion.disc_features`)."""
        return self._features.disc(self.features(state))

    def ref_features(self, frame: torch.Tensor) -> Features:
        """Reference :class:`Features` at integer motion frames ``frame`` [N] (clamped to the clip)."""
        return self.rules.ref_features(frame)

    action_offset = property(lambda self: self.actions.offset,
                             doc='"default" or "reference": what a zero action holds (EnvConfig.action_offset).')
    observation_layout = property(lambda self: self.observer.layout, doc="Ordered (term, size) of the observation.")
    obs_dim = property(lambda self: self.observer.dim, doc="Observation size D.")

    # the rules' settings, readable and replaceable on the env (an agent installs its reward as env.reward_fn)
    reward_fn = property(lambda self: self.rules.reward_fn, lambda self, v: setattr(self.rules, "reward_fn", v),
                         doc="The reward callable (default TrackingReward).")
    max_episode_steps = property(lambda self: self.rules.max_episode_steps,
                                 lambda self, v: setattr(self.rules, "max_episode_steps", v),
                                 doc="Step limit of an episode (None: the clip's end only).")
    termination_height = property(lambda self: self.rules.termination_height,
                                  doc="Pelvis height below which a row has fallen [m].")
    termination_distance = property(lambda self: self.rules.termination_distance,
                                    doc="Largest key-point distance to the reference before a row ends [m].")
    deviation = property(lambda self: self.rules.deviation, doc="The deviation rules, or None when off.")

    # ------------------------------------------------------------------------------------------------ actions

    def action_to_target(self, actions: torch.Tensor, joint_offset: torch.Tensor | None = None) -> torch.Tensor:
        """PD joint targets [N, 29] [rad] that actions [N, 29] give in the current state (differentiable):
        q_default + offset + s_a tanh(a), or with ``action_offset="reference"`` q_ref(t+1) + offset + s_a tanh(a),
        the reference at the frame the next step lands on.

        ``joint_offset`` defaults to the current state's (domain randomisation; zeros when off)."""
        offset = self._state.joint_offset if joint_offset is None else joint_offset
        return self.actions.to_target(actions, offset, self._state.frame)

    def target_to_action(self, joint_targets: torch.Tensor, joint_offset: torch.Tensor | None = None) -> torch.Tensor:
        """Actions [N, 29] whose PD targets in the current state are ``joint_targets`` [N, 29] [rad] (inverse of
        :meth:`action_to_target`; every target inside the joint ranges maps to |a| < 1 with the default action
        scale and offset)."""
        offset = self._state.joint_offset if joint_offset is None else joint_offset
        return self.actions.to_action(joint_targets, offset, self._state.frame)

    def _unstable(self, s: EnvState) -> torch.Tensor:
        """[N] bool: the rows of ``s`` the instability guard flags (:class:`~bcg.envs.instability.InstabilityGuard`)."""
        return self.guard(s.q, s.qd)

    @property
    def state_limit(self) -> float:
        """Bound on |q| and |qd| entries beyond which a row counts as diverged (EnvConfig.state_limit)."""
        return self.guard.state_limit

    @state_limit.setter
    def state_limit(self, value: float) -> None:
        self.guard.state_limit = float(value)

    # ------------------------------------------------------------------------------------------------ observation

    def observe(self, state: EnvState | None = None) -> torch.Tensor:
        """Noise-free observation [N, obs_dim] of ``state`` (default: the current state)."""
        s = self._state if state is None else state
        return self.observer(self._features(s.q, s.qd), s.frame)

    # ------------------------------------------------------------------------------------------------ transition

    @property
    def transition_fn(self) -> TransitionFn:
        """The physics of one control step (replaceable; see :class:`~bcg.envs.transition.TransitionFn`)."""
        return self.core.transition_fn

    @transition_fn.setter
    def transition_fn(self, fn: TransitionFn) -> None:
        self.core.transition_fn = fn

    def transition(self, state: EnvState, actions: torch.Tensor
                   ) -> tuple[EnvState, torch.Tensor, torch.Tensor, torch.Tensor, ContactReport]:
        """One control step of any batch of rows: ``(next_state, reward [M], terminated [M], truncated [M], contact)``.

        Pure: no reset, no observation noise, no change to the environment; randomness (pushes) comes from the
        state's keys. Autograd follows torch's grad mode (this method does not switch it). A row whose state is
        unstable (non-finite, |q| > state_limit, |qd| > MAX_SPEED) before or after the physics is not passed on:
        it ends terminated with reward 0, its gradient is blocked, and its next state is its reference pose at rest.
        ``terminated`` includes the deviation rules when they are on (``env.deviation``). See
        :class:`~bcg.envs.step_core.TrackingCore`.
        """
        r = self.core(state, actions)
        return r.state, r.reward, r.terminated, r.truncated, r.contact

    # ------------------------------------------------------------------------------------------------ API

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[torch.Tensor, dict]:
        """Reset all environments (or those of ``options["reset_mask"]``) at random reference phases.

        Every reset environment draws new domain-randomisation values (its row of ``self.physics`` among them).
        ``seed`` (an integer in [0, 2^63 - 1]) reseeds the environment; the same seed gives the same episodes on the
        same device.
        """
        seed = check_seed(seed)
        super().reset(seed=seed)
        if seed is not None:
            self._gen.manual_seed(seed)
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
        keys = torch.randint(0, 2**31 - 1, (len(idx),), generator=self._gen, device=dev)
        with torch.no_grad():
            self._state = self.starts.reset_rows(self._state.detach(), idx, keys)
            obs = self.observe()
        self._needs_reset = False
        info: dict[str, Any] = {"frame": self._state.frame.clone()}
        if self.obs_noise.on:
            info["critic_obs"] = obs
            obs = obs + self.obs_noise(self._state)
        return obs, info

    def step(self, actions: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """Advance all environments by one control step.

        Args:
            actions: [N, 29] (torch on ``device`` or array-like); q_des = q_default + offset + s_a tanh(a).
        Returns:
            ``(obs [N, D], reward [N], terminated [N] bool, truncated [N] bool, info)``. ``info`` holds
            ``final_obs`` / ``_final_obs`` (SAME_STEP autoreset), ``unstable_reset`` [N] (environments whose state
            was non-finite or faster than ``bcg.sim.MAX_SPEED`` at the start of the step and were reset before the
            simulator was called), ``nonfinite`` [N] (environments whose step diverged: reward 0, terminated,
            gradient blocked), ``num_unstable`` (the number of both this step), ``fell`` [N], ``tracking_error``
            [N] (mean over the bodies of the distance between simulated and reference body origins after the step
            [m]; the E_track of docs/method.md §3.10 before averaging over time), ``frame`` [N],
            ``contact_impulse``, ``contact_peak_force`` and ``contact_penetration`` [N, 8], with observation
            noise ``critic_obs`` / ``final_critic_obs`` (noise-free), and with demonstration replay ``replayed``
            [N] bool (rows put back on the reference after the step; ``obs`` is then that of the reference state).
        """
        if self._needs_reset:
            raise RuntimeError("call reset() before step()")
        actions = check_actions(actions, self.num_envs, self.model.nu, self.device)
        if self.differentiable:
            return self._step(actions)
        with torch.no_grad():
            return self._step(actions)

    def _step(self, actions: torch.Tensor):
        s = self._state
        if s is self._checked and self._checked_bounds == self.guard.key():  # passed already (see the end)
            unstable, any_unstable = torch.zeros(s.num_envs, dtype=torch.bool, device=self.device), False
        else:
            unstable = self._unstable(s)
            any_unstable = bool(unstable.any())
        if any_unstable:  # reset before the simulator sees the state, so training never raises
            idx = unstable.nonzero().flatten()
            s = self.starts.reset_rows(s, idx, self.draws.next_keys(s.rng_key[idx]))
        r = self.core(s, actions, stable=None if any_unstable else unstable, tracking=True)
        nxt, reward, terminated, truncated, contact = r.state, r.reward, r.terminated, r.truncated, r.contact
        if r.fused is None:
            obs, done = self.observer(r.features, nxt.frame), terminated | truncated
            num_bad, any_done = int(r.unstable.sum()), None
        else:  # the one-launch path (bcg.envs.warp_step) made them already
            obs, done, num_bad, any_done = r.fused.obs, r.fused.done, r.fused.num_bad, r.fused.num_done > 0
        replayed = None
        if self.replay is not None:
            nxt, obs, replayed = self.replay(nxt, obs, r.tracking_error, done, self.starts.table())
        if self.start_sampler is not None:
            self.start_sampler.record(terminated, nxt.frame, nxt.frame - nxt.episode_steps)
        num_unstable = (int(unstable.sum()) if any_unstable else 0) + num_bad
        self.nonfinite_count += num_unstable
        info: dict[str, Any] = {
            "nonfinite": r.unstable,
            "unstable_reset": unstable,
            "num_unstable": num_unstable,
            "fell": r.fell,
            "tracking_error": r.tracking_error,
            "frame": nxt.frame.clone(),
            "contact_impulse": contact.impulse,
            "contact_peak_force": contact.peak_force,
            "contact_penetration": contact.penetration,
        }
        if replayed is not None:
            info["replayed"] = replayed
        noise_on = self.obs_noise.on
        clean_final = obs
        final_obs = obs + self.obs_noise(nxt) if noise_on else obs
        noisy = final_obs
        if self.autoreset and any_done is None:
            any_done = bool(done.any())
        if self.autoreset and any_done:
            nxt, obs, noisy = self.starts.autoreset(nxt, done, obs, noisy, self.obs_noise if noise_on else None)
        self._state = nxt
        # every row of nxt passed the check after the physics or was replaced by its reference pose at rest, and
        # every reset row came from the reset table: when those poses pass too, the next step need not check again
        self._checked = nxt if self.starts.noiseless and self.starts.table_stable(self.guard) else None
        self._checked_bounds = self.guard.key()
        # a transition function that reports per-call statistics (a gradient estimator) has them in info
        stats = getattr(self.transition_fn, "last_stats", None)
        if stats is not None and hasattr(stats, "as_dict"):
            info["estimator"] = stats.as_dict()
        info["final_obs"] = final_obs
        info["_final_obs"] = done if self.autoreset else torch.zeros_like(done)
        if noise_on:
            info["critic_obs"] = obs
            info["final_critic_obs"] = clean_final
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
