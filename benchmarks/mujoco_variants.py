"""Which part of a simulator's model topples a policy: the same replay with one change to the model at a time.

A policy that stands in our simulator and falls in MuJoCo falls because of some difference between the two models.
This script replays it (the protocol of ``bcg evaluate``: start phases x seeds, each episode to a fall or
``--seconds``) once per *variant*, each changing one part of MuJoCo's model (or, with ``--simulator bcg``, of ours),
and prints the falls, in total and per start phase. A MuJoCo variant that removes the falls names a part of the model
the policy depends on; a variant of ours that brings them names one it was not made robust to.

MuJoCo variants (``--variants``; the default runs them all):

* ``mujoco``: MuJoCo as ``bcg evaluate`` runs it;
* ``stiff-contact``: contacts 4x stiffer (solref time constant 5 ms instead of 20 ms; ours is stiffer than MuJoCo's);
* ``torsional-friction``: torsional friction on every contact (condim 4, 0.02 m), which resists a foot turning on
  the ground;
* ``elliptic-cones``: elliptic friction cones instead of pyramids;
* ``noslip``: MuJoCo's no-slip solver after the main one (10 iterations), which removes the slow creep of a loaded
  contact that MuJoCo's soft friction otherwise lets slide (ours holds a contact inside its friction cone);
* ``friction-xF``: the sliding friction coefficient scaled by F (e.g. ``friction-x0.5``, ``friction-x2``);
* ``damping-xF``: the contacts' damping ratio (solref[1], 1) scaled by F: above 1 an overdamped contact that gives
  back less of a landing or a push-off;
* ``impedance-xF``: the contacts' impedance (solimp d_0 and d_width, 0.9 and 0.95) scaled by F (kept below 1): below
  1 each contact resolves a smaller share of the motion into it, a softer and less springy ground;
* ``ankle-torque-xF`` / ``torque-xF``: the ankles' / every actuator's torque limit scaled by F;
* ``no-joint-limits``: every joint limit removed;
* ``bcg-pd``: our PD law's damping kv + h kp (our default reads the position predicted at the end of the step).

Variants of our simulator (``--simulator bcg``): ``bcg`` (as ``bcg evaluate`` runs it), ``friction-xF`` (the ground
friction coefficient scaled by F), ``torque-xF`` (every torque limit scaled by F), ``mujoco-pd`` (MuJoCo's PD
law: the position at the start of the substep, ``pd_lookahead=False``), ``beta-xF`` (the contacts' Baumgarte factor
scaled by F, at most 1: below 1 a softer ground the feet sink deeper into), ``kappa-xF`` (the contact activation's
stiffness kappa scaled by F: above 1 a sharper contact, a sphere above the ground takes less part),
``soft-contact`` (MuJoCo's soft normal contact, time constant 0.02 s), ``no-joint-limits``. Variants join with ``+``
(``soft-contact+friction-x0.5``).

Usage::

    python benchmarks/mujoco_variants.py RUN [--motion CLIP] [--phases 16 --seconds 3 --seeds 0 1 2 3 4 5]
        [--simulator mujoco|bcg] [--variants ...] [--out variants.json]
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

DEFAULT_VARIANTS = {
    "mujoco": ("mujoco", "stiff-contact", "torsional-friction", "elliptic-cones", "noslip", "friction-x0.5",
               "friction-x2", "ankle-torque-x1.5", "ankle-torque-x3", "torque-x1.5", "no-joint-limits"),
    "bcg": ("bcg", "friction-x0.5", "friction-x2", "soft-contact", "soft-contact+friction-x0.5", "no-joint-limits"),
}
"""Each simulator's variants when ``--variants`` is not given."""


def _scale_torque(model: Any, factor: float, joint_filter: str = "") -> Any:
    for j in range(model.njnt):
        if joint_filter in (mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or ""):
            model.jnt_actfrcrange[j] *= factor
    for a in range(model.nu):
        joint = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[a, 0]) or ""
        if joint_filter in joint and model.actuator_forcelimited[a]:
            model.actuator_forcerange[a] *= factor
    return model


def _stiff_contact(m: Any) -> Any:
    m.geom_solref[:, 0] = 0.005
    return m


