"""The whole-clip transfer table of docs/shac.md (*Policies in MuJoCo*), regenerated from the kept runs.

``benchmarks/results/stay_up/RUN/`` holds, for every training run the table quotes, its ``config.json``, its
``metrics.csv`` and ``eval_CLIP.json``: the ``metrics.json`` of ``bcg evaluate RUN`` (the default protocol, 8
episodes through the whole clip, in MuJoCo and in our simulator). The checkpoints and policies are left out for size.

    python benchmarks/transfer_tables.py [--dir benchmarks/results/stay_up]    # print every table
    python benchmarks/transfer_tables.py --write docs/shac.md README.md          # replace them in the docs

``--write`` replaces the text between ``<!-- transfer_tables:NAME -->`` and ``<!-- /transfer_tables:NAME -->`` in
each file by table NAME (the keys of ``tables()``: runs, ablation, methods, methods_jump, methods_run_3600,
methods_fight_3600, methods_dance_3600, defaults, jump, spinkarate, window_size, bundle_size, randomization,
default_change, mujoco_step, dropout); a file without a marker is left as it is. ``mujoco_step`` and ``dropout`` read
further replays kept beside their runs (``MUJOCO_STEP_REPLAYS``, ``DROPOUT_REPLAYS``).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path
from typing import Any

LEVERS: tuple[str, ...] = ("domain_randomization", "adaptive_start", "adaptive_start_credit",
                           "termination_anchor_height", "termination_gravity_z", "termination_end_effector_height",
                           "replay_threshold",
                           "action_scale_torque", "kappa", "soft_contact_timeconst", "contact_beta",
                           "contact_randomization", "torque_limit_randomization", "torque_limit_range",
                           "friction_range", "reference_joint_margin", "pd_lookahead", "contact_dropout_range",
                           "contact_dropout")
"""TrainConfig fields (or fields of its dynamics or episode layers) a run of this table may set apart from `bcg train`'s
defaults."""


def _option(cfg: Any, key: str) -> Any:
    """TrainConfig's ``key``, or its dynamics' or episode layers' (where --kappa, --adaptive-start, ... land)."""
    from bcg.envs.config import FLAT_GROUPS

    for group in (cfg, *(getattr(cfg, name) for name in FLAT_GROUPS)):
        if hasattr(group, key):
            return getattr(group, key)
    raise AttributeError(f"TrainConfig has no option {key!r}")


def estimator_spec(est: Any) -> str:
    """The estimator as `bcg train --estimator` takes it: its name, and ``:key=value,...`` for the fields that differ
    from the estimator's defaults (e.g. ``bcg:size=sensitivity,min_branches=2``)."""
    defaults = type(est)().params()
    changed = [f"{k}={v}" for k, v in est.params().items() if v != defaults[k]]
    return est.name + (":" + ",".join(changed) if changed else "")


def settings(cfg_dict: dict[str, Any]) -> str:
    """The options that set a run apart from today's `bcg train` defaults, in its flag names (a run written before a
    default changed reads back as it ran: bcg.agents.train.LEGACY_DEFAULTS)."""
    from bcg.agents.train_config import config_from_dict, default_config

    cfg = config_from_dict(cfg_dict)
    default = default_config(cfg.agent, cfg.preset)
    parts = ["--agent ppo"] if cfg.agent == "ppo" else [f"--estimator {estimator_spec(cfg.estimator)}"]
    changed = [key for key in LEVERS if _option(cfg, key) != _option(default, key)]
    terminations = [key for key in changed if key.startswith("termination_") and _option(cfg, key) is None]
    for key in changed:
        value, flag = _option(cfg, key), "--" + key.replace("_", "-")
        if key in terminations and len(terminations) == 3:
            if key == terminations[0]:
                parts.append("--termination-{anchor-height,gravity-z,end-effector-height} None")
        elif isinstance(value, bool) and _option(default, key) is not None:  # a flag pair; `bool | None` takes a value
            parts.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, (tuple, list)):
            parts.append(f"{flag} {' '.join(str(v) for v in value)}")
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def schedule(cfg_dict: dict[str, Any]) -> str:
    """How the run's learning rate moved: SHAC's linear decay over the time budget or over N iterations; PPO's
    adaptive-KL rule."""
    from bcg.agents.train_config import config_from_dict

    cfg = config_from_dict(cfg_dict)
    if cfg.agent == "ppo":
        return "adaptive KL"
    return "over the budget" if cfg.schedule_follows_time() else f"{cfg.shac.max_iterations} it"


def last_row(run: Path) -> dict[str, str]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))[-1]


def table(root: Path) -> str:
    lines = ["| run | clip | settings | lr schedule | iterations | samples | training [s] | MuJoCo: falls of 8, mean "
             "episode [s], E_track [cm] | ours: falls, mean episode, E_track |", "|---" * 9 + "|"]
    for run in sorted(p for p in root.iterdir() if any(p.glob("eval_*.json"))):
        cfg = json.loads((run / "config.json").read_text())
        evals = sorted(run.glob("eval_*.json"))
        ev = json.loads(evals[0].read_text())
        clip = evals[0].stem.removeprefix("eval_")
        last = last_row(run)
        cols = []
        for sim in ("mujoco", "bcg"):
            m = ev[sim]
            cols.append(f"{m['falls']}, {m['mean_episode_seconds']:.1f}, {m['e_track_cm']:.1f}")
        lines.append(f"| {run.name} | {clip} | {settings(cfg)} | {schedule(cfg)} | {last['iteration']} | "
                     f"{int(float(last['samples']))} | {float(last['wall_time_s']):.0f} | {cols[0]} | {cols[1]} |")
    return "\n".join(lines)


