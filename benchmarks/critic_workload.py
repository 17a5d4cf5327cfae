"""Critic workloads compared on the same windows: how well cheaper critic fits predict values they have not seen.

The critic fit is most of a SHAC iteration's arithmetic on a CPU (16 passes x 4 minibatches in the paper). This script
records the windows of one SHAC run (the policy's observations, rewards, episode ends and bootstrap observations),
then replays the same stream of windows into fresh critic ensembles trained with other workloads (passes,
minibatches, widths, number of critics), each with its own target critics and TD(lambda) targets, exactly as
``SHAC.critic_fit.fit`` would. Because every workload sees the same windows, the differences are the fit's alone
(in a training run the actor would react to its critic, which this isolates from).

Reported per workload: the mean first-pass loss over the last windows (``critic_loss_new``: the loss on each
window's targets before the critics trained on them, the measure of fit that memorising a window cannot lower), the
last-pass loss, and the fit's seconds per window on this machine.

    python benchmarks/critic_workload.py                       # cpu-small, jump, 300 windows, 5 workloads
    python benchmarks/critic_workload.py --windows 200 --preset paper --record-iterations 60
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time

import torch

from bcg.agents.critic_fit import regress_values
from bcg.agents.networks import CriticEnsemble
from bcg.agents.shac import polyak_, td_lambda_targets

WORKLOADS: dict[str, dict] = {
    "16 passes x 4 (paper)": dict(passes=16, minibatches=4),
    "8 x 2": dict(passes=8, minibatches=2),
    "8 x 2, lr x2": dict(passes=8, minibatches=2, lr_scale=2.0),
    "4 x 2": dict(passes=4, minibatches=2),
    "4 x 2, lr x2": dict(passes=4, minibatches=2, lr_scale=2.0),
    "4 x 2, lr x4": dict(passes=4, minibatches=2, lr_scale=4.0),
    "4 x 1": dict(passes=4, minibatches=1),
    "2 x 1": dict(passes=2, minibatches=1),
    "16 x 4, 2 critics": dict(passes=16, minibatches=4, critics=2),
    "16 x 4, 1 critic": dict(passes=16, minibatches=4, critics=1),
    "16 x 4, first layer 64": dict(passes=16, minibatches=4, hidden=(64, 128)),
    "16 x 4, 64-64": dict(passes=16, minibatches=4, hidden=(64, 64)),
}
"""Label -> passes and minibatches per window, optionally a factor on the critic learning rate, another number of
critics or other hidden widths (the preset's otherwise)."""


def record(preset: str, motion: str, iterations: int, seed: int) -> tuple[list, object]:
    """Run SHAC (``bptt``) for ``iterations`` and keep each window's critic data (detached, on the CPU)."""
    from bcg.agents.train import build_agent, default_config

    cfg = default_config("shac", preset, motion=motion, seed=seed)
    agent = build_agent(cfg)
    windows = []
    rollout = agent._rollout

    def keep(*a, **k):
        w = rollout(*a, **k)
        windows.append((w.critic_obs.clone(), w.rewards.clone(), w.dones.clone(), w.next_obs.clone(),
                        w.next_value_zero.clone()))
        return w

    agent._rollout = keep
    for i in range(iterations):
        agent.train_iteration()
        if (i + 1) % 25 == 0:
            print(f"[critic_workload] recorded {i + 1}/{iterations} windows", flush=True)
    return windows, agent.config


def replay(windows: list, cfg, passes: int, minibatches: int, seed: int, lr_scale: float = 1.0,
           critics: int | None = None, hidden: tuple[int, ...] | None = None) -> dict[str, float]:
    """Fit a fresh critic ensemble on ``windows`` in order with ``passes`` x ``minibatches`` per window (critic
    learning rates times ``lr_scale``; ``critics`` members and ``hidden`` widths, default the preset's)."""
    torch.manual_seed(seed)
    d = windows[0][0].shape[-1]
    k = cfg.num_critics if critics is None else critics
    cfg = dataclasses.replace(cfg, critic_lr=cfg.critic_lr * lr_scale, final_lr=cfg.final_lr * lr_scale,
                              critic_hidden=cfg.critic_hidden if hidden is None else tuple(hidden))
    critics = CriticEnsemble(d, cfg.critic_hidden, k, cfg.activation, cfg.layer_norm)
    target = copy.deepcopy(critics).requires_grad_(False)
    opt = torch.optim.Adam(critics.parameters(), lr=cfg.critic_lr, betas=cfg.betas, fused=True)
    new_losses, last_losses, seconds = [], [], []
    params = list(critics.parameters())

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, cfg.critic_grad_norm)
        opt.step()

    for e, (obs, rew, dones, nxt, zero) in enumerate(windows):
        lr = cfg.critic_lr + (cfg.final_lr - cfg.critic_lr) * min(e / cfg.max_iterations, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        with torch.no_grad():
            nv = target.min(nxt.reshape(-1, d)).reshape(rew.shape)
            nv = torch.where(zero, torch.zeros_like(nv), torch.nan_to_num(nv, nan=0.0, posinf=0.0, neginf=0.0))
        tgt = td_lambda_targets(rew, nv, dones, cfg.gamma, cfg.lam).reshape(-1)
        losses = regress_values(critics, opt, obs.reshape(-1, d), tgt, passes, minibatches, step)
        new_losses.append(losses[0])
        last_losses.append(losses[-1])
        polyak_(target, critics, cfg.target_critic_alpha)
        seconds.append(time.perf_counter() - t0)
    tail = max(1, len(windows) // 3)
    return {"new_loss": statistics.mean(new_losses[-tail:]), "last_loss": statistics.mean(last_losses[-tail:]),
            "seconds": statistics.median(seconds), "curve": new_losses}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-small")
    ap.add_argument("--motion", default="jump")
    ap.add_argument("--record-iterations", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=2, help="critic initialisations per workload")
    ap.add_argument("--plot", default=None, help="write the first-pass loss curves to this PNG")
    ap.add_argument("--windows-file", default=None,
                    help="keep the recorded windows in this file (recorded once, then read from it)")
    ap.add_argument("--only", nargs="*", default=None, help="the workload labels to run (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from pathlib import Path

    if args.windows_file and Path(args.windows_file).is_file():
        from bcg.agents.shac import SHACConfig

        saved = torch.load(args.windows_file, weights_only=True)
        windows = [tuple(w) for w in saved["windows"]]
        cfg = SHACConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()})
    else:
        windows, cfg = record(args.preset, args.motion, args.record_iterations, args.seed)
        if args.windows_file:
            torch.save({"windows": windows, "config": dataclasses.asdict(cfg)}, args.windows_file)
    n, e = windows[0][1].shape
    print(f"{len(windows)} windows of {e} envs x {n} steps ({args.preset}, {args.motion}); critics "
          f"{cfg.num_critics} x {list(cfg.critic_hidden)}, lr {cfg.critic_lr}, alpha {cfg.target_critic_alpha}; "
          f"mean over the last third of the windows, {args.seeds} critic seeds")
    print("| workload | steps / window | first-pass loss (new data) | last-pass loss | fit s / window |")
    print("|---|---|---|---|---|")
    curves = {}
    for label, w in WORKLOADS.items():
        if args.only and label not in args.only:
            continue
        runs = [replay(windows, cfg, w["passes"], w["minibatches"], seed, w.get("lr_scale", 1.0), w.get("critics"),
                       w.get("hidden")) for seed in range(args.seeds)]
        curves[label] = runs[0]["curve"]
        new = [r["new_loss"] for r in runs]
        print(f"| {label} | {w['passes'] * w['minibatches']} | {statistics.mean(new):.4f} "
              f"(seeds {', '.join(f'{v:.4f}' for v in new)}) | "
              f"{statistics.mean(r['last_loss'] for r in runs):.4f} | "
              f"{statistics.mean(r['seconds'] for r in runs):.3f} |", flush=True)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        k = 10
        for label, c in curves.items():
            sm = [statistics.mean(c[max(0, i - k + 1):i + 1]) for i in range(len(c))]
            ax.plot(sm, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("window (iteration)")
        ax.set_ylabel("first-pass critic loss (10-window mean)")
        ax.set_title(f"Critic workloads on the same {len(windows)} windows ({args.preset}, {args.motion})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=90)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