def _torsional_friction(m: Any) -> Any:
    m.geom_condim[:] = 4
    m.geom_friction[:, 1] = 0.02
    return m


def _noslip(m: Any) -> Any:
    m.opt.noslip_iterations = 10
    return m


def _elliptic_cones(m: Any) -> Any:
    m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    return m


def _no_joint_limits(m: Any) -> Any:
    m.jnt_limited[:] = 0
    return m


def _bcg_pd(m: Any) -> Any:
    """MuJoCo's position actuators with our PD law: ours reads the position predicted at the end of the step,
    kp (q* - q - h qd+) - kd qd+, i.e. a damping of kv + h kp instead of kv (the bias's velocity term)."""
    m.actuator_biasprm[:, 2] -= m.opt.timestep * m.actuator_gainprm[:, 0]
    return m


def _scale_damping(m: Any, factor: float) -> Any:
    m.geom_solref[:, 1] *= factor
    return m


def _scale_impedance(m: Any, factor: float) -> Any:
    m.geom_solimp[:, :2] = np.clip(m.geom_solimp[:, :2] * factor, 1e-4, 0.9999)
    return m


def _scale_friction(m: Any, factor: float) -> Any:
    m.geom_friction[:, 0] *= factor
    return m


_MUJOCO_FIXED: dict[str, Callable[[Any], Any]] = {
    "mujoco": lambda m: m, "stiff-contact": _stiff_contact, "torsional-friction": _torsional_friction,
    "elliptic-cones": _elliptic_cones, "noslip": _noslip, "no-joint-limits": _no_joint_limits, "bcg-pd": _bcg_pd}
_MUJOCO_SCALED: dict[str, Callable[[Any, float], Any]] = {
    "friction-x": _scale_friction, "damping-x": _scale_damping, "impedance-x": _scale_impedance,
    "ankle-torque-x": lambda m, f: _scale_torque(m, f, "ankle"),
    "torque-x": _scale_torque}
_BCG_FIXED: dict[str, Callable[[Any], Any]] = {
    "bcg": lambda model: model, "soft-contact": lambda model: model.with_params(soft_timeconst=0.02),
    "no-joint-limits": lambda model: model.without_joint_limits(),
    "mujoco-pd": lambda model: model.with_params(pd_lookahead=False)}
_BCG_SCALED: dict[str, Callable[[Any, float], Any]] = {
    "torque-x": lambda model, f: model.with_gains(torque_limit=np.asarray(model.torque_limit).reshape(-1) * f),
    "friction-x": lambda model, f: model.with_params(mu=model.params.mu * f),
    "beta-x": lambda model, f: model.with_params(beta=min(1.0, model.params.beta * f)),
    "kappa-x": lambda model, f: model.with_params(kappa=model.params.kappa * f)}


def _change(variant: str, fixed: dict[str, Callable[[Any], Any]],
            scaled: dict[str, Callable[[Any, float], Any]], what: str) -> Callable[[Any], Any]:
    """``change(model) -> model`` for ``variant``: a name of ``fixed``, a prefix of ``scaled`` followed by its factor,
    or several of them joined with ``+`` (applied in order)."""
    def single(name: str) -> Callable[[Any], Any]:
        if name in fixed:
            return fixed[name]
        for prefix, apply in scaled.items():
            if name.startswith(prefix):
                factor = _factor(name, prefix)
                return lambda model: apply(model, factor)
        raise ValueError(f"unknown variant {name!r}{what}; known: {', '.join(fixed)}, "
                         f"{', '.join(p + 'F' for p in scaled)} (joined with +)")

    changes = [single(name) for name in variant.split("+")]

    def joined(model: Any) -> Any:
        for change in changes:
            model = change(model)
        return model
    return joined


def _factor(variant: str, prefix: str) -> float:
    try:
        factor = float(variant[len(prefix):])
    except ValueError:
        factor = float("nan")
    if not factor > 0:
        raise ValueError(f"{variant!r}: the factor after {prefix!r} must be a number > 0")
    return factor


