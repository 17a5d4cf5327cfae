"""Does the family of simulators `bcg train` randomises over cover MuJoCo's push-off?

Runs the push-off scenario (:data:`bcg.evaluation.contact_scenarios.PUSH`: a crouch, then straight legs with pointed
ankles at once) in MuJoCo and in our simulator at every corner of the ranges that ``--contact-randomization`` and
``--torque-limit-randomization`` draw from (the contacts' Baumgarte factor, a hard ground or a soft one at the
range's two time constants, every torque limit scaled by the range's ends and 1), once with each PD law
(``pd_lookahead`` True, the default, and False, MuJoCo's), and prints the centre of mass's take-off speed of each.
Those corners hold every other parameter at the model's value; ``bcg train`` also randomises the PD gains (kp and kd
by one factor each), the masses, centres of mass, armature and joint damping, so the script then draws ``--members``
simulators from the whole default family (``TrainConfig().env_config().domain_randomization``, the draw the training
environments make at each reset) and prints the distribution of their take-off speeds and the share faster than
MuJoCo: how often a policy trained on that family meets a push-off as strong as MuJoCo's. ``--torque-limit-range LO
HI`` draws the family of ``bcg train --torque-limit-range LO HI`` instead.

Usage::

    python benchmarks/push_off_randomization.py [--members 128] [--seed 0] [--torque-limit-range LO HI]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np
import torch

from bcg.agents.train_config import CONTACT_RANDOMIZATION, TORQUE_LIMIT_RANDOMIZATION, TrainConfig
from bcg.envs.randomization import sample_physics
from bcg.evaluation.contact_scenarios import DT, PUSH, metrics, run_bcg, run_bcg_batch, run_mujoco
from bcg.sim import default_physics, load_model


def family() -> list[tuple[str, float, dict[str, float]]]:
    """(ground label, torque scale, load_model parameters) at every corner of the training ranges."""
    betas = CONTACT_RANDOMIZATION["contact_beta"]
    softs = (0.0, *CONTACT_RANDOMIZATION["contact_soft_timeconst"])
    lo, hi = TORQUE_LIMIT_RANDOMIZATION["torque_limit_scale"]
    out = []
    for soft, beta in itertools.product(softs, betas):
        label = f"beta {beta:g}, " + (f"soft {soft:g} s" if soft else "hard")
        for scale in (lo, 1.0, hi):
            out.append((label, scale, {"beta": beta, "soft_timeconst": soft}))
    return out


def drawn_speeds(members: int, seed: int, pd_lookahead: bool, torque_limit_range: tuple[float, float] | None = None
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Take-off speeds [m/s] of ``members`` simulators drawn from ``bcg train``'s randomisation (its defaults, or
    with ``--torque-limit-range``; one generator seeded ``seed``, so both laws meet the same draws), and the drawn
    factors (``kp``, ``kd``, ``torque_limit``: [members], each the mean factor on the model's values)."""
    dr = TrainConfig(torque_limit_range=torque_limit_range).env_config().domain_randomization
    model = load_model(substeps=1, dt=DT, pd_lookahead=pd_lookahead)
    base = default_physics(model, members)
    physics = sample_physics(base, dr, torch.Generator().manual_seed(seed), model.params)
    speeds = np.array([metrics(tr)["takeoff_speed"] for tr in run_bcg_batch(PUSH, model, physics)])
    factors = {name: (getattr(physics, name) / getattr(base, name)).mean(1).numpy()
               for name in ("kp", "kd", "torque_limit")}
    return speeds, factors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=128, help="simulators drawn from the default family")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw")
    parser.add_argument("--torque-limit-range", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                        help="the torque-limit range of the drawn family (default: bcg train's)")
    args = parser.parse_args(argv)
    if args.members < 1:
        parser.error(f"--members must be >= 1, got {args.members}")
    limits = None if args.torque_limit_range is None else tuple(args.torque_limit_range)
    try:
        TrainConfig(torque_limit_range=limits)
    except ValueError as err:
        parser.error(str(err))
    mujoco_speed = metrics(run_mujoco(PUSH))["takeoff_speed"]
    print(f"MuJoCo: the centre of mass takes off at {mujoco_speed:.3f} m/s\n")
    members = family()
    scales = sorted({scale for _, scale, _ in members})
    grounds = list(dict.fromkeys(label for label, _, _ in members))
    for lookahead in (True, False):
        law = "ours (pd_lookahead True, the default)" if lookahead else "MuJoCo's (pd_lookahead False)"
        speeds = {(label, scale): metrics(run_bcg(PUSH, torque_scale=scale, pd_lookahead=lookahead,
                                                  **params))["takeoff_speed"] for label, scale, params in members}
        print(f"PD law {law}: take-off speed [m/s]\n| ground | " + " | ".join(f"torque x{s:g}" for s in scales)
              + " |\n|---|" + "---|" * len(scales))
        for ground in grounds:
            print(f"| {ground} | " + " | ".join(f"{speeds[ground, s]:.3f}" for s in scales) + " |")
        low, high = min(speeds.values()), max(speeds.values())
        where = "inside" if low <= mujoco_speed <= high else ("above" if mujoco_speed > high else "below")
        print(f"range {low:.3f}-{high:.3f} m/s: MuJoCo's {mujoco_speed:.3f} is {where} it")
        drawn, factors = drawn_speeds(args.members, args.seed, lookahead, limits)
        p5, p50, p95 = np.percentile(drawn, (5, 50, 95))
        fast = drawn >= mujoco_speed
        family_name = "default family" if limits is None else f"family with torque limits x{limits[0]:g}-{limits[1]:g}"
        print(f"{args.members} members drawn from the whole {family_name} (seed {args.seed}): median {p50:.3f}, "
              f"5-95 % {p5:.3f}-{p95:.3f}, max {drawn.max():.3f} m/s; {fast.mean():.0%} at or above MuJoCo's")
        if fast.any():
            print("  those members' mean factors: " + ", ".join(
                f"{name} x{factors[name][fast].mean():.2f} (all: x{factors[name].mean():.2f})" for name in factors))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
