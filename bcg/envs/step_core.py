"""The pure core of the vector env's step: one control step of any batch of rows, ``(state, actions) -> StepResult``.

:class:`TrackingCore` does what a step does between the actions and the episode's signals, with no reset, no
observation noise and no change to anything but its result: the action latency, the action map to PD targets, a due
push, the instability guard before and after the physics (a row with an unusable state never reaches the simulator,
and a row that diverges is replaced by its reference pose at rest, terminated, its gradient blocked), the physics
through the transition function (``transition_fn``: :func:`bcg.sim.step` or an estimator), the simulated features
and the reward and episode rules (``bcg.envs.episode_rules``). The vector env wraps it with the layers that change
its own state: the guard's resets of the incoming state, demonstration replay, start sampling, observation noise and
autoreset (``bcg.envs.vector_env``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch

from bcg.envs.actions import ClipActionMap
from bcg.envs.episode_rules import EpisodeRules
from bcg.envs.grad_mask import RowGradMask
from bcg.envs.instability import InstabilityGuard
from bcg.envs.rewards import StepContext
from bcg.envs.state import EnvState, cleared_memory
from bcg.envs.transition import TransitionFn
from bcg.envs.warp_step import StepOutputs
from bcg.motion.features import FeatureFn, Features
from bcg.sim import ContactReport, SimModel

__all__ = ["StepResult", "TrackingCore"]


class StepResult(NamedTuple):
    """One control step of M rows."""

    state: EnvState
    """The next state (M rows)."""
    reward: torch.Tensor
    """[M], differentiable as the reward function is (0 for unstable rows)."""
    terminated: torch.Tensor
    """[M] bool (falls, drift, deviation rules, unstable rows)."""
    truncated: torch.Tensor
    """[M] bool (the clip's end or the step limit, not terminated)."""
    contact: ContactReport
    """The physics' contact report ([M, nc] impulses, peak forces, penetrations)."""
    features: Features | None
    """The simulated features of the next state (None when the one-launch path ran: ``fused`` has the observation)."""
    unstable: torch.Tensor
    """[M] bool: rows unstable before or after the physics."""
    fell: torch.Tensor
    """[M] bool: the pelvis below the termination height."""
    tracking_error: torch.Tensor | None
    """[M] mean body-position error to the reference [m] (None when not asked for on the torch path)."""
    fused: StepOutputs | None
    """The one-launch outputs (observation, done, counts) when that path ran, else None."""

    def observation(self, observer: Callable[[Features, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The noise-free observation [M, obs_dim] of the next state: the one-launch path's, else ``observer``'s of
        the simulated features (the env's ``observer``)."""
        return self.fused.obs if self.fused is not None else observer(self.features, self.state.frame)


class TrackingCore:
    """One control step of any batch of rows of a tracking env (see the module).

    Args:
        model: the simulator model.
        actions: what an action means at a row's frame (:class:`~bcg.envs.actions.ClipActionMap`).
        guard: the instability guard.
        features: the :class:`FeatureFn` of the simulated state.
        rules: the reward and episode rules.
        push_draw: ``(rng_key [M], counter [M]) -> (countdown [M], velocity [M, 6])``: the next push of each row
            (counter-based draws), or None when pushes are off.
        safe_qpos: ``frame [M] -> q [M, nq]``: the reference pose an unstable row is put in (at rest).
        transition_fn: the physics of one control step (replaceable as ``core.transition_fn``).
    """

    def __init__(self, model: SimModel, actions: ClipActionMap, guard: InstabilityGuard, features: FeatureFn,
                 rules: EpisodeRules,
                 push_draw: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None,
                 safe_qpos: Callable[[torch.Tensor], torch.Tensor], transition_fn: TransitionFn) -> None:
        self.model = model
        self.actions = actions
        self.guard = guard
        self.features = features
        self.rules = rules
        self.push_draw = push_draw
        self.safe_qpos = safe_qpos
        self.transition_fn = transition_fn

    def __call__(self, s: EnvState, actions: torch.Tensor, stable: torch.Tensor | None = None,
                 tracking: bool = False) -> StepResult:
        """The step of ``s`` under ``actions`` [M, nu]. ``stable``: the [M] all-False result of the guard on ``s``
        when the caller has just checked it (saves a second check); ``tracking``: also the tracking error on the
        torch path. Autograd follows torch's grad mode."""
        n, nv, nu = s.num_envs, self.model.nv, self.model.nu
        if tuple(actions.shape) != (n, nu):
            raise ValueError(f"actions must have shape {[n, nu]} (one row per state row), got {list(actions.shape)}")
        # action latency: an environment with latency applies the previous step's action
        applied = torch.where(s.latency[:, None], s.delayed_actions, actions)
        targets = self.actions.to_target(applied, s.joint_offset, s.frame)

        q0, qd0 = s.q, s.qd
        countdown, push_vel = s.push_countdown, s.push_vel
        if self.push_draw is not None:
            push = countdown == 0
            dv = torch.where(push[:, None], push_vel, torch.zeros_like(push_vel))
            qd0 = qd0 + torch.cat([dv, torch.zeros(n, nv - 6, device=dv.device)], 1).detach()
            new_count, new_vel = self.push_draw(s.rng_key, s.episode_steps + 1)
            countdown = torch.where(push, new_count, countdown) - 1
            push_vel = torch.where(push[:, None], new_vel, push_vel)

        # rows with an unusable state never reach the simulator (it refuses |qd| > MAX_SPEED)
        if stable is not None and qd0 is s.qd:  # the caller has just checked this very state (no push in between)
            bad_in, any_bad_in = stable, False
        else:
            bad_in = self.guard(s.q, qd0)
            any_bad_in = bool(bad_in.any())
        memory = s.memory
        if any_bad_in:
            q0 = torch.where(bad_in[:, None], self.safe_qpos(s.frame), q0.detach())
            qd0 = torch.where(bad_in[:, None], torch.zeros_like(qd0), qd0)
            memory = cleared_memory(s.memory, bad_in)
        holder: dict = {}
        if torch.is_grad_enabled():
            q_in, qd_in, t_in = (RowGradMask.apply(x, holder) for x in (q0, qd0, targets))
        else:
            q_in, qd_in, t_in = q0, qd0, targets
        q1, qd1, contact, memory = self.transition_fn(self.model, q_in, qd_in, t_in, s.physics, env_ids=s.env_id,
                                                      memory=memory)
        out = None if any_bad_in else self.rules.one_launch(q1, qd1, actions, s, self.guard.launch_bounds())
        if out is not None and out.num_bad == 0:  # else the general path below replaces the unstable rows first
            nxt = dataclasses.replace(s, q=q1, qd=qd1, frame=out.frame, episode_steps=out.steps, prev_actions=actions,
                                      delayed_actions=actions, push_countdown=countdown, push_vel=push_vel,
                                      memory=memory)
            return StepResult(nxt, out.reward, out.terminated, out.truncated, contact, None, out.bad, out.fell,
                              out.track, out)
        bad = self.guard(q1, qd1)
        if any_bad_in:
            bad = bad_in | bad
        holder["drop"] = bad
        any_bad = bool(bad.any())
        if any_bad:
            q1 = torch.where(bad[:, None], self.safe_qpos(s.frame), q1)
            qd1 = torch.where(bad[:, None], torch.zeros_like(qd1), qd1)

        frame = s.frame + 1
        steps = s.episode_steps + 1
        sim = self.features(q1, qd1)
        sig = self.rules(sim, frame, steps, StepContext(actions, s.prev_actions, contact), bad, any_bad, tracking)
        nxt = dataclasses.replace(s, q=q1, qd=qd1, frame=frame, episode_steps=steps, prev_actions=actions,
                                  delayed_actions=actions, push_countdown=countdown, push_vel=push_vel, memory=memory)
        if any_bad:  # the safe pose is not what the transition function returned
            nxt = nxt.clear_memory(bad)
        return StepResult(nxt, sig.reward, sig.terminated, sig.truncated, contact, sim, bad, sig.fell,
                          sig.tracking_error, None)
