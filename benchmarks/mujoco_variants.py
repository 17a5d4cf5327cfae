"""Which part of MuJoCo's model topples a policy: the same replay with one change to MuJoCo's model at a time.

A policy that stands in our simulator and falls in MuJoCo falls because of some difference between the two models.
This script replays it in MuJoCo (the protocol of ``bcg evaluate``: start phases x seeds, each episode to a fall or
``--seconds``) once per *variant*, each changing one part of MuJoCo's model, and prints the falls, in total and per
start phase. A variant that removes the falls names a part of the model the policy depends on.

Variants (``--variants``; the default runs them all):

* ``mujoco``: MuJoCo as ``bcg evaluate`` runs it;
* ``stiff-contact``: contacts 4x stiffer (solref time constant 5 ms instead of 20 ms; ours is stiffer than MuJoCo's);
* ``torsional-friction``: torsional friction on every contact (condim 4, 0.02 m), which resists a foot turning on
  the ground;
* ``elliptic-cones``: elliptic friction cones instead of pyramids;
* ``friction-xF``: the sliding friction coefficient scaled by F (e.g. ``friction-x0.5``, ``friction-x2``);
* ``ankle-torque-xF`` / ``torque-xF``: the ankles' / every actuator's torque limit scaled by F;
* ``no-joint-limits``: every joint limit removed.

Usage::

    python benchmarks/mujoco_variants.py RUN [--motion CLIP] [--phases 16 --seconds 3 --seeds 0 1 2 3 4 5]
        [--variants ...] [--out variants.json]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np

from bcg.evaluation.evaluate_cli import load_source
from bcg.evaluation.mujoco_transfer import MujocoTransition, replay
from bcg.evaluation.transfer_protocol import TransferOptions

DEFAULT_VARIANTS = ("mujoco", "stiff-contact", "torsional-friction", "elliptic-cones", "friction-x0.5",
                    "friction-x2", "ankle-torque-x1.5", "ankle-torque-x3", "torque-x1.5", "no-joint-limits")


def _scale_torque(model: Any, factor: float, joint_filter: str = "") -> None:
    for j in range(model.njnt):
        if joint_filter in (mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or ""):
            model.jnt_actfrcrange[j] *= factor
    for a in range(model.nu):
        joint = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[a, 0]) or ""
        if joint_filter in joint and model.actuator_forcelimited[a]:
            model.actuator_forcerange[a] *= factor


def model_change(variant: str) -> Callable[[Any], None]:
    """The change ``variant`` makes to a ``mujoco.MjModel`` (in place); ValueError for an unknown name."""
    fixed: dict[str, Callable[[Any], None]] = {
        "mujoco": lambda m: None,
        "stiff-contact": lambda m: m.geom_solref.__setitem__((slice(None), 0), 0.005),
        "elliptic-cones": lambda m: setattr(m.opt, "cone", mujoco.mjtCone.mjCONE_ELLIPTIC),
        "no-joint-limits": lambda m: m.jnt_limited.__setitem__(slice(None), 0),
    }
    if variant in fixed:
        return fixed[variant]
    if variant == "torsional-friction":
        def torsional(m: Any) -> None:
            m.geom_condim[:] = 4
            m.geom_friction[:, 1] = 0.02
        return torsional
    for prefix, apply in (("friction-x", lambda m, f: m.geom_friction.__setitem__((slice(None), 0),
                                                                                   m.geom_friction[:, 0] * f)),
                          ("ankle-torque-x", lambda m, f: _scale_torque(m, f, "ankle")),
                          ("torque-x", lambda m, f: _scale_torque(m, f))):
        if variant.startswith(prefix):
            try:
                factor = float(variant[len(prefix):])
            except ValueError:
                factor = float("nan")
            if not factor > 0:
                raise ValueError(f"{variant!r}: the factor after {prefix!r} must be a number > 0")
            return lambda m, f=factor, apply=apply: apply(m, f)
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(DEFAULT_VARIANTS)}, friction-xF, "
                     "ankle-torque-xF, torque-xF")


def falls_with(policy: Any, motion: Any, options: TransferOptions, env_kwargs: dict[str, Any],
               variant: str) -> dict[str, Any]:
    """Replay in MuJoCo changed by ``variant``: falls in total and per start phase, mean episode [s]."""
    change = model_change(variant)

    def wrap(fn: Any) -> Any:
        if not isinstance(fn, MujocoTransition):
            raise TypeError("the replay's transition is not MuJoCo's")
        change(fn.loop.model)
        return fn

    r = replay(policy, motion, options, simulator="mujoco", env_kwargs=env_kwargs, transition_wrapper=wrap)
    fell = np.asarray(r.fell, dtype=bool)
    phase = np.arange(len(fell)) % options.phases
    return {"variant": variant, "falls": int(fell.sum()), "episodes": len(fell),
            "falls_per_phase": [int(fell[phase == p].sum()) for p in range(options.phases)],
            "start_s_per_phase": [float(f * r.control_dt) for f in r.start_frame[:options.phases]],
            "mean_episode_s": float(np.mean(r.length) * r.control_dt)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run directory, policy file, or `reference` (with --motion)")
    ap.add_argument("--motion", default=None, help="clip (default: the policy's own)")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    ap.add_argument("--phases", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    for v in args.variants:
        model_change(v)  # refuse a bad name before any replay
    policy, motion, env_kwargs, _, label = load_source(args.run, args.motion)
    options = TransferOptions(phases=args.phases, seeds=tuple(args.seeds), seconds=args.seconds)
    rows = []
    print(f"{label}: {options.num_episodes} MuJoCo episodes of up to {args.seconds:g} s per variant")
    print("| MuJoCo variant | falls | mean episode [s] | falls per start phase |\n|---|---|---|---|")
    for v in args.variants:
        row = falls_with(policy, motion, options, env_kwargs, v)
        rows.append(row)
        print(f"| {v} | {row['falls']} of {row['episodes']} | {row['mean_episode_s']:.2f} | "
              f"{' '.join(map(str, row['falls_per_phase']))} |", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"policy": label, "options": {"phases": args.phases, "seeds": args.seeds,
                                                                      "seconds": args.seconds}, "rows": rows},
                                       indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
