"""Where a control step's time goes: per-kernel times of the Warp simulator (forward and backward) and a torch
profile of the vector env step.

Simulator part: N environments, ``--steps`` control steps of 4 substeps. Every kernel launch of the forward is run
on its own inside a ``wp.ScopedTimer`` (synchronising, so the time is the kernel's, packing of the arguments
included), then every adjoint launch of the recorded tapes in reverse order, the way ``wp.Tape.backward`` runs
them. Times are summed per kernel over substeps and steps and printed per control step [ms].

Env part: ``torch.profiler`` over ``--env-steps`` steps of :class:`bcg.envs.G1TrackingVectorEnv` under no-grad
(and with ``--env-grad`` a differentiable step plus backward), the top operators by self CPU time; the simulator
call shows as ``_WarpControlStep``.

    python benchmarks/profile_step.py [--n 64] [--steps 8] [--env-steps 20] [--threads 1]
    python benchmarks/profile_step.py --n 64 --env-parts   # env step parts: torch code vs Warp launches
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch


def _inputs(model, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from bcg.robots import g1

    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1)
    qd = torch.zeros(n, model.nv)
    gen = torch.Generator().manual_seed(0)
    targets = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)[None] + 0.05 * torch.randn(n, model.nu,
                                                                                                generator=gen)
    return q, qd, targets


def kernel_times(n: int, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per-kernel seconds per control step ``(forward, backward)`` at N = ``n``, averaged over ``steps`` steps."""
    import warp as wp

    from bcg.sim import load_model
    from bcg.sim.bridge import _load_inputs
    from bcg.sim.engine import StepArrays, substep_launches

    model = load_model()
    q, qd, targets = _inputs(model, n)
    fwd: dict[str, float] = defaultdict(float)
    bwd: dict[str, float] = defaultdict(float)
    for rep in range(steps + 1):  # the first step compiles / loads and warms the caches: not counted
        arrs = StepArrays(model, n, requires_grad=True)
        _load_inputs(arrs, q, qd, targets)
        tape = wp.Tape()
        for k in range(model.params.substeps):
            for launch in substep_launches(model, arrs, k):
                with wp.ScopedTimer(launch.kernel.key, print=False, synchronize=True) as t:
                    with tape:
                        wp.launch(launch.kernel, dim=n, inputs=launch.inputs, outputs=launch.outputs,
                                  device=model.device)
                if rep:
                    fwd[launch.kernel.key] += t.elapsed / 1e3 / steps
        S = model.params.substeps
        for a in (arrs.q[S], arrs.qd[S], arrs.impulse):
            a.grad.fill_(1.0)
        for entry in reversed(tape.launches):
            one = wp.Tape()
            one.launches = [entry]
            with wp.ScopedTimer(entry[0].key, print=False, synchronize=True) as t:
                one.backward()
            if rep:
                bwd[entry[0].key] += t.elapsed / 1e3 / steps
    return dict(fwd), dict(bwd)


def _print_kernels(fwd: dict[str, float], bwd: dict[str, float], n: int) -> None:
    tf, tb = sum(fwd.values()), sum(bwd.values())
    print(f"\n# Warp kernels, N = {n}, per control step (4 substeps): forward {tf * 1e3:.2f} ms, "
          f"backward {tb * 1e3:.2f} ms")
    print("| kernel | forward [ms] | share | backward [ms] | share | backward / forward |")
    print("|---|---|---|---|---|---|")
    for key in sorted(fwd, key=lambda k: -(fwd[k] + bwd.get(k, 0.0))):
        f, b = fwd[key], bwd.get(key, 0.0)
        print(f"| {key} | {f * 1e3:.2f} | {f / tf:.0%} | {b * 1e3:.2f} | {b / tb:.0%} | {b / f:.1f} |")