RUN_EARLIER_1200 = ("ts-bcg-run-s0", "ts-bcg-run-s1", "ts-bcg-run-s2")
"""The run clip with the earlier default (failures credited where their episode ended, neither randomisation) for
1200 s, seeds 0-2: the ablation's all-on row (seeds 0 and 1) and SHAC+BCG in the run's method table."""
JUMP_EARLIER_3600 = ("def60-bcg-jump-s0", "def60-bcg-jump-s1", "def60-bcg-jump-s2")
"""The jump with the earlier default for 3600 s, seeds 0-2 (seed 2 is the fixed-bundle side of the bundle-size pair)."""
JUMP_SIZED_3600 = ("def60-bcgsized-jump-s2",)
"""The jump with bundles sized from the force, the earlier default otherwise, 3600 s, seed 2."""

ABLATION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("`bcg train` default of the time (all layers, schedule over the budget)", RUN_EARLIER_1200[:2]),
    ("schedule over 500 iterations (the rest on)", ("drlay-bcg-run-s0", "drlay-bcg-run-s1")),
    ("no domain randomisation", ("ts-nodr-bcg-run-s0",)),
    ("no adaptive start states", ("ts-noadapt-bcg-run-s0",)),
    ("no deviation terminations", ("ts-noterm-bcg-run-s0",)),
)
"""The ablation on the run clip (SHAC+BCG, 1200 s): each lever off, the rest on (the default of the time: failures
credited where their episode ended, neither the ground nor the torque limits randomised)."""

METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SHAC+BCG", RUN_EARLIER_1200),
    ("SHAC (bptt)", ("ts-bptt-run-s0", "ts-bptt-run-s1", "ts-bptt-run-s2")),
    ("PPO", ("ts-ppo-run-s0", "ts-ppo-run-s1", "ts-ppo-run-s2")),
)
"""The three methods on the run clip at the same settings and budget (1200 s)."""

METHODS_JUMP: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SHAC+BCG", JUMP_EARLIER_3600),
    ("SHAC (bptt)", ("def60-bptt-jump-s0", "def60-bptt-jump-s1", "def60-bptt-jump-s2")),
    ("PPO", ("def60-ppo-jump-s0", "def60-ppo-jump-s1", "def60-ppo-jump-s2")),
    ("SHAC+BCG, bundles sized from the force (`bcg:size=sensitivity,min_branches=2`)", JUMP_SIZED_3600),
)
"""The three methods on the jump clip with `bcg train`'s default settings and 3600 s each (and one estimator
variant, seed 2 as the third seeds)."""


PPO_RUN_3600 = ("def60-ppo-run-s0", "def60-ppo-run-s1")
"""PPO on the run clip with `bcg train --agent ppo`'s defaults for 3600 s on the slower machine, one run at a time,
seed 0; seed 1 with seed 0's 3251 iterations (--iterations 3251: 4.99 M samples; PPO's adaptive learning rate has no
schedule over the budget), which took 2769 s of training on its session's machine beside a niced curve replay."""
BPTT_RUN_3600 = ("def60-bptt-run-s0", "def60-bptt-run-s1")
"""SHAC (bptt) on the run clip with `bcg train --estimator bptt`'s defaults for 3600 s, one run at a time, seeds 0 and
1 (their sessions' machines took 70.4 and 63.9 s for the first 150 iterations of the SHAC+BCG default on the run,
against 63.4 and 68.8 s in RUN_DEFAULT_3600's runs)."""


RUN_PREVIOUS_1200 = ("def20-bcg-run-s0", "def20-bcg-run-s1")
"""The run clip with the previous default (`--adaptive-start-credit start`, no ground or torque-limit randomisation)
for 1200 s, seeds 0 and 1: the baseline of several tables."""
FIGHT_PREVIOUS_1200 = ("def20-bcg-fight-new-s0", "def20-bcg-fight-fix-s1", "def20-bcg-fight-s2")
"""The fight with the previous default for 1200 s, seeds 0-2 (1 and 2 after the bundle-gradient correction)."""
DANCE_PREVIOUS_1200 = ("def20-bcg-dance-new-s0", "def20-bcg-dance-fix-s1", "def20-bcg-dance-s2")
"""The dance with the previous default for 1200 s, seeds 0-2 (1 and 2 after the bundle-gradient correction)."""


JUMP_PREVIOUS_3600 = ("def60-bcg-jump-credit-s0", "def60-bcg-jump-credit-s1")
"""The jump with the previous default for 3600 s, seeds 0 and 1."""
JAZZWALK_PREVIOUS_3600 = ("def60-bcg-jazzwalk-credit-s0", "def60-bcg-jazzwalk-credit-s1")
"""JazzWalk with the previous default for 3600 s, seeds 0 and 1."""
SPINKARATE_PREVIOUS_3600_UNCORRECTED = ("def60-bcg-spinkarate-credit-s0", "def60-bcg-spinkarate-credit-s1")
"""SpinKarate with the previous default for 3600 s before the bundle-gradient correction, seeds 0 and 1."""
SPINKARATE_PREVIOUS_3600 = ("hd60-bcg-spinkarate-s0",)
"""SpinKarate with the previous default for 3600 s after the bundle-gradient correction, seed 0."""

