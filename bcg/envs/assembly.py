"""The parts of a tracking environment, built once from an :class:`~bcg.envs.config.EnvConfig`.

:class:`G1TrackingVectorEnv` is a thin shell around these parts: it holds the current
:class:`~bcg.envs.state.EnvState` and runs the Gymnasium API (reset, autoreset, observation noise, the info dict);
everything that computes lives in a part of its own, and which of them run Warp launches or torch code is decided
here, once (Warp on the CPU, torch elsewhere). ``docs/design.md`` draws the parts and who owns which state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bcg.envs.actions import ActionMap, ClipActionMap, default_action_scale
from bcg.envs.clip import env_motion
from bcg.envs.config import EnvConfig
from bcg.envs.demo_replay import DemonstrationReplay
from bcg.envs.draws import CounterDraws
from bcg.envs.episode_rules import EpisodeRules
from bcg.envs.instability import InstabilityGuard
from bcg.envs.obs_noise import ObservationNoiseLayer
from bcg.envs.observer import Observer
from bcg.envs.resets import EpisodeStarts
from bcg.envs.rewards import TrackingReward
from bcg.envs.start_sampling import AdaptiveStartSampler
from bcg.envs.state import EnvState
from bcg.envs.step_core import TrackingCore
from bcg.envs.termination import DeviationTermination
from bcg.envs.transition import TransitionFn, simulator_step
from bcg.envs.warp_features import WarpFeatureFn
from bcg.envs.warp_reward import WarpTrackingReward
from bcg.envs.warp_step import WarpStepOutputs
from bcg.motion.features import Features
from bcg.sim import Physics, SimModel, default_physics

__all__ = ["TrackingParts", "resolve_action_scale"]


def resolve_action_scale(action_scale: Any, nu: int) -> np.ndarray:
    """[nu] float64 action scale s_a [rad]: ``action_scale`` (a scalar or [nu]) or, when None, the default derived
    from the G1's joint ranges (:func:`~bcg.envs.actions.default_action_scale`). Raises ``ValueError`` unless every
    entry is finite and > 0."""
    from bcg.robots.g1 import DEFAULT_JOINT_POS

    if action_scale is None:
        from bcg.motion.formats import joint_ranges

        action_scale = default_action_scale(np.asarray(DEFAULT_JOINT_POS, dtype=np.float64), joint_ranges())
    scale = np.broadcast_to(np.asarray(action_scale, dtype=np.float64), (nu,))
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError(f"action_scale must be finite and > 0 (scalar or [{nu}]), got {action_scale!r}")
    return scale.copy()


def _reference_pose(ref_qpos: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``frame [M] -> q [M, nq]``: the clip's pose at each (clamped) frame, where an unstable row is put at rest."""
    last = ref_qpos.shape[0] - 1
    return lambda frame: ref_qpos[frame.clamp(0, last)]


