"""Where our simulator and MuJoCo part on a policy's own states: the one-step gap.

A policy is replayed in C MuJoCo (the protocol of :func:`bcg.evaluation.mujoco_transfer.replay`) and every control
step it takes is recorded: the state (q, qd) [float64 of MuJoCo's], the PD targets and MuJoCo's next state. Our
simulator then takes one control step from each recorded state with the same targets, and the difference of the next
velocities is the one-step gap. Split by regime, it says which part of the model the two simulators disagree on,
*in the states this policy visits*:

* ``foot contact``: MuJoCo reports a normal impulse on a foot sphere in that step;
* ``actuator saturated``: some actuator's PD torque kp (q* - q) - kd qd exceeds its torque limit (MuJoCo clamps it,
  our simulator saturates it smoothly, 16 % lower at the limit; docs/simulator.md);
* ``joint limit``: some joint ends MuJoCo's step within :data:`LIMIT_MARGIN` of its range or beyond it (MuJoCo's
  limits are soft constraints, ours a hard guard);
* ``none of these``: free flight of unsaturated joints inside their ranges;
* ``episode falls`` / ``episode stands``: the steps of the episodes that end in a fall in MuJoCo, and of the others.

:meth:`Transitions.within` keeps the steps of one stretch of the clip, to ask which regime carries the gap where a
policy falls.

A second pass re-steps both simulators from the same states with every joint limit removed, which isolates the
limits' share. The gap is measured on velocities because positions differ by only h times it after one step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bcg.evaluation.mujoco_transfer import TransferOptions, replay

if TYPE_CHECKING:  # pragma: no cover
    from bcg.sim import SimModel

__all__ = ["GapReport", "LIMIT_MARGIN", "RecordingTransition", "Transitions", "one_step_gap", "record_transitions",
           "restep_mujoco"]

LIMIT_MARGIN = 0.01
"""A joint whose position after the step lies within this of its range's end [rad] (or beyond) engages its limit."""


@dataclass(frozen=True)
class Transitions:
    """K recorded control steps (float64 numpy): ``q`` [K, 36], ``qd`` [K, 35], ``targets`` [K, 29] [rad], the next
    state ``q1``, ``qd1`` and the per-sphere normal ``impulse`` [K, 8] [N s] of the simulator that took them."""

    q: np.ndarray
    qd: np.ndarray
    targets: np.ndarray
    q1: np.ndarray
    qd1: np.ndarray
    impulse: np.ndarray
    model: SimModel | None = None
    """The replay env's model (its contact and integration parameters): what :func:`one_step_gap` re-steps with."""
    clip_time: np.ndarray | None = None
    """[K] where in the clip each step starts [s] (its reference frame times the control period); None: unknown."""
    episode_fell: np.ndarray | None = None
    """[K] bool: the episode of each step ends in a fall in the simulator that took it; None: unknown."""

    def __len__(self) -> int:
        return len(self.q)

    def select(self, keep: np.ndarray) -> Transitions:
        """The steps where the [K] bool mask ``keep`` is true."""
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (len(self),):
            raise ValueError(f"the mask has shape {list(keep.shape)}, expected [{len(self)}]")
        arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        return dataclasses.replace(self, **{k: None if v is None else v[keep] for k, v in arrays.items()})

    def within(self, start_s: float, end_s: float) -> Transitions:
        """The steps that start in the stretch [start_s, end_s) of the clip [s]."""
        if self.clip_time is None:
            raise ValueError("these transitions carry no clip time (record them with record_transitions)")
        if not end_s > start_s:
            raise ValueError(f"the stretch must end after it starts, got {start_s} to {end_s} s")
        return self.select((self.clip_time >= start_s) & (self.clip_time < end_s))