SPINKARATE_DEFAULT_3600 = ("hd60-bcg-spinkarate-endcrtlr-s0", "hd60-bcg-spinkarate-endcrtlr-s1")
"""SpinKarate with today's default for 3600 s, seeds 0 and 1 (trained with its three flags before they were the
default, on the machine that runs 1.7x the iterations per hour)."""
SPINKARATE_DEFAULT_3600_SLOWER = ("endcrtlr60-bcg-spinkarate-s0", "endcrtlr60-bcg-spinkarate-s1")
"""SpinKarate with today's default for 3600 s on the slower machine, two runs at a time (each with about one core;
trained after the default changed), seeds 0 and 1."""
SPINKARATE_DEFAULT_3600_ALONE = ("solo60-bcg-spinkarate-s0", "solo60-bcg-spinkarate-s1")
"""SpinKarate with today's default for 3600 s on the slower machine, one run at a time (the critic fit's worker
process on the second core, as a user runs `bcg train`), seeds 0 and 1."""
SPINKARATE_MUJOCO_PD_3600 = ("nolook60-bcg-spinkarate-s0", "nolook60-bcg-spinkarate-s1")
"""SpinKarate with today's default and MuJoCo's PD law (--pd-lookahead False) for 3600 s on the slower machine, one
run at a time, seeds 0 and 1 (seed 1 shared the cores with tests for a few minutes: 9253 iterations against
10 279)."""
SPINKARATE_TORQUE_RANGE_10400 = ("tlr14-bcg-spinkarate-s0",)
"""SpinKarate with today's default and --torque-limit-range 1.0 1.4 for 10 400 iterations (--iterations 10400
--shac.max-iterations 10400: the one-run-at-a-time default runs' mean at 3600 s, the learning rate decaying over them;
the machine of that session took about 1.2x their time per iteration and the run shared its cores with evaluations
for part of its time, so the budget is counted in iterations), seed 0."""
SPINKARATE_MUJOCO_PD_TORQUE_RANGE_3600 = ("nltlr60-bcg-spinkarate-s0", "nltlr60-bcg-spinkarate-s1")
"""SpinKarate with today's default, MuJoCo's PD law and --torque-limit-range 1.0 1.4 for 3600 s, one run at a time,
seeds 0 and 1, on a machine slower again than the one-at-a-time default runs' (150 iterations of the run's default
alone took 77.5 s; 9399 / 10 063 iterations in the hour against their 10 673 / 10 147)."""
SPINKARATE_DROPOUT_3600 = ("drop63-bcg-spinkarate-s0", "drop63-bcg-spinkarate-s1")
"""SpinKarate with today's default and --contact-dropout-range 0 1 for 3600 s, two runs at a time, seeds 0 and 1 (150
iterations of the run's default alone took 70.9 s on this machine)."""
SPINKARATE_NO_TORQUE_LIMIT_3600 = ("notl63-bcg-spinkarate-s0", "notl63-bcg-spinkarate-s1")
"""SpinKarate with today's default less the torque-limit randomisation (--no-torque-limit-randomization: contact
randomisation and failures credited where they happen) for 3600 s, two runs at a time, seeds 0 and 1, on the machine
of SPINKARATE_DROPOUT_3600 (the ablation's row for that lever)."""
SPINKARATE_DEFAULT_3600_SLOWEST = ("solo62-bcg-spinkarate-s0", "solo62-bcg-spinkarate-s1")
"""SpinKarate with today's default (`bcg train --motion B_SpinKarate.csv --estimator bcg --max-time-s 3600 --seed S`)
for 3600 s, one run at a time, seeds 0 and 1, on the machine of SPINKARATE_MUJOCO_PD_TORQUE_RANGE_3600 (150 iterations
of the run's default alone: 77.5 s; 10 332 / 9215 iterations in the hour; seed 1 shared the cores with a niced
clean-clone test run for about 20 minutes), trained to be replayed at MuJoCo's finer steps as well
(MUJOCO_STEP_RUNS)."""
JUMP_DEFAULT_3600 = ("endcrtlr60-bcg-jump-s0", "endcrtlr60-bcg-jump-s1")
"""The jump with today's default for 3600 s, seeds 0 and 1."""
JAZZWALK_DEFAULT_3600 = ("endcrtlr60-bcg-jazzwalk-s0", "endcrtlr60-bcg-jazzwalk-s1")
"""JazzWalk with today's default for 3600 s, seeds 0 and 1."""
HANDSUP_PREVIOUS_3600 = ("def60-bcg-handsup-s0", "def60-bcg-handsup-s1")
"""HandsUp with the previous default for 3600 s, seeds 0 and 1."""
HANDSUP_DEFAULT_1200 = ("d20-bcg-handsup-s0", "d20-bcg-handsup-s1")
"""HandsUp (a real clip never used while tuning) with today's default for 1200 s on the slower machine, one run at a
time, seeds 0 and 1."""
SHORTMOVE14_PREVIOUS_3600 = ("def60-bcg-shortmove14-s0", "def60-bcg-shortmove14-s1")
"""ShortMove14 (a real clip never used while tuning) with the previous default for 3600 s, seeds 0 and 1."""
SHORTMOVE14_DEFAULT_3600 = ("endcrtlr60-bcg-shortmove14-s0", "endcrtlr60-bcg-shortmove14-s1")
"""ShortMove14 with today's default for 3600 s, seeds 0 and 1 (on the slower machine, with fewer iterations than the
previous default's runs)."""
RUN_DEFAULT_700 = ("endcrtlr12-bcg-run-s0", "endcrtlr12-bcg-run-s1")
"""The run clip with today's default for 700 s on the faster machine, seeds 0 and 1."""
RUN_DEFAULT_1200 = ("d20-bcg-run-s0", "d20-bcg-run-s1")
"""The run clip with today's default for 1200 s on the slower machine, one run at a time, seeds 0 and 1."""
RUN_DEFAULT_3600 = ("d60-bcg-run-s0", "d60-bcg-run-s1")
"""The run clip with today's default for 3600 s on the slower machine, one run at a time, seeds 0 (the seed whose
earlier-default hour drifted off the reference's path) and 1."""
METHODS_RUN_3600: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SHAC+BCG (today's default)", RUN_DEFAULT_3600),
    ("SHAC (bptt)", BPTT_RUN_3600),
    ("PPO", PPO_RUN_3600),
)
"""SHAC+BCG, SHAC (bptt) and PPO on the run clip at 3600 s each, one run at a time on the slower machine."""

