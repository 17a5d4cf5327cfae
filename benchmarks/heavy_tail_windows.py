"""Which windows carry plain backpropagation's heavy tail at a trained policy: each environment's policy-gradient norm
(``bptt``, the output layer, as ``bcg study variance``) beside the largest contact force and the largest change of a
contact activation sigmoid(kappa d) in its window, with their rank correlations.

    python benchmarks/heavy_tail_windows.py [--policy tests/data/policy_jump_shac_bcg.pt] [--window 32]
        [--num-envs 128] [--seeds 0 1] [--out benchmarks/results/trigger_activation/heavy_tail_windows.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _ranks(x: torch.Tensor) -> torch.Tensor:
    return x.argsort().argsort().to(torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two [n] tensors (ties broken by order)."""
    return float(torch.corrcoef(torch.stack([_ranks(a), _ranks(b)]))[0, 1])


def window_contacts(env, policy, theta: torch.Tensor, start, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([E] largest sphere force [N], [E] largest change of one sphere's activation over a step) of each environment's
    window from ``start``, the policy acting, no gradients."""
    from bcg.estimators.contact_trigger import ActivationTrigger

    s, n = start, start.num_envs
    fmax, amax, prev = torch.zeros(n), torch.zeros(n), None
    with torch.no_grad():
        for _ in range(window):
            s, _, _, _, c = env.transition(s, policy.actions(env, s, theta))
            fmax = torch.maximum(fmax, c.peak_force.amax(1))
            act = ActivationTrigger.activations(env.model, c)
            if prev is not None:
                amax = torch.maximum(amax, (act - prev).abs().amax(1))
            prev = act
    return fmax, amax


def main() -> None:
    from bcg.agents.export import load_policy
    from bcg.estimators import make
    from bcg.evaluation.gradient_variance import estimator_gradients, start_states
    from bcg.evaluation.study_variance import CheckpointPolicy, policy_study_env

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=ROOT / "tests" / "data" / "policy_jump_shac_bcg.pt")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--num-envs", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--top", type=int, default=5, help="environments listed from the top of the gradient norms")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    policy = load_policy(a.policy)
    env, _, _ = policy_study_env(policy, 2 * a.num_envs)
    actor = CheckpointPolicy(policy)
    theta = actor.initial_theta(a.num_envs)
    result = {"policy": str(a.policy), "window": a.window, "num_envs": a.num_envs, "seeds": {}}
    for seed in a.seeds:
        start = start_states(env, seed, a.num_envs, a.window)
        g = estimator_gradients(env, make("bptt"), actor, theta, start, a.window, seed).grads.norm(dim=1)
        fmax, amax = window_contacts(env, actor, theta, start, a.window)
        top = g.argsort(descending=True)[:a.top]
        row = {"gradient_norm_top": g[top].tolist(), "gradient_norm_median": float(g.median()),
               "largest_force_top": fmax[top].tolist(), "largest_force_median": float(fmax.median()),
               "largest_force_q90": float(fmax.quantile(0.9)),
               "activation_change_top": amax[top].tolist(), "activation_change_median": float(amax.median()),
               "spearman_gradient_force": spearman(g, fmax), "spearman_gradient_activation": spearman(g, amax),
               "windows_with_force_above_400": float((fmax > 400).double().mean())}
        result["seeds"][str(seed)] = row
        top_g = [round(x) for x in row["gradient_norm_top"]]
        top_f = [round(x) for x in row["largest_force_top"]]
        print(f"seed {seed}: gradient norm top {top_g} (median {row['gradient_norm_median']:.0f}); their largest force "
              f"{top_f} N (all windows: median {row['largest_force_median']:.0f}, 90th percentile "
              f"{row['largest_force_q90']:.0f}); rank correlation with the force {row['spearman_gradient_force']:.2f}, "
              f"with the activation change {row['spearman_gradient_activation']:.2f}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