@dataclass(eq=False)
class TrackingParts:
    """Every component of a tracking environment of ``num_envs`` rows (see the module docstring)."""

    num_envs: int
    """Rows N of the env the parts were built for."""
    model: SimModel
    motion: Any
    """The clip (:class:`bcg.motion.MotionClip`) on the env's device."""
    default_joint_pos: torch.Tensor
    """[nu] the G1's default joint angles [rad]."""
    action_scale: torch.Tensor
    """[nu] s_a [rad]."""
    features: WarpFeatureFn
    """Simulated features of a state (one Warp launch on the CPU)."""
    reference: Features
    """Reference features at every frame of the clip."""
    ref_qpos: torch.Tensor
    """[F, nq] the clip's poses."""
    observer: Observer
    guard: InstabilityGuard
    draws: CounterDraws
    start_sampler: AdaptiveStartSampler | None
    replay: DemonstrationReplay | None
    rules: EpisodeRules
    obs_noise: ObservationNoiseLayer
    default_physics: Physics
    """Rows [N, ...] of the model's own physical parameters."""
    actions: ClipActionMap
    starts: EpisodeStarts
    core: TrackingCore
    use_warp: bool
    """Whether the CPU's Warp paths are on."""

    @classmethod
    def build(cls, cfg: EnvConfig, num_envs: int, transition_fn: TransitionFn | None = None) -> TrackingParts:
        """The parts for ``cfg`` (its ``motion_file`` set) and ``num_envs`` rows; ``transition_fn`` defaults to
        :func:`bcg.sim.step`."""
        from bcg.robots.g1 import DEFAULT_JOINT_POS, MJCF_PATH
        from bcg.sim import load_model

        dev = torch.device(cfg.device)
        m = load_model(MJCF_PATH, device=str(cfg.device), **cfg.dynamics.sim_params())
        motion = env_motion(cfg.motion_file, cfg, m, dev)
        f32 = dict(dtype=torch.float32, device=dev)
        default_joint_pos = torch.as_tensor(np.array(DEFAULT_JOINT_POS), **f32)
        action_scale = torch.as_tensor(resolve_action_scale(cfg.action_scale, m.nu), **f32)
        action_map = ActionMap(default_joint_pos, action_scale)
        # the simulated state's features every step: one Warp launch (and one for the adjoint) on the CPU instead of
        # ~80 small torch operations per pass; the torch path elsewhere (bcg.envs.warp_features)
        features = WarpFeatureFn(m, torch.float32, dev)
        reference: Features = motion.features  # reference features at every frame (the same FeatureFn)
        ref_qpos = motion.qpos.to(dev, torch.float32)
        frames = motion.num_frames
        observer = Observer(reference, m.nb, features.keys.body.numel(), m.nv - 6, int(cfg.ref_steps), dev)
        # on the CPU the per-step work beside the simulator runs in Warp launches (bcg.envs.warp_*: the observation,
        # the default reward, the termination distances, the instability check); the torch code elsewhere
        cpu = dev.type == "cpu"
        guard = InstabilityGuard(cfg.state_limit, m.nq, m.nv, use_warp=cpu)
        draws = CounterDraws(use_warp=cpu)
        # the optional training aids, each its own component, None when off (docs/start_states_and_replay.md)
        lay = cfg.layers
        sampler = (AdaptiveStartSampler(frames, m.params.control_dt, lay.adaptive_start_bin_s, lay.adaptive_start_alpha,
                                        lay.adaptive_start_floor, dev, lay.adaptive_start_credit)
                   if lay.adaptive_start else None)
        replay = DemonstrationReplay(lay.replay_threshold) if lay.replay_threshold is not None else None
        deviation = DeviationTermination(reference, lay.termination_anchor_height, lay.termination_gravity_z,
                                         lay.termination_end_effector_height)
        warp_reward = WarpTrackingReward(reference, m.nu) if cpu else None
        rules = EpisodeRules(
            reference, TrackingReward() if cfg.reward == "tracking" else cfg.reward,
            cfg.termination_height, cfg.termination_distance, cfg.max_episode_steps,
            deviation if deviation.active else None, warp_reward,
            WarpStepOutputs(features.warp_kin, observer.warp, warp_reward, frames) if cpu else None)
        width = torch.cat([torch.full((size,), cfg.observation_noise.half_width(name), **f32)
                           for name, size in observer.layout])
        obs_noise = ObservationNoiseLayer(width, draws, bool(cfg.randomization.observation_noise))
        physics = default_physics(m, num_envs, dev)
        clip_actions = ClipActionMap(action_map, cfg.action_offset, ref_qpos[:, 7:])
        starts = EpisodeStarts(m, features, reference, ref_qpos, action_map, clip_actions.base, observer,
                               cfg.randomization, physics, m.params.control_dt, draws, sampler, use_warp=cpu)
        core = TrackingCore(m, clip_actions, guard, features, rules,
                            starts.push_draw if cfg.randomization.push_interval is not None else None,
                            _reference_pose(ref_qpos), transition_fn if transition_fn is not None else simulator_step)
        return cls(num_envs, m, motion, default_joint_pos, action_scale, features, reference, ref_qpos, observer, guard,
                   draws, sampler, replay, rules, obs_noise, physics, clip_actions, starts, core, cpu)

    def set_warp(self, on: bool) -> None:
        """Switch the Warp paths (CPU only) on or off; off, every part runs its torch code, which the Warp paths are
        tested against (``tests/test_env_warp_features.py``)."""
        self.use_warp = bool(on) and self.ref_qpos.device.type == "cpu"
        for part in (self.guard, self.draws, self.starts):
            part.use_warp = self.use_warp
        self.features.enabled = self.use_warp
        self.observer.use_warp = self.use_warp and self.observer.warp is not None
        self.rules.use_warp = self.use_warp and self.rules.warp_reward is not None

    def initial_state(self, randomized_physics: bool) -> EnvState:
        """The N rows at the clip's first pose, at rest, before any reset draws (keys 0, pushes off); with per-row
        physics rows (``randomized_physics``) at the model's own values."""
        n, m, dev = self.num_envs, self.model, self.ref_qpos.device
        f32 = dict(dtype=torch.float32, device=dev)
        long = dict(dtype=torch.long, device=dev)
        return EnvState(
            q=self.ref_qpos[0].expand(n, m.nq).clone(), qd=torch.zeros(n, m.nv, **f32),
            frame=torch.zeros(n, **long), episode_steps=torch.zeros(n, **long),
            prev_actions=torch.zeros(n, m.nu, **f32), delayed_actions=torch.zeros(n, m.nu, **f32),
            joint_offset=torch.zeros(n, m.nu, **f32), latency=torch.zeros(n, dtype=torch.bool, device=dev),
            push_countdown=torch.full((n,), -1, **long), push_vel=torch.zeros(n, 6, **f32),
            rng_key=torch.zeros(n, **long), env_id=torch.arange(n, **long),
            physics=self.default_physics if randomized_physics else None,
        )
