"""Does the family of simulators `bcg train` randomises over cover MuJoCo's push-off?

Runs the push-off scenario (:data:`bcg.evaluation.contact_scenarios.PUSH`: a crouch, then straight legs with pointed
ankles at once) in MuJoCo and in our simulator at every corner of the ranges that ``--contact-randomization`` and
``--torque-limit-randomization`` draw from (the contacts' Baumgarte factor, a hard ground or a soft one at the
range's two time constants, every torque limit scaled by the range's ends and 1), once with each PD law
(``pd_lookahead`` True, the default, and False, MuJoCo's), and prints the centre of mass's take-off speed of each:
a policy trained on that family has never seen a push-off stronger than its largest member's.

Usage::

    python benchmarks/push_off_randomization.py
"""

from __future__ import annotations

import argparse
import itertools
import sys

from bcg.agents.train_config import CONTACT_RANDOMIZATION, TORQUE_LIMIT_RANDOMIZATION
from bcg.evaluation.contact_scenarios import PUSH, metrics, run_bcg, run_mujoco


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


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
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
        print(f"range {low:.3f}-{high:.3f} m/s: MuJoCo's {mujoco_speed:.3f} is {where} it\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