FIGHT_DEFAULT_1200 = ("endcrtlr20-bcg-fight-s0", "endcrtlr20-bcg-fight-s1")
"""The fight with today's default for 1200 s on the faster machine, seeds 0 and 1."""
FIGHT_DEFAULT_3600 = ("d60-bcg-fight-s0", "d60-bcg-fight-s1")
"""The fight with today's default for 3600 s, one run at a time: seed 0 on the slower machine (its session's machine
took 63.9 s for the first 150 iterations of the run's default; the first 15 minutes beside a niced curve replay), seed
1 on a machine 1.43x faster (44.8 s for the same 150 iterations; 14 434 iterations in the hour against seed 0's
9977)."""
BPTT_FIGHT_3600 = ("def60-bptt-fight-s0", "def60-bptt-fight-s1")
"""SHAC (bptt) on the fight with `bcg train --estimator bptt`'s defaults for 3600 s, one run at a time: seed 0 on a
machine that took 54.8 s for the first 150 iterations of the SHAC+BCG default on the run (63.9 s for
FIGHT_DEFAULT_3600's seed 0); seed 1 resumed once (`bcg train --resume RUN`): its first 1011 s of training on the 44.8-s
machine (a nice-19 test run beside it for 10 of them), the rest from the checkpoint at iteration 4750 on a 48.3-s
machine (12 903 iterations in all)."""
PPO_FIGHT_3600 = ("def60-ppo-fight-s0", "def60-ppo-fight-s1")
"""PPO on the fight with `bcg train --agent ppo`'s defaults for 3600 s, one run at a time: seed 0 on the machine of
BPTT_FIGHT_3600 (a nice-19 test run beside it for 7 of its 60 minutes; 5054 iterations), seed 1 on the machine of
SHAC+BCG's seed 1 (44.8 s for the first 150 iterations of the run's default; 5953 iterations)."""
METHODS_FIGHT_3600: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SHAC+BCG (today's default)", FIGHT_DEFAULT_3600),
    ("SHAC (bptt)", BPTT_FIGHT_3600),
    ("PPO", PPO_FIGHT_3600),
)
"""SHAC+BCG, SHAC (bptt) and PPO on the fight at 3600 s each, one run at a time (the methods run so far)."""
DANCE_DEFAULT_3600 = ("d60-bcg-dance-s0", "d60-bcg-dance-s1")
"""The dance with today's default for 3600 s, one run at a time: seed 0 on a machine that took 48.3 s for the first
150 iterations of the run's default (11 657 iterations), seed 1 on one that took 51.9 s (12 998 iterations)."""
BPTT_DANCE_3600 = ("def60-bptt-dance-s0", "def60-bptt-dance-s1")
"""SHAC (bptt) on the dance with `bcg train --estimator bptt`'s defaults for 3600 s, one run at a time: seed 0 resumed
once (`bcg train --resume RUN`), its first 2039 s of training on the 48.3-s machine of DANCE_DEFAULT_3600's seed 0 (two
nice-19 test runs beside it for about 25 of its first 30 minutes), the rest from the checkpoint at iteration 7550 on a
machine that took 51.9 s for the same 150 iterations (12 902 iterations in all); seed 1 on a machine that took 66.9 s
for them (a few short niced test and regeneration runs beside it; 12 278 iterations)."""
PPO_DANCE_3600 = ("def60-ppo-dance-s0", "def60-ppo-dance-s1")
"""PPO on the dance with `bcg train --agent ppo`'s defaults for 3600 s, one run at a time: seed 0 on the 51.9-s machine
of DANCE_DEFAULT_3600's seed 1 (a nice-19 test run beside it for about 5 of its first 11 minutes; 4475 iterations),
seed 1 on the 66.9-s machine of BPTT_DANCE_3600's seed 1 (3883 iterations)."""
METHODS_DANCE_3600: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SHAC+BCG (today's default)", DANCE_DEFAULT_3600),
    ("SHAC (bptt)", BPTT_DANCE_3600),
    ("PPO", PPO_DANCE_3600),
)
"""SHAC+BCG, SHAC (bptt) and PPO on the dance at 3600 s each, one run at a time, two seeds each."""
METHODS_3600: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "run": METHODS_RUN_3600, "fight": METHODS_FIGHT_3600, "dance": METHODS_DANCE_3600}
"""The methods at 3600 s per clip: the runs of `bcg study methods` at the issue's budget."""
METHODS_3600_BY_CLIP: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (f"{clip}, {method}", runs) for clip, methods in METHODS_3600.items() for method, runs in methods)
"""METHODS_3600 as one table, a row per clip and method (the README's)."""
FIGHT_DEFAULT_700 = ("endcrtlr12-bcg-fight-s0", "endcrtlr12-bcg-fight-s1")
"""The fight with today's default for 700 s on the faster machine (the previous default's iterations at 1200 s)."""
DANCE_DEFAULT_1200 = ("endcrtlr20-bcg-dance-s0", "endcrtlr20-bcg-dance-s1")
"""The dance with today's default for 1200 s on the faster machine, seeds 0 and 1."""

DEFAULTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run (1200 s, one run at a time)", RUN_DEFAULT_1200),
    ("run (3600 s, one run at a time)", RUN_DEFAULT_3600),
    ("run (700 s on the faster machine)", RUN_DEFAULT_700),
    ("run (1200 s), previous default", ("def20-bcg-run-credit-s0", "def20-bcg-run-credit-s1")),
    ("run (1200 s), previous default, retrained with the code of its time", RUN_PREVIOUS_1200),
    ("run (1200 s), earlier default", RUN_EARLIER_1200),
    ("run (3600 s), earlier default", ("def60-bcg-run-s0", "def60-bcg-run-s1")),
    ("jump (3600 s)", JUMP_DEFAULT_3600),
    ("jump (3600 s), previous default", JUMP_PREVIOUS_3600),
    ("jump (3600 s), earlier default", JUMP_EARLIER_3600),
    ("fight (3600 s, one run at a time)", FIGHT_DEFAULT_3600),
    ("fight (1200 s)", FIGHT_DEFAULT_1200),
    ("fight (700 s)", FIGHT_DEFAULT_700),
    ("fight (1200 s), previous default", FIGHT_PREVIOUS_1200),
    ("fight (1200 s), earlier default", ("def-bcg-fight-s0", "def-bcg-fight-s1")),
    ("dance (3600 s, one run at a time)", DANCE_DEFAULT_3600),
    ("dance (1200 s)", DANCE_DEFAULT_1200),
    ("dance (1200 s), previous default", DANCE_PREVIOUS_1200),
    ("dance (1200 s), earlier default", ("def-bcg-dance-s0", "def-bcg-dance-s1")),
    ("J_ShortDance16_JazzWalk, G1 Moves (3600 s)", JAZZWALK_DEFAULT_3600),
    ("J_ShortDance16_JazzWalk, G1 Moves (3600 s), previous default",
     JAZZWALK_PREVIOUS_3600),
    ("J_ShortDance16_JazzWalk, G1 Moves (3600 s), earlier default", ("def60-bcg-jazzwalk-s0", "def60-bcg-jazzwalk-s1")),
    ("J_ShortDance16_JazzWalk, G1 Moves (1200 s), earlier default", ("ts-bcg-jazzwalk-s0",)),
    ("M_ShortMove14, G1 Moves, 6.5 s, not tuned on (3600 s)", SHORTMOVE14_DEFAULT_3600),
    ("M_ShortMove14, G1 Moves, 6.5 s, not tuned on (3600 s), previous default", SHORTMOVE14_PREVIOUS_3600),
    ("B_HandsUp, G1 Moves, 7.4 s, not tuned on (1200 s, one run at a time)", HANDSUP_DEFAULT_1200),
    ("B_HandsUp, G1 Moves, 7.4 s, not tuned on (3600 s), previous default", HANDSUP_PREVIOUS_3600),
    ("B_SpinKarate, G1 Moves, 25.6 s (3600 s, one run at a time)", SPINKARATE_DEFAULT_3600_ALONE),
    ("B_SpinKarate, G1 Moves, 25.6 s (3600 s, two runs at a time)", SPINKARATE_DEFAULT_3600_SLOWER),
    ("B_SpinKarate, G1 Moves, 25.6 s (3600 s on the faster machine)", SPINKARATE_DEFAULT_3600),
    ("B_SpinKarate, G1 Moves, 25.6 s (3600 s), previous default", SPINKARATE_PREVIOUS_3600_UNCORRECTED),
    ("B_SpinKarate, G1 Moves, 25.6 s (7200 s: seed 0 continued), previous default",
     ("def120-bcg-spinkarate-credit-s0",)),
)
"""`bcg train --motion CLIP --estimator bcg --max-time-s T` with no other flag, per clip: today's default (failures
credited where their episode ended, the ground and the torque limits randomised), the previous default (failures
credited to the start of their episode, neither randomisation) and the earlier one (credited where the episode ended,
neither randomisation); the seeds kept so far (a group is printed with the seeds it has)."""

JUMP_LEVERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("stay-up layers, schedule over about 2000 iterations (1500 s)", ("drlay2k-bcg-jump-s0", "drlay2k-bcg-jump-s1")),
    ("the same with --contact-randomization (1500 s)", ("cr-bcg-jump-s0", "cr-bcg-jump-s1")),
    ("the same with --contact-randomization --torque-limit-randomization (1500 s)",
     ("crtl-bcg-jump-s0", "crtl-bcg-jump-s1")),
    ("the same with a fixed soft ground (--soft-contact-timeconst 0.02 --contact-beta 0.2), 500-it schedule",
     ("drlaysoft-bcg-jump-s0",)),
)
"""What was tried on the jump's landings, where MuJoCo's softer contact and ours part."""