class RecordingTransition:
    """Wraps an env transition function and records every control step it is asked for (:class:`Transitions`; in a
    replay, the rows of the episodes still running).

    States are the env's float32 copies (MuJoCo keeps float64 between steps; the rounding, about 1e-7 relative, is
    far below any gap worth reporting)."""

    def __init__(self, inner: Callable[..., Any]):
        self.inner = inner
        self.model: SimModel | None = None
        self._steps: list[tuple[torch.Tensor, ...]] = []
        self._env_ids: list[np.ndarray] = []

    def __call__(self, model: SimModel, q: torch.Tensor, qd: torch.Tensor, targets: torch.Tensor, physics: Any = None,
                 *, env_ids: torch.Tensor, memory: Any = None) -> Any:
        q1, qd1, contact, mem = self.inner(model, q, qd, targets, physics, env_ids=env_ids, memory=memory)
        self.model = model
        self._steps.append(tuple(x.detach().cpu().double() for x in (q, qd, targets, q1, qd1, contact.impulse)))
        self._env_ids.append(env_ids.detach().cpu().numpy().astype(np.int64))
        return q1, qd1, contact, mem

    def step_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """([K] call index, [K] env row) of every recorded step: in a replay, the control step and the episode."""
        calls = [np.full(len(ids), t, dtype=np.int64) for t, ids in enumerate(self._env_ids)]
        if not calls:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(calls), np.concatenate(self._env_ids)

    def transitions(self) -> Transitions:
        """The recorded steps, stacked."""
        if not self._steps:
            raise ValueError("no control steps were recorded")
        return Transitions(*(torch.cat([s[i] for s in self._steps]).numpy() for i in range(6)), model=self.model)


def record_transitions(policy: Any, motion: Any, options: TransferOptions | None = None, *,
                       simulator: str = "mujoco", env_kwargs: dict[str, Any] | None = None,
                       progress: bool = False) -> Transitions:
    """Replay ``policy`` on ``motion`` in ``simulator`` (:func:`~bcg.evaluation.mujoco_transfer.replay`, the same
    episodes as ``bcg evaluate``; ``options`` default: :class:`TransferOptions`'s) and return every control step it
    took, with where in the clip it starts and whether its episode fell."""
    box: list[RecordingTransition] = []
    options = TransferOptions() if options is None else options

    def wrap(fn: Callable[..., Any]) -> RecordingTransition:
        box.append(RecordingTransition(fn))
        return box[-1]

    rollout = replay(policy, motion, options, simulator=simulator, env_kwargs=env_kwargs, progress=progress,
                     transition_wrapper=wrap)
    step, episode = box[0].step_rows()
    # rollout.frame[t] is the reference frame of the state that control step t started from
    clip_time = rollout.frame[step, episode] * rollout.control_dt
    return dataclasses.replace(box[0].transitions(), clip_time=clip_time.astype(np.float64),
                               episode_fell=np.asarray(rollout.fell, dtype=bool)[episode])


def restep_mujoco(tr: Transitions, *, joint_limits: bool = True, substeps: int = 4,
                  timestep: float = 0.005) -> np.ndarray:
    """[K, 35] MuJoCo's velocities after one control step from each recorded state with its targets (solver warm
    start cleared); ``joint_limits=False`` removes every joint limit of the MJCF first."""
    from bcg.evaluation.mujoco_loop import MujocoLoop

    loop = MujocoLoop(1, substeps=substeps, timestep=timestep)
    if not joint_limits:
        loop.model.jnt_limited[:] = 0
    out = np.empty_like(tr.qd1)
    for k in range(len(tr)):
        loop.set_state(tr.q[k:k + 1], tr.qd[k:k + 1])
        out[k] = loop.step(tr.targets[k:k + 1], contacts=False).qvel[0]
    return out


def _bcg_step(model: SimModel, tr: Transitions) -> np.ndarray:
    from bcg.sim import step

    f = torch.float32
    with torch.no_grad():
        _, qd1, _ = step(model, torch.as_tensor(tr.q, dtype=f), torch.as_tensor(tr.qd, dtype=f),
                         torch.as_tensor(tr.targets, dtype=f))
    return qd1.double().numpy()


@dataclass(frozen=True)
class GapRow:
    """The one-step gap over the steps of one regime."""

    regime: str
    steps: int
    joint_vel_rms: float
    """RMS over steps and joints of the hinge-velocity difference [rad/s]."""
    base_ang_vel: float
    """Mean norm of the base angular-velocity difference [rad/s]."""
    base_lin_vel: float
    """Mean norm of the base linear-velocity difference [m/s]."""
    joint_vel_rms_no_limits: float
    """The same as ``joint_vel_rms`` with every joint limit removed in both simulators [rad/s]."""


