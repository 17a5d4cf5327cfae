"""Where a policy's fall in MuJoCo is decided: each episode runs in one simulator for its first H seconds, then its
state is handed to the other simulator, which runs it to the end.

A policy that stands in our simulator and falls in MuJoCo after many seconds can fall because MuJoCo slowly carried it
somewhere it cannot come back from, or because one short stretch of MuJoCo throws it off. Handing over at several
times H tells them apart: if MuJoCo for H seconds and then ours stands, the state MuJoCo reached by H is still one the
policy recovers from (in ours); the first H after which it falls in ours too brackets the stretch of MuJoCo that
decided the fall. With ``--first bcg`` the roles swap: our simulator first, MuJoCo from H on (do the states ours
reaches survive MuJoCo?).

The protocol is ``bcg evaluate``'s (start phases x seeds, each episode to a fall, the clip's end or ``--seconds``);
every episode hands over at the same time after its own start. ``--after inf`` is the first simulator throughout,
``--after 0`` the second. ``--trace E`` prints, for episode E, the torso's and both feet's heading error against the
reference, the feet's heights and which of their spheres touch the ground around the first handover time, in the
first simulator alone and handed over; with ``--open-loop`` the handed-over episode plays the actions the first
simulator's own replay took, so the two continuations from the same state differ in their dynamics alone.

Usage::

    python benchmarks/simulator_handover.py RUN [--motion CLIP] [--first mujoco|bcg] [--after 0 2 3.2 4 inf]
        [--phases 4 --seeds 0 1] [--seconds S] [--trace E [--open-loop]] [--out handover.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import torch

from bcg.evaluation.evaluate_cli import load_source
from bcg.evaluation.mujoco_transfer import MujocoTransition, Rollout, make_env, replay
from bcg.evaluation.transfer_protocol import TransferOptions
from bcg.robots import g1

TRACE_BODIES = ("torso_link", "left_ankle_roll_link", "right_ankle_roll_link")
"""The bodies whose heading (and, for the feet, height) ``--trace`` prints."""


class HandoverTransition:
    """An env transition function that calls ``first`` for the first ``after_s`` seconds of control steps and
    ``second`` from then on.

    The replay calls its transition once per control step (with the rows still running), so the handover comes the
    same time after every episode's start. ``second`` is built on its first use by ``make_second(model)`` from the
    env's model (a :class:`MujocoTransition` needs its substeps and step size). A MuJoCo transition sets a row from
    the env's state when the row carries no token of its own, so MuJoCo continues from the state ours reached; ours
    reads nothing but the state it is given.
    """

    def __init__(self, first: Callable[..., Any], make_second: Callable[[Any], Callable[..., Any]], after_s: float):
        handover_steps(after_s, 1.0)  # refuse a negative time before any replay
        self.first, self.make_second, self.after_s = first, make_second, after_s
        self.second: Callable[..., Any] | None = None
        self.steps: int | None = None  # from the model's control step, at the first call
        self.calls = 0

    def __call__(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.steps is None:
            self.steps = handover_steps(self.after_s, model.params.substeps * model.params.dt)
        if self.calls <= self.steps:
            return self.first(model, *args, **kwargs)
        if self.second is None:
            self.second = self.make_second(model)
        return self.second(model, *args, **kwargs)


def handover_steps(seconds: float, control_dt: float) -> int:
    """Control steps of ``seconds`` (rounded; ``inf``: never hand over)."""
    if seconds < 0 or math.isnan(seconds):
        raise ValueError(f"handover times must be >= 0 s, got {seconds}")
    return 2**62 if math.isinf(seconds) else int(round(seconds / control_dt))


def replay_with_handover(policy: Any, motion: Any, options: TransferOptions, env_kwargs: dict[str, Any], *,
                         first: str, after_s: float) -> Rollout:
    """``bcg evaluate``'s replay of ``policy`` in ``first`` (``"mujoco"`` or ``"bcg"``) for ``after_s`` seconds of
    every episode, in the other simulator from then on."""
    if first not in ("mujoco", "bcg"):
        raise ValueError(f"first must be 'mujoco' or 'bcg', got {first!r}")
    kw = {**env_kwargs, **options.dynamics.chosen()}

    def make_second(model: Any) -> Callable[..., Any]:
        if first == "bcg":
            return MujocoTransition(options.num_episodes, model.params.substeps, model.params.dt)
        return make_env(motion, options.num_episodes, simulator="bcg", **kw).transition_fn

    return replay(policy, motion, options, simulator=first, env_kwargs=env_kwargs,
                  transition_wrapper=lambda fn: HandoverTransition(fn, make_second, after_s))


class RecordedActions:
    """A policy for :func:`replay` that records the raw actions [E, 29] of ``policy`` at every control step
    (``actions``) or, given ``play`` and ``lengths`` (the control steps each episode of the recorded replay lasted,
    [E]), returns the recorded actions of each episode for as long as it lasted there (open loop) and ``policy``'s
    own after. Played back in a handover replay, the two simulators' continuations from the handed-over state differ
    in their dynamics alone, not in how the policy answers them."""

    def __init__(self, policy: Any, play: list[torch.Tensor] | None = None, lengths: np.ndarray | None = None):
        if (play is None) != (lengths is None):
            raise ValueError("RecordedActions plays back recorded actions and their episodes' lengths together")
        self.policy, self.play = policy, play
        self.lengths = None if lengths is None else torch.as_tensor(np.asarray(lengths))
        self.actions: list[torch.Tensor] = []

    def bind(self, env: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        own = self.policy.bind(env) if hasattr(self.policy, "bind") else self.policy
        step = itertools.count()

        def act(obs: torch.Tensor) -> torch.Tensor:
            t = next(step)
            a = torch.as_tensor(own(obs))
            if self.play is None:
                self.actions.append(a.detach().clone())
            elif t < len(self.play):
                recorded = (t < self.lengths).to(a.device)  # the episode still ran at step t of the recording
                a = torch.where(recorded[:, None], self.play[t].to(a), a)
            return a
        return act


def summary(r: Rollout, phases: int, after_s: float) -> dict[str, Any]:
    """Falls in total and per start phase, and each episode's start and end [s of the clip]."""
    fell = np.asarray(r.fell, dtype=bool)
    phase = np.arange(len(fell)) % phases
    return {"after_s": after_s if math.isfinite(after_s) else None, "falls": int(fell.sum()), "episodes": len(fell),
            "falls_per_phase": [int(fell[phase == p].sum()) for p in range(phases)],
            "start_s": [float(f * r.control_dt) for f in r.start_frame],
            "end_s": [float((f + n) * r.control_dt) for f, n in zip(r.start_frame, r.length)],
            "fell": fell.tolist()}