SPINKARATE_LEVERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("previous default (3600 s), before the bundle-gradient correction", SPINKARATE_PREVIOUS_3600_UNCORRECTED),
    ("previous default (3600 s)", SPINKARATE_PREVIOUS_3600),
    ("--torque-limit-randomization (3600 s)", ("hd60-bcg-spinkarate-tlr-s0",)),
    ("--reference-joint-margin 0.05 (3600 s)", ("hd60-bcg-spinkarate-m05-s0", "hd60-bcg-spinkarate-m05-s1")),
    ("--contact-randomization (3600 s)", ("hd60-bcg-spinkarate-cr-s0", "hd60-bcg-spinkarate-cr-s1")),
    ("--contact-randomization --torque-limit-randomization (7200 s)", ("hd120-bcg-spinkarate-crtlr-s0",
                                                                       "hd120-bcg-spinkarate-crtlr-s1")),
    ("--contact-randomization --torque-limit-randomization --friction-range 0.2 0.8 (3600 s)",
     ("hd60-bcg-spinkarate-crtlrfr-s0", "hd60-bcg-spinkarate-crtlrfr-s1")),
    ("--contact-randomization --torque-limit-randomization --friction-range 0.15 0.6 (3600 s)",
     ("hd60-bcg-spinkarate-crtlrfr15-s0",)),
    ("--adaptive-start-credit end (3600 s)", ("hd60-bcg-spinkarate-end-s0", "hd60-bcg-spinkarate-end-s1")),
    ("--adaptive-start-credit end --contact-randomization --torque-limit-randomization (3600 s on the faster "
     "machine): today's default",
     SPINKARATE_DEFAULT_3600),
    ("today's default, on the slower machine (3600 s, two runs at a time)", SPINKARATE_DEFAULT_3600_SLOWER),
    ("today's default, on the slower machine (3600 s, one run at a time)", SPINKARATE_DEFAULT_3600_ALONE),
    ("today's default with MuJoCo's PD law, --pd-lookahead False (3600 s, one run at a time)",
     SPINKARATE_MUJOCO_PD_3600),
    ("today's default with --torque-limit-range 1.0 1.4 (10 400 iterations, the one-at-a-time runs' mean in 3600 s)",
     SPINKARATE_TORQUE_RANGE_10400),
    ("today's default with both, --pd-lookahead False --torque-limit-range 1.0 1.4 (3600 s, one run at a time)",
     SPINKARATE_MUJOCO_PD_TORQUE_RANGE_3600),
    ("today's default with contact dropouts, --contact-dropout-range 0 1 (3600 s, two runs at a time)",
     SPINKARATE_DROPOUT_3600),
    ("today's default without the torque-limit randomisation, --no-torque-limit-randomization (3600 s, two runs at a "
     "time)", SPINKARATE_NO_TORQUE_LIMIT_3600),
)
"""What was tried on SpinKarate: its transfer gap (saturated ankles, an ankle roll held at its stop by the clip, a
slippery pivot) and learning its kicks within the hour (where failed episodes are credited); flags on top of the
previous default (failures credited to the start of their episode, neither randomisation)."""


BUNDLE_SIZE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run (1200 s), B = 10", RUN_PREVIOUS_1200),
    ("run (1200 s), sized 2 ... 10", ("def20-bcgsized-run-s0", "def20-bcgsized-run-s1")),
    ("jump (3600 s, earlier default), seed 2, B = 10", JUMP_EARLIER_3600[2:]),
    ("jump (3600 s, earlier default), seed 2, sized 2 ... 10", JUMP_SIZED_3600),
)
"""SHAC+BCG with fixed bundles (`bcg`, B = 10) against bundles sized from the force
(`bcg:size=sensitivity,min_branches=2`), each pair with the same seed, code and settings, trained side by side."""


WINDOW_SIZE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("16 x 16 (cpu-small)", RUN_PREVIOUS_1200),
    ("32 x 16", ("nh32x16-bcg-run-s0", "nh32x16-bcg-run-s1")),
    ("16 x 32", ("nh16x32-bcg-run-s0", "nh16x32-bcg-run-s1")),
    ("32 x 32", ("nh32x32-bcg-run-s0", "nh32x32-bcg-run-s1")),
)
"""SHAC+BCG on the run clip, 1200 s, at four window sizes (--shac.num-envs x --shac.horizon), two seeds each, the
previous default otherwise."""


RANDOMIZATION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("run (1200 s), previous default", RUN_PREVIOUS_1200),
    ("run (1200 s), previous default with --contact-randomization --torque-limit-randomization",
     ("crtlr20-bcg-run-s0", "crtlr20-bcg-run-s1")),
)
"""Contact and torque-limit randomisation against the previous default on the run clip at its default budget (the same
seeds and code): the lever that helped SpinKarate and the jump's landings, tried where that default already stood."""


