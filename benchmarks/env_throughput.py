"""Environment steps per second of the batched G1 tracking env, beside the bare simulator, the SB3 adapter and a
MuJoCo-CPU loop.

For each N: the vector env under no-grad; the vector env with ``differentiable=True`` plus one backward pass per
step (reward sum, graph cut every step, as a SHAC horizon of 1 would); the bare :func:`bcg.sim.step` loop doing
the same (``bcg.evaluation.sim_throughput.sim_rate``), so env / sim is the environment's overhead (issue 12: >= 0.8);
the SB3 adapter (numpy in and out); and a plain MuJoCo loop (``mj_step`` x substeps per control step with the same
PD targets through the position actuators, one MjData per environment). Printed as env-steps/s and as ratios.

Each number is the best of ``--repeats`` timed blocks of ``--steps`` steps: on a shared machine the other processes
only ever slow a block down, so the fastest block is the closest to the machine's own speed.

    python benchmarks/env_throughput.py [--sizes 16 64 256] [--steps 30] [--repeats 3] [--threads 2] [--motion run]
    python benchmarks/env_throughput.py --interleave 200 --threads 1 --sizes 64   # env / sim, steps interleaved
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def _time(fn, steps: int, repeats: int, warmup: int = 2) -> float:
    """Seconds for ``steps`` calls of ``fn``: the best of ``repeats`` timed blocks, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_vector(n: int, steps: int, motion: str, differentiable: bool, repeats: int = 3) -> float:
    from bcg.envs.vector_env import G1TrackingVectorEnv

    env = G1TrackingVectorEnv(n, motion, differentiable=differentiable)
    env.reset(seed=0)
    g = torch.Generator().manual_seed(0)

    def one() -> None:
        a = (torch.randn(n, 29, generator=g) * 0.1).requires_grad_(differentiable)
        _, rew, *_ = env.step(a)
        if differentiable:
            rew.sum().backward()
            env.detach()

    return n * steps / _time(one, steps, repeats)


def bench_sb3(n: int, steps: int, motion: str, repeats: int = 3) -> float:
    from bcg.envs.sb3 import SB3VecEnv
    from bcg.envs.vector_env import G1TrackingVectorEnv

    venv = SB3VecEnv(G1TrackingVectorEnv(n, motion))
    venv.reset()
    rng = np.random.default_rng(0)

    def one() -> None:
        venv.step(rng.uniform(-0.1, 0.1, (n, 29)).astype(np.float32))

    return n * steps / _time(one, steps, repeats)


def bench_mujoco(n: int, steps: int, substeps: int = 4, repeats: int = 3) -> float:
    """Control steps per second of ``n`` rollouts in the project's MuJoCo PD loop (one MjData each, contact
    measurement off)."""
    from bcg.evaluation.mujoco_loop import MujocoLoop
    from bcg.robots.g1 import DEFAULT_JOINT_POS

    loop = MujocoLoop(n, substeps=substeps)
    rng = np.random.default_rng(0)

    def one() -> None:
        loop.step(DEFAULT_JOINT_POS[None] + rng.uniform(-0.1, 0.1, (n, 29)), contacts=False)

    k = max(1, steps // 2)
    return n * k / _time(one, k, repeats)


def main() -> None:
    from bcg.evaluation.sim_throughput import sim_rate
    from bcg.sim import load_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3, help="timed blocks per number (the best is printed)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch intra-op threads (on a shared 2-core machine 1 is often faster: no spinning barriers)")
    p.add_argument("--motion", default="run")
    p.add_argument("--interleave", type=int, default=0, metavar="STEPS",
                   help="only print env / sim with the env and simulator steps interleaved, STEPS pairs per N")
    args = p.parse_args()
    r = max(1, args.repeats)
    torch.set_num_threads(max(1, min(args.threads, torch.get_num_threads())))
    if args.interleave:
        from bcg.evaluation.sim_throughput import env_sim_interleaved
        from bcg.sim import load_model

        model = load_model()
        for n in args.sizes:
            for grad in (False, True):
                ratio, e, m = env_sim_interleaved(model, n, args.interleave, grad, motion=args.motion)
                print(f"N = {n:>4} {'diff + backward' if grad else 'no-grad        '}: env / sim {ratio:.3f} "
                      f"(median step: env {e * 1e3:.2f} ms, sim {m * 1e3:.2f} ms, env overhead {(e - m) * 1e3:.2f} "
                      "ms)", flush=True)
        return
    model = load_model()
    print(f"{'N':>5} {'vec no-grad':>12} {'sim no-grad':>12} {'env/sim':>8} {'vec diff+bwd':>13} {'sim grad+bwd':>13} "
          f"{'env/sim':>8} {'SB3 adapter':>12} {'MuJoCo loop':>12}   ratios to MuJoCo (no-grad / diff / SB3)")
    for n in args.sizes:
        ng = bench_vector(n, args.steps, args.motion, False, r)
        sn = sim_rate(model, n, args.steps, False, r)
        k = max(3, args.steps // 3)
        df = bench_vector(n, k, args.motion, True, r)
        sg = sim_rate(model, n, k, True, r)
        sb = bench_sb3(n, args.steps, args.motion, r)
        mj = bench_mujoco(n, args.steps, repeats=r)
        print(f"{n:>5} {ng:>12.0f} {sn:>12.0f} {ng / sn:>8.2f} {df:>13.0f} {sg:>13.0f} {df / sg:>8.2f} {sb:>12.0f} "
              f"{mj:>12.0f}   {ng / mj:.2f} / {df / mj:.2f} / {sb / mj:.2f}", flush=True)
    print("units: environment (control) steps per second, 50 Hz control, 4 substeps of 5 ms")


if __name__ == "__main__":
    main()
