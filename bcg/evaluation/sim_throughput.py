"""Simulator throughput: forward and forward+backward of a 32-control-step rollout against MuJoCo's mj_step.

Measured in one run, on one machine:

* ``fwd``: a 32 x 4-substep rollout of N environments without gradients (no tape);
* ``fwd+bwd``: the same rollout with gradients (one Warp tape per control step) plus ``backward()`` of a loss
  on the final state to the PD targets of every step;
* ``mem``: bytes of Warp arrays the gradient rollout keeps alive (values and gradients), and the process' peak
  resident memory;
* ``mujoco``: C MuJoCo ``mj_step`` on the same MJCF with a floor, same h, N x 32 x 4 steps, one environment after
  the other (single thread); ``fwd/mj`` is our forward time over MuJoCo's.

Usage (``benchmarks/sim_throughput.py`` and ``bcg bench`` call this module)::

    bcg bench                                                 # N = 16, 64, 256 on the CPU
    python benchmarks/sim_throughput.py --device cuda --sizes 64 256 1024 4096
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _rollout(model, n: int, steps: int, grad: bool) -> tuple[float, int]:
    from bcg.robots import g1
    from bcg.sim import step

    dev = torch.device("cuda:0" if model.device == "cuda" else model.device)
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1).to(dev)
    qd = torch.zeros(n, model.nv, device=dev)
    base = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)
    targets = (base[None, None] + 0.05 * torch.randn(n, steps, model.nu, generator=gen)).to(dev)
    if grad:
        targets.requires_grad_(True)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        for t in range(steps):
            q, qd, _ = step(model, q, qd, targets[:, t])
        if grad:
            (q[:, 2].sum() + q[:, 7:].sum()).backward()
    sync()
    return time.perf_counter() - t0, 0


def _step_bytes(model, n: int) -> int:
    from bcg.sim.engine import StepArrays

    arrs = StepArrays(model, n, requires_grad=True)
    total = 0
    for a in arrs.q + arrs.qd + [arrs.targets, arrs.impulse, arrs.depth]:
        total += 2 * a.capacity
    for s in arrs.sub:
        total += sum(2 * a.capacity for a in s.values())
    return total


def _mujoco_time(n: int, steps: int, substeps: int, dt: float) -> float:
    """Seconds of ``n`` rollouts of ``steps`` control steps in C MuJoCo, one after the other, through the project's
    MuJoCo PD loop (:class:`bcg.evaluation.mujoco_loop.MujocoLoop`, contact measurement off)."""
    from bcg.evaluation.mujoco_loop import MujocoLoop
    from bcg.robots import g1

    loop = MujocoLoop(1, substeps=substeps, timestep=dt)
    q0, qd0 = g1.default_qpos()[None], np.zeros((1, loop.nv))
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for _ in range(n):
        loop.set_state(q0, qd0)
        for _ in range(steps):
            loop.step(g1.DEFAULT_JOINT_POS[None] + 0.05 * rng.standard_normal((1, loop.nu)), contacts=False)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=32, help="control steps per rollout")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--no-backward", action="store_true", help="skip the gradient rollouts")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)

    from bcg.sim import load_model

    model = load_model(device=args.device)
    p = model.params
    print(f"# bcg simulator throughput: {args.steps} control steps x {p.substeps} substeps (h = {p.dt * 1e3:.1f} ms), "
          f"device {args.device}, torch threads {torch.get_num_threads()}", flush=True)
    _rollout(model, 2, 2, grad=True)  # compile / load kernels outside the timings
    header = (f"{'N':>6} {'fwd [s]':>9} {'fwd+bwd [s]':>12} {'ms/substep fwd':>15} {'arrays [MiB]':>13} "
              f"{'peak RSS [GiB]':>15} {'mujoco [s]':>11} {'fwd/mj':>7}")
    print(header)
    results = []
    for n in args.sizes:
        fwd = min(_rollout(model, n, args.steps, grad=False)[0] for _ in range(args.repeats))
        both = float("nan")
        if not args.no_backward:
            both = min(_rollout(model, n, args.steps, grad=True)[0] for _ in range(args.repeats))
        mem = _step_bytes(model, n) * args.steps / 2**20
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        mj = _mujoco_time(n, args.steps, p.substeps, p.dt)
        row = dict(n=n, fwd_s=fwd, fwd_bwd_s=both, ms_per_substep=fwd / (args.steps * p.substeps) * 1e3,
                   arrays_mib=mem, peak_rss_gib=rss, mujoco_s=mj, ratio_fwd_mujoco=fwd / mj)
        results.append(row)
        print(f"{n:>6} {fwd:>9.3f} {both:>12.3f} {row['ms_per_substep']:>15.3f} {mem:>13.0f} {rss:>15.2f} "
              f"{mj:>11.3f} {fwd / mj:>7.2f}", flush=True)
    out = dict(device=args.device, steps=args.steps, substeps=p.substeps, dt=p.dt, results=results)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