DEFAULT_CHANGE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("B_SpinKarate (3600 s), previous default", SPINKARATE_PREVIOUS_3600),
    ("B_SpinKarate (3600 s on the faster machine), today's default", SPINKARATE_DEFAULT_3600),
    ("B_SpinKarate (3600 s, two runs at a time), today's default", SPINKARATE_DEFAULT_3600_SLOWER),
    ("B_SpinKarate (3600 s, one run at a time), today's default", SPINKARATE_DEFAULT_3600_ALONE),
    ("B_SpinKarate (3600 s, one run at a time on the slowest machine), today's default",
     SPINKARATE_DEFAULT_3600_SLOWEST),
    ("jump (3600 s), previous default", JUMP_PREVIOUS_3600),
    ("jump (3600 s), today's default", JUMP_DEFAULT_3600),
    ("J_ShortDance16_JazzWalk (3600 s), previous default", JAZZWALK_PREVIOUS_3600),
    ("J_ShortDance16_JazzWalk (3600 s), today's default", JAZZWALK_DEFAULT_3600),
    ("M_ShortMove14, not tuned on (3600 s), previous default", SHORTMOVE14_PREVIOUS_3600),
    ("M_ShortMove14, not tuned on (3600 s), today's default", SHORTMOVE14_DEFAULT_3600),
    ("B_HandsUp, not tuned on (3600 s), previous default", HANDSUP_PREVIOUS_3600),
    ("B_HandsUp, not tuned on (1200 s, one run at a time), today's default", HANDSUP_DEFAULT_1200),
    ("run (1200 s), previous default", RUN_PREVIOUS_1200),
    ("run (700 s on the faster machine: fewer iterations than the previous default's 1200 s), today's default",
     RUN_DEFAULT_700),
    ("run (1200 s, one run at a time), today's default", RUN_DEFAULT_1200),
    ("fight (1200 s), previous default", FIGHT_PREVIOUS_1200),
    ("fight (1200 s on the faster machine), today's default", FIGHT_DEFAULT_1200),
    ("fight (700 s on the faster machine: the iterations of 1200 s on the slower one), today's default",
     FIGHT_DEFAULT_700),
    ("dance (1200 s), previous default", DANCE_PREVIOUS_1200),
    ("dance (1200 s on the faster machine), today's default", DANCE_DEFAULT_1200),
)
"""Today's default (`--adaptive-start-credit end --contact-randomization --torque-limit-randomization` on top of the
previous one) beside the previous default, clip by clip: SpinKarate, where it was found, the jump and JazzWalk for an
hour, ShortMove14 (held out from tuning) for an hour, the run, fight and dance clips at their budget or its
iterations. Iterations per seed are shown because the runs ran on two machines of the same kind, one of which
completes 1.2-1.8x the iterations per hour of the other (1.7-1.8x on SpinKarate and the fight, 1.3-1.5x on the run,
1.2x on ShortMove14); the labels say which rows ran on the faster one."""


def grouped(root: Path, groups: tuple[tuple[str, tuple[str, ...]], ...], first: str,
            iterations: bool = False) -> str:
    """One row per group of runs (seeds): MuJoCo falls summed over seeds and episodes, mean episode and E_track
    averaged over seeds (with each seed's value), samples (and, with ``iterations``, each seed's iterations in its
    budget); a group shows the runs of it that are kept."""
    its_head, its_rule = (" iterations per seed |", "---|") if iterations else ("", "")
    lines = [f"| {first} | seeds |{its_head} samples per seed | MuJoCo: falls, mean episode [s], E_track [cm] | ours: "
             "falls, mean episode [s], E_track [cm] |", f"|---|---|{its_rule}---|---|---|"]
    for label, names in groups:
        runs = [r for r in (root / n for n in names) if r.exists() and any(r.glob("eval_*.json"))]
        if not runs:
            continue
        evals = [json.loads(sorted(r.glob("eval_*.json"))[0].read_text()) for r in runs]
        lasts = [last_row(r) for r in runs]
        samples = [int(float(last["samples"])) for last in lasts]
        its = " " + " / ".join(last["iteration"] for last in lasts) + " |" if iterations else ""
        cols = []
        for sim in ("mujoco", "bcg"):
            falls = sum(e[sim]["falls"] for e in evals)
            episodes = sum(e[sim]["episodes"] for e in evals)
            ep = [e[sim]["mean_episode_seconds"] for e in evals]
            err = [e[sim]["e_track_cm"] for e in evals]
            each = " / ".join(f"{x:.1f}" for x in err)
            cols.append(f"{falls} of {episodes}, {sum(ep) / len(ep):.1f}, {sum(err) / len(err):.1f}"
                        + (f" ({each})" if len(err) > 1 else ""))
        per_seed = sum(samples) / len(samples) / 1e6
        lines.append(f"| {label} | {len(runs)} |{its} {per_seed:.2f} M | {cols[0]} | {cols[1]} |")
    return "\n".join(lines)


MUJOCO_STEP_RUNS: tuple[str, ...] = SPINKARATE_DEFAULT_3600_SLOWEST + SPINKARATE_MUJOCO_PD_TORQUE_RANGE_3600
"""The runs replayed at finer simulator steps (docs/evaluation.md, *MuJoCo's own step*)."""
MUJOCO_STEP_REPLAYS: tuple[tuple[str, str, str], ...] = (
    ("MuJoCo 5 ms (default protocol)", "eval_B_SpinKarate.json", "mujoco"),
    ("MuJoCo 1 ms", "mujoco_step_1ms.json", "mujoco"),
    ("MuJoCo 0.2 ms", "mujoco_step_0.2ms.json", "mujoco"),
    ("ours 5 ms (the policy's)", "eval_B_SpinKarate.json", "bcg"),
    ("both at 1 ms: MuJoCo", "both_1ms.json", "mujoco"),
    ("both at 1 ms: ours", "both_1ms.json", "bcg"),
)
"""(column label, the kept ``metrics.json`` of that replay beside each run, simulator): ``eval_CLIP.json`` is `bcg
evaluate RUN`; ``mujoco_step_1ms.json`` and ``mujoco_step_0.2ms.json`` the same with ``--mujoco-refine 5`` and ``25``;
``both_1ms.json`` with ``--substeps 20 --sim-dt 0.001``."""