def bcg_change(variant: str) -> Callable[[Any], Any]:
    """``change(model) -> model``: the copy of a :class:`bcg.sim.SimModel` that ``variant`` of our simulator makes
    (``+`` joins variants); ValueError for an unknown name."""
    return _change(variant, _BCG_FIXED, _BCG_SCALED, " of our simulator")


def model_change(variant: str) -> Callable[[Any], Any]:
    """``change(m) -> m``: the change ``variant`` makes to a ``mujoco.MjModel`` (in place; ``+`` joins variants);
    ValueError for an unknown name."""
    return _change(variant, _MUJOCO_FIXED, _MUJOCO_SCALED, "")


def falls_with(policy: Any, motion: Any, options: TransferOptions, env_kwargs: dict[str, Any],
               variant: str, simulator: str = "mujoco") -> dict[str, Any]:
    """Replay in ``simulator`` changed by ``variant``: falls in total and per start phase, mean episode [s]."""
    if simulator == "mujoco":
        change = model_change(variant)

        def wrap(fn: Any) -> Any:
            if not isinstance(fn, MujocoTransition):
                raise TypeError("the replay's transition is not MuJoCo's")
            change(fn.loop.model)
            return fn
    else:
        change_bcg, changed = bcg_change(variant), {}

        def wrap(fn: Any) -> Any:
            def transition(model: Any, *args: Any, **kwargs: Any) -> Any:
                if id(model) not in changed:  # the env passes the same model every step: change it once
                    changed[id(model)] = change_bcg(model)
                return fn(changed[id(model)], *args, **kwargs)
            return transition

    r = replay(policy, motion, options, simulator=simulator, env_kwargs=env_kwargs, transition_wrapper=wrap)
    fell = np.asarray(r.fell, dtype=bool)
    phase = np.arange(len(fell)) % options.phases
    return {"simulator": simulator, "variant": variant, "falls": int(fell.sum()), "episodes": len(fell),
            "falls_per_phase": [int(fell[phase == p].sum()) for p in range(options.phases)],
            "start_s_per_phase": [float(f * r.control_dt) for f in r.start_frame[:options.phases]],
            "mean_episode_s": float(np.mean(r.length) * r.control_dt),
            "e_track_cm": float(np.mean([e["e_track_cm"] for e in r.episodes()]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run directory, policy file, or `reference` (with --motion)")
    ap.add_argument("--motion", default=None, help="clip (default: the policy's own)")
    ap.add_argument("--simulator", choices=("mujoco", "bcg"), default="mujoco", help="whose model the variants change")
    ap.add_argument("--variants", nargs="+", default=None, help="default: every variant of the simulator")
    ap.add_argument("--phases", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    names = args.variants or list(DEFAULT_VARIANTS[args.simulator])
    for v in names:
        try:  # refuse a bad name before any replay, in one line
            (model_change if args.simulator == "mujoco" else bcg_change)(v)
        except ValueError as exc:
            ap.error(str(exc))
    policy, motion, env_kwargs, _, label = load_source(args.run, args.motion)
    options = TransferOptions(phases=args.phases, seeds=tuple(args.seeds), seconds=args.seconds)
    rows = []
    sim = "MuJoCo" if args.simulator == "mujoco" else "bcg"
    print(f"{label}: {options.num_episodes} {sim} episodes of up to {args.seconds:g} s per variant")
    print(f"| {sim} variant | falls | mean episode [s] | E_track [cm] | falls per start phase |\n|---|---|---|---|---|")
    for v in names:
        row = falls_with(policy, motion, options, env_kwargs, v, args.simulator)
        rows.append(row)
        print(f"| {v} | {row['falls']} of {row['episodes']} | {row['mean_episode_s']:.2f} | {row['e_track_cm']:.1f} | "
              f"{' '.join(map(str, row['falls_per_phase']))} |", flush=True)
    if args.out is not None:
        replaced = args.out.exists()
        args.out.write_text(json.dumps({"policy": label, "simulator": args.simulator,
                                        "options": {"phases": args.phases, "seeds": args.seeds,
                                                    "seconds": args.seconds}, "rows": rows},
                                       indent=2) + "\n")
        print(f"wrote {args.out}" + (" (replacing the earlier file)" if replaced else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