@dataclass(frozen=True)
class GapReport:
    """:func:`one_step_gap`'s result: one :class:`GapRow` per regime and the joints that differ most."""

    label: str
    rows: list[GapRow]
    worst_joints: list[tuple[str, float]] = field(default_factory=list)
    """(joint, RMS hinge-velocity difference [rad/s]) of the five joints that differ most, over all steps."""
    saturated_joints: list[tuple[str, float]] = field(default_factory=list)
    """(joint, share of the steps whose PD torque exceeds its limit) of the five actuators saturated most often."""

    @property
    def shares(self) -> dict[str, float]:
        """Share of the steps in each regime (they overlap)."""
        total = max(self.rows[0].steps, 1)  # the first row is "all"
        return {r.regime: r.steps / total for r in self.rows}

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shares": self.shares}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_markdown(self) -> str:
        lines = [f"# One-step gap, bcg - MuJoCo: {self.label}", "",
                 "Our simulator steps once from each state MuJoCo visited under the policy, with the same targets; "
                 "differences of the next velocities (mean over steps).", "",
                 "| steps | count | share | joint vel. RMS [rad/s] | base ang. vel. [rad/s] | base lin. vel. [m/s] "
                 "| joint vel. RMS, no joint limits [rad/s] |", "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            share = self.shares[r.regime]
            lines.append(f"| {r.regime} | {r.steps} | {share:.2f} | {r.joint_vel_rms:.3f} | {r.base_ang_vel:.3f} | "
                         f"{r.base_lin_vel:.3f} | {r.joint_vel_rms_no_limits:.3f} |")
        worst = ", ".join(f"{name} {v:.2f}" for name, v in self.worst_joints)
        saturated = ", ".join(f"{name} {v:.2f}" for name, v in self.saturated_joints if v > 0) or "none"
        return "\n".join(lines + ["", f"Joints that differ most (RMS [rad/s]): {worst}",
                                   f"Actuators saturated most often (share of the steps): {saturated}", ""])


def one_step_gap(tr: Transitions, model: SimModel | None = None, *, label: str = "",
                 limit_ablation: bool = True) -> GapReport:
    """The one-step gap of our simulator (``model``; default: the replay env's own, ``tr.model``, else
    :func:`bcg.sim.load_model`'s) on recorded MuJoCo steps ``tr``, split by regime (module docstring).
    ``limit_ablation=False`` skips the second pass without limits."""
    from bcg.sim import load_model

    model = model or tr.model or load_model()
    if len(tr) == 0:
        raise ValueError("no recorded steps to compare")
    ours = _bcg_step(model, tr)
    if limit_ablation:
        free_ours = _bcg_step(model.without_joint_limits(), tr)
        free_mj = restep_mujoco(tr, joint_limits=False, substeps=model.params.substeps, timestep=model.params.dt)
        free_err = free_ours - free_mj
    else:
        free_err = np.full_like(ours, np.nan)
    err = ours - tr.qd1
    kp, kd, lim = (np.asarray(x, dtype=np.float64) for x in (model.kp, model.kd, model.torque_limit))
    u = kp * (tr.targets - tr.q[:, 7:]) - kd * tr.qd[:, 6:]
    saturated_each = np.abs(u) > lim
    saturated = saturated_each.any(1)
    rng = np.asarray(model.dof_range, dtype=np.float64)[-model.nu:]
    limited = np.asarray(model.dof_limited, dtype=bool)[-model.nu:]
    qj = tr.q1[:, 7:]
    at_limit = (((qj < rng[:, 0] + LIMIT_MARGIN) | (qj > rng[:, 1] - LIMIT_MARGIN)) & limited).any(1)
    contact = tr.impulse.sum(1) > 0
    regimes = {"all": np.ones(len(tr), dtype=bool), "foot contact": contact, "no foot contact": ~contact,
               "actuator saturated": saturated, "joint limit": at_limit,
               "none of these": ~(contact | saturated | at_limit)}
    if tr.episode_fell is not None:
        regimes.update({"episode falls": tr.episode_fell, "episode stands": ~tr.episode_fell})
    rows = []
    for name, sel in regimes.items():
        n = int(sel.sum())
        if n == 0:
            rows.append(GapRow(name, 0, float("nan"), float("nan"), float("nan"), float("nan")))
            continue
        e, fe = err[sel], free_err[sel]
        rows.append(GapRow(name, n, float(np.sqrt((e[:, 6:] ** 2).mean())),
                           float(np.linalg.norm(e[:, 3:6], axis=1).mean()),
                           float(np.linalg.norm(e[:, :3], axis=1).mean()), float(np.sqrt((fe[:, 6:] ** 2).mean()))))
    per_joint = np.sqrt((err[:, 6:] ** 2).mean(0))
    names = list(model.joint_names)
    worst = [(names[j], float(per_joint[j])) for j in np.argsort(-per_joint)[:5]]
    share = saturated_each.mean(0)
    most_saturated = [(names[j], float(share[j])) for j in np.argsort(-share, kind="stable")[:5]]
    return GapReport(label, rows, worst, most_saturated)