DROPOUT_RUNS: tuple[str, ...] = SPINKARATE_DEFAULT_3600_SLOWEST
"""The runs replayed in our simulator with contact dropouts (docs/evaluation.md, *Contact dropouts*)."""
DROPOUT_REPLAYS: tuple[tuple[str, str, str], ...] = (
    ("MuJoCo 5 ms (default protocol)", "eval_B_SpinKarate.json", "mujoco"),
    ("ours (default protocol)", "eval_B_SpinKarate.json", "bcg"),
    ("ours, dropout 0.25", "ours_dropout_0.25.json", "bcg"),
    ("ours, dropout 0.5", "ours_dropout_0.5.json", "bcg"),
    ("ours, dropout 1", "ours_dropout_1.json", "bcg"),
    ("ours, soft ground", "ours_soft.json", "bcg"),
    ("ours, soft ground, dropout 1", "ours_soft_dropout_1.json", "bcg"),
)
"""(column label, kept ``metrics.json`` beside each run, simulator): ``ours_dropout_P.json`` is `bcg evaluate RUN
--contact-dropout P`; ``ours_soft.json`` adds ``--soft-contact-timeconst 0.02 --contact-beta 0.1`` (the softest ground
of the contact randomisation), ``ours_soft_dropout_1.json`` both."""


def step_table(root: Path, runs: tuple[str, ...] = MUJOCO_STEP_RUNS,
               replays: tuple[tuple[str, str, str], ...] = MUJOCO_STEP_REPLAYS) -> str:
    """One row per kept run (its flags apart from the default), a column per replay: falls and E_track [cm]; a
    replay not kept beside a run is left blank."""
    lines = ["| run (falls, E_track [cm]) | settings | " + " | ".join(label for label, _, _ in replays) + " |",
             "|---|---|" + "---|" * len(replays)]
    for run in (root / n for n in runs):
        if not (run / "config.json").exists():
            continue
        kept = {file: json.loads((run / file).read_text()) for file in {f for _, f, _ in replays}
                if (run / file).exists()}  # each replay's file read once (two columns share eval_CLIP.json)
        cells = []
        for _, file, sim in replays:
            m = kept[file][sim] if file in kept else None
            cells.append(f"{m['falls']} of {m['episodes']}, {m['e_track_cm']:.1f}" if m else "")
        flags = settings(json.loads((run / "config.json").read_text()))
        lines.append(f"| {run.name} | {flags} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tables(root: Path) -> dict[str, tuple[str, str]]:
    """Every table by marker name: (title, Markdown)."""
    return {
        "runs": ("Every kept run", table(root)),
        "ablation": ("Ablation, run clip", grouped(root, ABLATION, "levers")),
        "methods": ("Methods, run clip", grouped(root, METHODS, "method")),
        "methods_jump": ("Methods, jump clip, 3600 s", grouped(root, METHODS_JUMP, "method")),
        "methods_run_3600": ("Methods, run clip, 3600 s", grouped(root, METHODS_RUN_3600, "method")),
        "methods_fight_3600": ("Methods, fight clip, 3600 s", grouped(root, METHODS_FIGHT_3600, "method")),
        "methods_dance_3600": ("Methods, dance clip, 3600 s", grouped(root, METHODS_DANCE_3600, "method")),
        "methods_3600": ("Methods at 3600 s, per clip",
                         grouped(root, METHODS_3600_BY_CLIP, "clip, method", iterations=True)),
        "defaults": ("`bcg train` default, per clip", grouped(root, DEFAULTS, "clip", iterations=True)),
        "jump": ("The jump's landings", grouped(root, JUMP_LEVERS, "jump, SHAC+BCG")),
        "spinkarate": ("SpinKarate's transfer gap", grouped(root, SPINKARATE_LEVERS, "SpinKarate, SHAC+BCG")),
        "window_size": ("cpu-small's window at one budget, run clip",
                        grouped(root, WINDOW_SIZE, "environments x steps", iterations=True)),
        "bundle_size": ("Fixed bundles against bundles sized from the force",
                        grouped(root, BUNDLE_SIZE, "SHAC+BCG", iterations=True)),
        "randomization": ("Contact and torque-limit randomisation on the run clip",
                          grouped(root, RANDOMIZATION, "SHAC+BCG", iterations=True)),
        "default_change": ("Today's default against the previous one",
                           grouped(root, DEFAULT_CHANGE, "SHAC+BCG", iterations=True)),
        "mujoco_step": ("SpinKarate's policies at finer simulator steps", step_table(root)),
        "dropout": ("SpinKarate's policies replayed with contact dropouts",
                    step_table(root, DROPOUT_RUNS, DROPOUT_REPLAYS)),
    }


def write_into(path: Path, found: dict[str, tuple[str, str]], kind: str = "transfer_tables") -> list[str]:
    """Replace each table of ``path`` marked ``<!-- KIND:NAME -->`` ... ``<!-- /KIND:NAME -->`` (indentation kept: a
    table inside a list item stays inside it); returns the names replaced."""
    text = path.read_text()
    done = []
    for name, (_, md) in found.items():
        pat = re.compile(rf"^([ \t]*)<!-- {kind}:{name} -->\n.*?^[ \t]*<!-- /{kind}:{name} -->", re.M | re.S)

        def repl(m: re.Match, md: str = md, name: str = name) -> str:
            pad = m.group(1)
            body = "\n".join(pad + line for line in md.splitlines())
            return f"{pad}<!-- {kind}:{name} -->\n{body}\n{pad}<!-- /{kind}:{name} -->"

        text, n = pat.subn(repl, text)
        if n:
            done.append(name)
    path.write_text(text)
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(__file__).parent / "results" / "stay_up")
    ap.add_argument("--write", type=Path, nargs="*", default=None, help="Markdown files whose marked tables to replace")
    args = ap.parse_args()
    found = tables(args.dir)
    if args.write is None:
        print("\n\n".join(f"{title}:\n\n{md}" for title, md in found.values()))
        return
    for path in args.write:
        print(f"{path}: replaced {', '.join(write_into(path, found)) or 'nothing (no markers)'}")


if __name__ == "__main__":
    main()