def env_profile(n: int, steps: int, grad: bool, top: int = 25) -> None:
    """Print the torch profiler table (self CPU time) of ``steps`` env steps at N = ``n``."""
    from torch.profiler import ProfilerActivity, profile

    from bcg.envs.vector_env import G1TrackingVectorEnv

    env = G1TrackingVectorEnv(n, "run", differentiable=grad)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    acts = [torch.randn(n, 29, generator=g) * 0.1 for _ in range(steps)]

    def one(a: torch.Tensor) -> None:
        a = a.clone().requires_grad_(grad)
        _, rew, *_ = env.step(a)
        if grad:
            rew.sum().backward()
            env.detach()

    for a in acts[:3]:
        one(a)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for a in acts:
            one(a)
    wall = time.perf_counter() - t0
    print(f"\n# vector env step, N = {n}, {'differentiable + backward' if grad else 'no-grad'}: "
          f"{wall / steps * 1e3:.2f} ms per step under the profiler")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def env_parts(n: int, rounds: int = 5, block: int = 50) -> None:
    """Per part of the env step, the torch code against the Warp launches that replace it on the CPU (the same env,
    ``env._use_warp``), timed alternately in blocks of ``block`` calls, best of ``rounds`` (ms per call)."""
    from bcg.envs.rewards import StepContext
    from bcg.envs.vector_env import G1TrackingVectorEnv

    env = G1TrackingVectorEnv(n, "run")
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        env.step(torch.randn(n, 29, generator=g) * 0.1)
    s, a = env.state, torch.randn(n, 29, generator=g) * 0.1
    frame = s.frame.clamp(max=env.num_frames - 1)
    qg = s.q.clone().requires_grad_(True)

    def features_bwd() -> None:
        f = env.feature_fn(qg, s.qd)
        (f.body_rot_w.sum() + f.body_pos_w.sum() + f.key_pos_w.sum()).backward()

    f = env.feature_fn(s.q, s.qd)  # the parts below start from the same features
    ctx = StepContext(a, s.prev_actions, None)

    def reward() -> None:
        if env._warp:
            env.rules.warp_reward(env.reward_fn, f, frame, ctx)
        else:
            env.reward_fn(f, env.ref_features(frame), ctx)

    def metrics() -> None:
        if env._warp:
            env.rules.warp_reward.metrics(f, frame)
        else:
            ref = env.ref_features(frame)
            (f.key_pos_w - ref.key_pos_w).norm(dim=-1).amax(1), (f.body_pos_w - ref.body_pos_w).norm(dim=-1).mean(1)

    parts = {
        "features (kinematics + key points)": lambda: env.feature_fn(s.q, s.qd),
        "features, forward + backward": features_bwd,
        "observation": lambda: env.observer(f, s.frame),
        "reward (reference rows included)": reward,
        "termination and tracking distances": metrics,
        "instability check": lambda: env._unstable(s),
        "observation noise draws": lambda: env.draws.uniform(s.rng_key, s.episode_steps, env.obs_dim, 2),
    }
    print(f"\n# env step parts, N = {n}: torch code vs Warp launches, alternating, best of {rounds} blocks of {block} "
          "[ms per call]")
    print("| part | torch | Warp | torch / Warp |\n|---|---|---|---|")
    best: dict = {}
    for _ in range(rounds):
        for warp in (False, True):
            env._use_warp(warp)
            for name, fn in parts.items():
                with torch.set_grad_enabled("backward" in name):
                    for _ in range(3):
                        fn()
                    t0 = time.perf_counter()
                    for _ in range(block):
                        fn()
                    t = (time.perf_counter() - t0) / block
                best[name, warp] = min(best.get((name, warp), float("inf")), t)
    env._use_warp(True)
    for name in parts:
        t0, t1 = best[name, False], best[name, True]
        print(f"| {name} | {t0 * 1e3:.3f} | {t1 * 1e3:.3f} | {t0 / t1:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="environments")
    p.add_argument("--steps", type=int, default=8, help="control steps timed per kernel")
    p.add_argument("--env-steps", type=int, default=20, help="env steps under the torch profiler (0: skip)")
    p.add_argument("--env-grad", action="store_true", help="also profile the differentiable env step + backward")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--env-parts", action="store_true",
                   help="only time the env step's parts, torch code against the Warp launches (no kernel table)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.env_parts:
        env_parts(args.n)
        return
    fwd, bwd = kernel_times(args.n, args.steps)
    _print_kernels(fwd, bwd, args.n)
    if args.env_steps:
        env_profile(args.n, args.env_steps, grad=False)
        if args.env_grad:
            env_profile(args.n, args.env_steps, grad=True)


if __name__ == "__main__":
    main()
