"""Cost of PPO iterations (stable-baselines3 on the batched env): seconds per iteration split into the rollout, the
ADD discriminator update and SB3's ``train()``, samples per second, and the tracking error of the first iterations.

    python benchmarks/ppo_cost.py [--preset cpu-small] [--motion jump] [--iterations 8] [--add] [--constant-lr]
                                  [--threads 1]

The split is measured inside the same iterations (so the ratios hold on a loaded machine even when the absolute
times do not): ``rollout`` = ``collect_rollouts`` without the ADD update, ``add`` = ``ADDReward.update()`` at the end
of the rollout, ``train`` = SB3's ``train()`` (5 epochs x 4 minibatches with the adaptive-KL hook).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--motion", default="jump")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--add", action="store_true", help="ADD reward instead of the tracking reward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--constant-lr", action="store_true", help="adaptive_kl=False (cost of the KL hook)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from bcg.agents.add import ADDConfig
    from bcg.agents.ppo import PRESETS, PPOAgent
    from bcg.envs.config import EnvConfig

    cfg = PRESETS[args.preset]
    if args.constant_lr:
        cfg = dataclasses.replace(cfg, adaptive_kl=False)
    agent = PPOAgent(cfg, EnvConfig(motion_file=args.motion), add=ADDConfig() if args.add else None, seed=args.seed)
    timers: dict[str, list[float]] = {"train": [], "add": []}

    def timed(name: str, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            timers[name].append(time.perf_counter() - t0)
            return out
        return run

    agent.model.train = timed("train", agent.model.train)
    if agent.add is not None:
        agent.add.update = timed("add", agent.add.update)
    per_it = cfg.num_envs * cfg.n_steps
    print(f"PPO {args.preset}: {cfg.num_envs} envs x {cfg.n_steps} steps = {per_it} samples per iteration, motion "
          f"{args.motion}, reward {'ADD' if args.add else 'tracking'}, "
          f"{'adaptive-KL' if cfg.adaptive_kl else 'constant'} lr, {args.threads} torch thread(s)")
    rows = []
    for i in range(args.iterations):
        t0 = time.perf_counter()
        out = agent.train_iteration()
        dt = time.perf_counter() - t0
        tr = timers["train"][-1]
        ad = timers["add"][-1] if timers["add"] else 0.0
        rows.append((dt, dt - tr - ad, ad, tr))
        print(f"it {i + 1:3d}  {dt:6.2f} s  (rollout {dt - tr - ad:5.2f}, add {ad:5.2f}, train {tr:5.2f})  "
              f"{per_it / dt:6.0f} samples/s  tracking {out['tracking_error_cm']:5.1f} cm  reward {out['reward']:.3f}"
              f"  lr {out['lr']:.1e}  kl {out['kl']:.4f}", flush=True)
    r = np.array(rows)
    med = np.median(r, 0)
    print(f"median: {med[0]:.2f} s/iteration = {per_it / med[0]:.0f} samples/s; rollout {med[1]:.2f} s, add "
          f"{med[2]:.2f} s, train {med[3]:.2f} s (shares {med[1] / med[0]:.0%} / {med[2] / med[0]:.0%} / "
          f"{med[3] / med[0]:.0%})")


if __name__ == "__main__":
    main()