def headings(qpos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Heading [T, 3] (rad) and height [T, 3] (m) of :data:`TRACE_BODIES` for robot positions qpos [T, nq]."""
    model = mujoco.MjModel.from_xml_path(str(g1.SCENE_PATH))
    data = mujoco.MjData(model)
    ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in TRACE_BODIES]
    yaw, z = np.zeros((len(qpos), len(ids))), np.zeros((len(qpos), len(ids)))
    for t, q in enumerate(qpos):
        data.qpos[:] = q
        mujoco.mj_kinematics(model, data)
        for k, b in enumerate(ids):
            R = data.xmat[b].reshape(3, 3)
            yaw[t, k], z[t, k] = math.atan2(R[1, 0], R[0, 0]), data.xpos[b, 2]
    return yaw, z


def touching(penetration: np.ndarray) -> str:
    """``"HT/HT"``-style summary of which foot spheres touch the ground, left foot first, from one step's
    penetrations [8] (:data:`bcg.robots.g1.FOOT_SPHERES` order: per foot heel +y, heel -y, toe +y, toe -y): ``H`` /
    ``h`` both / one heel sphere, ``T`` / ``t`` both / one toe sphere, ``-`` a foot off the ground."""
    def foot(p: np.ndarray) -> str:
        heel, toe = int((p[:2] > 0).sum()), int((p[2:] > 0).sum())
        return ("", "h", "H")[heel] + ("", "t", "T")[toe] or "-"
    return f"{foot(penetration[:4])}/{foot(penetration[4:])}"


def trace(alone: Rollout, handed: Rollout, reference_qpos: np.ndarray, episode: int, after_s: float,
          window_s: float = 1.6) -> list[str]:
    """Table rows every 0.1 s from ``after_s - 0.1`` to ``after_s + window_s`` of ``episode``, in both rollouts: the
    heading errors [deg] of the torso and the feet against the reference, the feet's heights [cm] (their ankle
    bodies' origins) and which of their spheres touch the ground (:func:`touching`)."""
    dt = alone.control_dt
    t0 = max(1, handover_steps(after_s, dt) - 5)
    steps = range(t0, t0 + int(round((window_s + 0.1) / dt)) + 1, 5)
    rows = ["| clip time [s] | " + " | ".join(
        f"{who}: torso / left foot / right foot heading error [deg], foot heights [cm], touching" for who in
        ("alone", "handed over")) + " |", "|---|---|---|"]
    cols = []
    for r in (alone, handed):
        last = int(r.length[episode])
        ts = [t for t in steps if t <= last]
        frames = r.frame[ts, episode]
        yaw, z = headings(r.qpos[ts, episode])
        ref_yaw, _ = headings(reference_qpos[frames])
        err = np.degrees(np.angle(np.exp(1j * (yaw - ref_yaw))))
        # qpos[t] is the state after control step t, whose penetrations are row t - 1
        cols.append({t: f"{err[i, 0]:+.0f} / {err[i, 1]:+.0f} / {err[i, 2]:+.0f}, {100 * z[i, 1]:.1f} / "
                        f"{100 * z[i, 2]:.1f}, {touching(r.penetration[t - 1, episode])}"
                     for i, t in enumerate(ts)})
    start = float(alone.start_frame[episode] * dt)
    for t in steps:
        if t not in cols[0] and t not in cols[1]:
            break
        rows.append(f"| {start + t * dt:.2f} | {cols[0].get(t, 'ended')} | {cols[1].get(t, 'ended')} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run directory, policy file, or `reference` (with --motion)")
    ap.add_argument("--motion", default=None, help="clip (default: the policy's own)")
    ap.add_argument("--first", choices=("mujoco", "bcg"), default="mujoco", help="the simulator before the handover")
    ap.add_argument("--after", type=float, nargs="+", default=[0.0, 2.0, 3.0, 4.0, math.inf],
                    help="handover times [s after each episode's start]; inf: never")
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--seconds", type=float, default=None, help="episode length cap [s] (default: to the clip's end)")
    ap.add_argument("--trace", type=int, default=None, help="episode whose headings to print around the first "
                                                            "finite --after time")
    ap.add_argument("--open-loop", action="store_true",
                    help="--trace: after the handover, play the actions the first simulator's own replay took, so "
                         "that the two continuations differ in their dynamics alone")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.open_loop and args.trace is None:
        ap.error("--open-loop changes the trace: give --trace EPISODE too")
    for h in args.after:
        try:
            handover_steps(h, 1.0)
        except ValueError as exc:
            ap.error(str(exc))
    policy, motion, env_kwargs, _, label = load_source(args.run, args.motion)
    options = TransferOptions(phases=args.phases, seeds=tuple(args.seeds), seconds=args.seconds)
    if args.trace is not None and not 0 <= args.trace < options.num_episodes:
        ap.error(f"--trace must name one of the {options.num_episodes} episodes (0 .. {options.num_episodes - 1})")
    second = "ours" if args.first == "mujoco" else "MuJoCo"
    first = "MuJoCo" if args.first == "mujoco" else "ours"
    print(f"{label}: {options.num_episodes} episodes, {first} for H s of each, then {second}")
    print("| H [s] | falls | falls per start phase | episode ends [s of the clip; F: fell] |")
    print("|---|---|---|---|")
    rows, rollouts = [], {}
    recorder = RecordedActions(policy)  # the first simulator alone records its actions (for --open-loop)
    for h in args.after:
        r = replay_with_handover(recorder if math.isinf(h) else policy, motion, options, env_kwargs,
                                 first=args.first, after_s=h)
        rollouts[h] = r
        row = summary(r, options.phases, h)
        rows.append(row)
        ends = " ".join(f"{e:.1f}{'F' if f else ''}" for e, f in zip(row["end_s"], row["fell"]))
        name = f"{h:g}" if math.isfinite(h) else f"never ({first} throughout)"
        print(f"| {name} | {row['falls']} of {row['episodes']} | {' '.join(map(str, row['falls_per_phase']))} | "
              f"{ends} |", flush=True)
    if args.trace is not None:
        finite = [h for h in args.after if math.isfinite(h) and h > 0]
        if not finite:
            ap.error("--trace needs a finite handover time > 0 in --after")
        alone = rollouts[math.inf] if math.inf in rollouts else replay_with_handover(
            recorder, motion, options, env_kwargs, first=args.first, after_s=math.inf)
        handed = rollouts[finite[0]]
        if args.open_loop:
            handed = replay_with_handover(RecordedActions(policy, play=recorder.actions, lengths=alone.length),
                                          motion, options, env_kwargs, first=args.first, after_s=finite[0])
        ref = make_env(motion, 1, simulator="bcg", **{**env_kwargs, **options.dynamics.chosen()})
        reference_qpos = ref.motion.qpos.double().cpu().numpy()
        ref.close()
        how = f" with {first}'s own actions (open loop)" if args.open_loop else ""
        print(f"\nepisode {args.trace}: {first} alone against handed over to {second} at {finite[0]:g} s{how}")
        print("\n".join(trace(alone, handed, reference_qpos, args.trace, finite[0])))
    if args.out is not None:
        args.out.write_text(json.dumps({"source": label, "first": args.first, "phases": options.phases,
                                        "seeds": list(options.seeds), "seconds": options.seconds, "rows": rows},
                                       indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
