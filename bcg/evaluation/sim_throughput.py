"""Simulator throughput (``bcg bench``): the ratios of docs/performance.md, each measured in one run on one
machine.

Per N (``--sizes``), a rollout is 32 control steps x 4 substeps from the standing pose with noisy PD targets:

* ``fwd``: the rollout without gradients; ``fwd+bwd``: with gradients, plus ``backward()`` of a loss on the final
  state to the targets of every step; ``first`` is the first gradient rollout at that N in this process (fresh
  array pool), the others are the best of ``--repeats``;
* ``mujoco``: C MuJoCo ``mj_step`` on the same MJCF with a floor, same h, N x 32 x 4 steps, one environment after
  the other (single thread), best of ``--repeats`` timed in alternation with ours (the per-core speed of a shared
  virtual machine drifts by tens of percent within seconds, so a ratio of two timings taken apart is unreliable);
  ``fwd/mj`` and ``(fwd+bwd)/mj`` are our times over MuJoCo's;
* ``kept``: bytes held for the backward at the end of the forward (the Warp arrays' values; with ``checkpoint``
  only the step inputs; the pooled gradient sets a backward runs on, one per thread block, are printed in the
  ratios block), and the process' peak resident memory;
* ``pages/warm`` and ``guest/warm``: :func:`first_touch_time` of the kept bytes over the warm gradient rollout,
  its first try and its best: what the first rollout pays the operating system for its new pages alone (at this
  moment, and the guest kernel's part that remains when the host has the pages already), so ``first/warm`` cannot
  be below ``1 + guest/warm`` on this machine.

Then the ratios block at ``--ratio-n`` (default 64), every pair timed alternately in the same run:

* threads: 2 / 1 thread (``bcg.sim.execution``) forward and forward + backward (goal >= 1.8), and beside it what
  the machine itself allows: two separate processes, each running half the batch on one thread at the same time
  (no shared interpreter, no shared memory), over the one thread;
* one thread / MuJoCo: the same one-thread rollouts over the MuJoCo loop, the three timed in alternation;
* checkpointing: kept bytes and time of a checkpointed gradient rollout against the stored-forward one;
* env / bare sim: env steps per second of :class:`bcg.envs.G1TrackingVectorEnv` over those of the bare
  :func:`bcg.sim.step` loop, without gradients and with a backward every step (goal >= 0.8); then the same with
  the two loops' steps interleaved (:func:`env_sim_interleaved`, robust to the load of other processes).

On CUDA (``--device cuda``) the sizes default to 1024, 4096 and 8192, rates are also printed as substeps per second
(environments x substeps / s), and ``--max-n`` doubles N until an allocation fails, for the stored and the
checkpointed gradient rollout.

Usage (``benchmarks/sim_throughput.py`` and ``bcg bench`` call this module)::

    bcg bench                                   # CPU: N = 16, 64, 256, ratios at N = 64
    bcg bench --device cuda --max-n             # GPU: N = 1024, 4096, 8192 and the largest N that fits
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

__all__ = ["env_rate", "env_sim_interleaved", "first_touch_time", "main", "markdown", "rollout_time", "sim_rate"]


def _device(model) -> torch.device:
    return torch.device("cuda:0" if model.device == "cuda" else model.device)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def rollout_time(model, n: int, steps: int, grad: bool, **options: object) -> tuple[float, int]:
    """Seconds of one rollout of ``n`` environments x ``steps`` control steps (with ``grad``: forward with
    gradients and the backward of a loss on the final state) under :mod:`bcg.sim.execution` ``options``; and the
    bytes kept for the backward at the end of the forward."""
    from bcg.robots import g1
    from bcg.sim import execution_options_set, kept_bytes, step

    dev = _device(model)
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1).to(dev)
    qd = torch.zeros(n, model.nv, device=dev)
    base = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32)
    targets = (base[None, None] + 0.05 * torch.randn(n, steps, model.nu, generator=gen)).to(dev)
    if grad:
        targets.requires_grad_(True)
    kept = 0
    pending = kept_bytes()[0]  # held by graphs of earlier callers not yet freed: not this rollout's
    with execution_options_set(**options):
        _sync(dev)
        t0 = time.perf_counter()
        with torch.set_grad_enabled(grad):
            for t in range(steps):
                q, qd, _ = step(model, q, qd, targets[:, t])
            if grad:
                kept = kept_bytes()[0] - pending
                (q[:, 2].sum() + q[:, 7:].sum()).backward()
        _sync(dev)
    return time.perf_counter() - t0, kept


def first_touch_time(nbytes: int, threads: int, tries: int = 3) -> tuple[float, float]:
    """Seconds that writing ``nbytes`` of memory the process has never touched costs beyond writing it again: the
    operating system's share of a first gradient rollout, which faults in the pages of every array it keeps for the
    backward. Split over ``threads`` threads as the rollout's blocks are (torch's ``zero_`` releases the GIL); each
    part is a fresh allocation (over glibc's mmap threshold, so new pages), written twice.

    Returns ``(first, best)`` over ``tries`` fresh allocations. On a virtual machine a page the guest has not used
    lately also faults in the host (measured here: 1.5 s per GiB, against 0.5-0.6 s for pages the guest reuses), as
    the first rollout's pages may; the later tries reuse the pages the earlier ones gave back, so ``best`` is the
    guest kernel's own cost, the part no allocation strategy inside the process avoids, and ``first`` what new
    pages cost at this moment."""
    from bcg.sim import parallel

    costs = []
    for _ in range(max(1, tries)):
        parts = [torch.empty(-(-nbytes // threads), dtype=torch.uint8) for _ in range(threads)]
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            parallel([lambda b=b: b.zero_() for b in parts])
            times.append(time.perf_counter() - t0)
        costs.append(max(0.0, times[0] - times[1]))
        del parts
    return costs[0], min(costs)


def _reset_peak_rss() -> None:
    """Restart the process' peak resident memory (``ru_maxrss``) at its current value (Linux; elsewhere a no-op)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def sim_rate(model, n: int, steps: int, grad: bool, repeats: int, **options: object) -> float:
    """Control steps per second (x N environments) of the bare :func:`bcg.sim.step` loop the vector env runs:
    with ``grad``, a backward of a loss on each step's outputs after every step (a differentiable window of one
    step, as the env benchmark does)."""
    from bcg.sim import execution_options_set

    dev = _device(model)
    one = _sim_stepper(model, n, grad, torch.Generator(device=dev).manual_seed(0))
    with execution_options_set(**options):
        return n * steps / _best(one, steps, repeats, dev)


def _sim_stepper(model, n: int, grad: bool, gen: torch.Generator) -> Callable[[], None]:
    """One bare :func:`bcg.sim.step` of ``n`` robots from the standing pose per call (targets: the standing pose
    plus noise of 0.05 rad from ``gen``; with ``grad``, a backward of a loss on the step's outputs, the graph cut)."""
    from bcg.robots import g1
    from bcg.sim import step

    dev = _device(model)
    base = torch.tensor(g1.DEFAULT_JOINT_POS, dtype=torch.float32, device=dev)
    state = {"q": torch.tensor(g1.default_qpos(), dtype=torch.float32)[None].repeat(n, 1).to(dev),
             "qd": torch.zeros(n, model.nv, device=dev)}

    def sim_step() -> None:
        targets = (base + 0.05 * torch.randn(n, model.nu, generator=gen, device=dev)).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            q, qd, c = step(model, state["q"], state["qd"], targets)
            if grad:
                (q[:, 2].sum() + qd.sum() + c.impulse.sum()).backward()
        state["q"], state["qd"] = q.detach(), qd.detach()

    return sim_step


def _env_stepper(env, n: int, grad: bool, gen: torch.Generator, dev: torch.device) -> Callable[[], None]:
    """One step of the vector ``env`` per call (random actions of scale 0.1 from ``gen``; with ``grad``, a
    backward of the reward sum, the graph cut)."""

    def env_step() -> None:
        a = (torch.randn(n, 29, generator=gen, device=dev) * 0.1).requires_grad_(grad)
        _, rew, *_ = env.step(a)
        if grad:
            rew.sum().backward()
            env.detach()

    return env_step


def env_rate(n: int, steps: int, grad: bool, repeats: int, device: str = "cpu", motion: str = "run",
             **options: object) -> float:
    """Environment steps per second of :class:`bcg.envs.G1TrackingVectorEnv` (random actions of scale 0.1; with
    ``grad``, ``differentiable=True`` and a backward of the reward sum after every step, the graph cut each step)."""
    from bcg.envs.vector_env import G1TrackingVectorEnv
    from bcg.sim import execution_options_set

    env = G1TrackingVectorEnv(n, motion, differentiable=grad, device=device)
    env.reset(seed=0)
    dev = torch.device(device)
    one = _env_stepper(env, n, grad, torch.Generator(device=dev).manual_seed(0), dev)
    with execution_options_set(**options):
        return n * steps / _best(one, steps, repeats, dev)


def env_sim_interleaved(model, n: int, steps: int, grad: bool, device: str = "cpu", motion: str = "run"
                        ) -> tuple[float, float, float]:
    """(env / bare-simulator throughput, median env step [s], median simulator step [s]): the loops of
    :func:`env_rate` and :func:`sim_rate` advanced one step each in turn (the order swapped every pair), so that
    other processes slow both alike; timing one loop's block after the other's does not ensure that on a shared
    machine. ``steps`` pairs after three warm-up pairs."""
    from bcg.envs.vector_env import G1TrackingVectorEnv

    dev = _device(model)
    env = G1TrackingVectorEnv(n, motion, differentiable=grad, device=device)
    env.reset(seed=0)
    g = torch.Generator(device=dev).manual_seed(0)  # one stream for both loops, as before
    env_step = _env_stepper(env, n, grad, g, torch.device(device))
    sim_step = _sim_stepper(model, n, grad, g)

    times: dict = {env_step: [], sim_step: []}
    for k in range(steps + 3):
        for fn in (env_step, sim_step) if k % 2 == 0 else (sim_step, env_step):
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            if k >= 3:
                times[fn].append(time.perf_counter() - t0)
    e, m = float(np.median(times[env_step])), float(np.median(times[sim_step]))
    return m / e, e, m


def _best(fn: Callable[[], None], steps: int, repeats: int, dev: torch.device, warmup: int = 2) -> float:
    """Seconds of ``steps`` calls of ``fn``: the best of ``repeats`` blocks (other processes only slow a block)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(max(1, repeats)):
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


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


def _cpu_and_wall(model, n: int, steps: int, grad: bool, **options: object) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of one rollout: CPU / wall says how many cores it kept busy."""
    c0 = time.process_time()
    wall = rollout_time(model, n, steps, grad, **options)[0]
    return time.process_time() - c0, wall


def _alternate(fns: dict[str, Callable[[], object]], rounds: int) -> dict:
    """Best (smallest; of a tuple, by its last entry) value of each timing function over ``rounds`` alternating
    rounds."""
    best: dict = {}
    for _ in range(max(1, rounds)):
        for k, fn in fns.items():
            v = fn()
            if k not in best or (v[-1] if isinstance(v, tuple) else v) < (
                    best[k][-1] if isinstance(best[k], tuple) else best[k]):
                best[k] = v
    return best


def _process_worker(conn, n: int, steps: int) -> None:
    """A process of :class:`_ProcessPair`: loads the model, then times one-thread rollouts of ``n`` environments
    on request ("fwd" / "grad"), until "stop"."""
    torch.set_num_threads(1)
    from bcg.sim import load_model

    model = load_model()
    for grad in (False, True):
        rollout_time(model, n, steps, grad=grad, threads=1)  # the kernels, the pool, the packed launches
    conn.send("ready")
    while (cmd := conn.recv()) != "stop":
        conn.send(rollout_time(model, n, steps, grad=cmd == "grad", threads=1)[0])


class _ProcessPair:
    """Two processes that run the halves of an N-environment rollout at the same time, one thread each: what two
    cores give when nothing is shared but the hardware (the ceiling for the 2-thread split in one process)."""

    def __init__(self, n: int, steps: int):
        self.sizes = (n - n // 2, n // 2)
        self.steps = steps
        self.conns: list = []
        self.procs: list = []

    def __enter__(self) -> _ProcessPair:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fresh interpreter: no inherited Warp or torch state
        for size in self.sizes:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_process_worker, args=(there, size, self.steps), daemon=True)
            proc.start()
            self.conns.append(here)
            self.procs.append(proc)
        for conn in self.conns:
            if conn.recv() != "ready":
                raise RuntimeError("a benchmark worker process failed to start")
        return self

    def rollout(self, grad: bool) -> float:
        """Wall seconds from starting both halves until both have finished."""
        t0 = time.perf_counter()
        for conn in self.conns:
            conn.send("grad" if grad else "fwd")
        for conn in self.conns:
            conn.recv()
        return time.perf_counter() - t0

    def __exit__(self, *exc: object) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send("stop")
            except OSError:
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()


def _max_n(model, steps: int, checkpoint: bool, start: int, limit: int) -> int:
    """Largest N (doubling from ``start``) whose gradient rollout of ``steps`` steps runs; 0 if none does."""
    from bcg.sim import clear_pool

    ok, n = 0, start
    while n <= limit:
        try:
            rollout_time(model, n, steps, grad=True, checkpoint=checkpoint)
        except (RuntimeError, MemoryError) as exc:  # Warp and torch report an allocation failure as RuntimeError
            print(f"#   N = {n}: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
            break
        finally:
            clear_pool(model)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        ok, n = n, 2 * n
    return ok


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="numbers of environments (default 16 64 256 on the CPU, 1024 4096 8192 on CUDA)")
    parser.add_argument("--steps", type=int, default=32, help="control steps per rollout")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timings")
    parser.add_argument("--no-backward", action="store_true", help="skip the gradient rollouts")
    parser.add_argument("--ratio-n", type=int, default=64, help="N of the ratios block (0: skip it)")
    parser.add_argument("--no-env", action="store_true", help="skip the env / bare-simulator ratios")
    parser.add_argument("--max-n", action="store_true", help="search the largest N whose gradient rollout fits")
    parser.add_argument("--max-n-limit", type=int, default=2**20, help="stop the --max-n search here")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch intra-op threads (1: the env's small ops do not spin on a second core that the "
                             "simulator's threads use)")
    parser.add_argument("--markdown", action="store_true", help="also print the README's markdown table")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.torch_threads))

    from bcg.sim import available_cores, execution_options, load_model, thread_count

    cuda = args.device.startswith("cuda")
    sizes = args.sizes or ([1024, 4096, 8192] if cuda else [16, 64, 256])
    model = load_model(device=args.device)
    p = model.params
    sub = args.steps * p.substeps
    opts = execution_options()
    print(f"# bcg simulator throughput: {args.steps} control steps x {p.substeps} substeps (h = {p.dt * 1e3:.1f} ms), "
          f"device {args.device}, torch threads {torch.get_num_threads()}, sim threads "
          f"{opts.threads or f'auto ({available_cores()} cores)'}, checkpoint {opts.checkpoint}", flush=True)
    rollout_time(model, 2, 2, grad=True)  # load the kernels outside the timings
    print(f"{'N':>6} {'fwd [s]':>8} {'fwd+bwd [s]':>11} {'first [s]':>9} {'first/warm':>10} {'pages/warm':>10} "
          f"{'guest/warm':>10} {'kept [MiB]':>10} "
          f"{'RSS [GiB]':>9} {'mujoco [s]':>10} {'fwd/mj':>6} {'(f+b)/mj':>8} {'fwd substeps/s':>14} "
          f"{'f+b substeps/s':>14}")
    results = []
    for n in sizes:
        nan = float("nan")
        first, both, kept, touch, guest = nan, nan, 0, nan, nan
        if not args.no_backward:
            first, kept = rollout_time(model, n, args.steps, grad=True)
            if not cuda:  # right after the first rollout, so that new pages cost what they cost it
                touch, guest = first_touch_time(kept, thread_count(opts, n, args.device))
                _reset_peak_rss()  # the measurement's own pages are not the simulator's (the timings below
                # reuse the first rollout's pool and reach its peak again)
        fns: dict[str, Callable[[], object]] = {"fwd": lambda n=n: rollout_time(model, n, args.steps, grad=False)[0]}
        if not args.no_backward:
            fns["both"] = lambda n=n: rollout_time(model, n, args.steps, grad=True)[0]
        if not cuda:  # MuJoCo only beside CPU runs: on a GPU machine it would spend the lent time on a CPU loop
            fns["mj"] = lambda n=n: _mujoco_time(n, args.steps, p.substeps, p.dt)
        t = _alternate(fns, args.repeats)
        fwd, both, mj = t["fwd"], t.get("both", nan), t.get("mj", nan)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        row = dict(n=n, fwd_s=fwd, fwd_bwd_s=both, first_fwd_bwd_s=first, first_over_warm=first / both,
                   pages_over_warm=touch / both, guest_pages_over_warm=guest / both, kept_mib=kept / 2**20,
                   peak_rss_gib=rss, mujoco_s=mj, fwd_over_mujoco=fwd / mj, fwd_bwd_over_mujoco=both / mj,
                   fwd_substeps_per_s=n * sub / fwd,
                   fwd_bwd_substeps_per_s=n * sub / both)
        results.append(row)
        print(f"{n:>6} {fwd:>8.3f} {both:>11.3f} {first:>9.3f} {first / both:>10.2f} {touch / both:>10.2f} "
              f"{guest / both:>10.2f} {kept / 2**20:>10.0f} "
              f"{rss:>9.2f} {mj:>10.3f} {fwd / mj:>6.2f} {both / mj:>8.2f} {n * sub / fwd:>14.3g} "
              f"{n * sub / both:>14.3g}", flush=True)
    out: dict = dict(device=args.device, steps=args.steps, substeps=p.substeps, dt=p.dt, results=results)

    n = args.ratio_n
    if n and not cuda:
        r = {}
        print(f"\n# ratios at N = {n} (pairs timed alternately, best of {args.repeats} rounds; the goals in "
              "brackets, docs/performance.md)", flush=True)
        mj = float("inf")  # the one-core goals: our one thread against MuJoCo, best over every round of both loops
        with _ProcessPair(n, args.steps) as pair:
            for grad in (False, True) if not args.no_backward else (False,):
                t = _alternate({"1": lambda g=grad: _cpu_and_wall(model, n, args.steps, g, threads=1),
                                "2": lambda g=grad: _cpu_and_wall(model, n, args.steps, g, threads=2),
                                "procs": lambda g=grad: pair.rollout(g),
                                "mj": lambda: _mujoco_time(n, args.steps, p.substeps, p.dt)}, args.repeats)
                mj = min(mj, t["mj"])
                key = "threads_fwd_bwd" if grad else "threads_fwd"
                r[key] = t["1"][1] / t["2"][1]
                r[key + "_cpu_per_wall"] = t["2"][0] / t["2"][1]
                r[key.replace("threads", "processes")] = t["1"][1] / t["procs"]
                r[key.replace("threads", "one_thread") + "_over_mujoco"] = t["1"][1] / mj
                print(f"{'forward + backward' if grad else 'forward           '}, 2 threads / 1 thread (throughput) "
                      f"{r[key]:6.2f}   [>= 1.8]  (2 threads kept {r[key + '_cpu_per_wall']:.2f} cores busy; two "
                      f"processes of N/2 each: {r[key.replace('threads', 'processes')]:.2f}); 1 thread / MuJoCo "
                      f"{t['1'][1] / mj:.2f}   [{'<= 2.5' if grad else '<= 0.7'}]", flush=True)
        if not args.no_backward:
            from bcg.sim import clear_pool, default_runtime

            clear_pool(model)  # a fresh pool: the first checkpointed rollout allocates its one array set per block
            first_ckpt = rollout_time(model, n, args.steps, True, checkpoint=True)[0]
            stored = rollout_time(model, n, args.steps, True, checkpoint=False)
            ckpt = rollout_time(model, n, args.steps, True, checkpoint=True)
            t = _alternate({"s": lambda: rollout_time(model, n, args.steps, True, checkpoint=False)[0],
                            "c": lambda: rollout_time(model, n, args.steps, True, checkpoint=True)[0]}, args.repeats)
            # the scratch every backward runs on, the same for any horizon (not part of kept_bytes)
            pooled = sum(g.nbytes for sets in default_runtime().workspace(model).grad_sets.values() for g in sets)
            r.update(kept_stored_mib=stored[1] / 2**20, kept_checkpoint_mib=ckpt[1] / 2**20,
                     pooled_gradients_mib=pooled / 2**20,
                     checkpoint_time_ratio=t["c"] / t["s"], checkpoint_first_over_warm=first_ckpt / t["c"])
            print(f"kept for backward, {n} x {args.steps} steps: stored forward {r['kept_stored_mib']:.0f} MiB, "
                  f"checkpointed {r['kept_checkpoint_mib']:.2f} MiB   [<= 350 MiB] (plus the pooled gradient sets a "
                  f"backward runs on: {r['pooled_gradients_mib']:.1f} MiB); checkpointed / stored time "
                  f"{r['checkpoint_time_ratio']:.2f}; checkpointed first / warm gradient rollout "
                  f"{r['checkpoint_first_over_warm']:.2f}   [<= 1.2]", flush=True)
        if not args.no_env:
            steps = 10
            for grad in (False, True):
                if grad and args.no_backward:
                    continue
                t = _alternate({"env": lambda g=grad: -env_rate(n, steps, g, 1, args.device),
                                "sim": lambda g=grad: -sim_rate(model, n, steps, g, 1)}, args.repeats)
                key = "env_over_sim_grad" if grad else "env_over_sim"
                r[key] = t["env"] / t["sim"]
                r[key + "_rates"] = (-t["env"], -t["sim"])
                print(f"env / bare sim {'with a backward per step' if grad else 'without gradients      '}   "
                      f"{r[key]:6.2f}   [>= 0.8]  ({-t['env']:.0f} / {-t['sim']:.0f} env steps/s)", flush=True)
                ratio, e, m = env_sim_interleaved(model, n, 20 * max(1, args.repeats), grad, args.device)
                r[key + "_interleaved"] = ratio
                print(f"  the same, steps interleaved          {ratio:6.2f}            (median step: env {e * 1e3:.2f} "
                      f"ms, sim {m * 1e3:.2f} ms)", flush=True)
        out["ratios"], out["ratio_n"] = r, n
    if args.max_n and not args.no_backward:
        start = sizes[-1]
        mx = {c: _max_n(model, args.steps, c, start, args.max_n_limit) for c in (False, True)}
        out["max_n"] = {"stored": mx[False], "checkpoint": mx[True]}
        print(f"\nlargest N whose {args.steps}-step gradient rollout fits (doubling from {start}): stored forward "
              f"{mx[False]}, checkpointed {mx[True]}")
    if args.markdown:
        print("\n" + markdown(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


def markdown(out: dict) -> str:
    """The README's throughput table (and its ratio line) from the results of :func:`main`."""
    lines = ["| N | forward [s] | forward + backward [s] | first gradient rollout [s] | first / warm (1 + new "
             "pages alone: now, guest's part) | kept for backward [MiB] | MuJoCo `mj_step`, same steps [s] | "
             "forward / MuJoCo | (forward + backward) / MuJoCo |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in out["results"]:
        lines.append(f"| {r['n']} | {r['fwd_s']:.3f} | {r['fwd_bwd_s']:.3f} | {r['first_fwd_bwd_s']:.2f} | "
                     f"{r['first_over_warm']:.2f} (1 + {r['pages_over_warm']:.2f}, "
                     f"{r['guest_pages_over_warm']:.2f}) | "
                     f"{r['kept_mib']:.0f} | {r['mujoco_s']:.3f} | {r['fwd_over_mujoco']:.2f} | "
                     f"{r['fwd_bwd_over_mujoco']:.2f} |")
    r = out.get("ratios")
    if r:
        parts = [f"2 / 1 threads {r['threads_fwd']:.2f} (forward)"]
        if "threads_fwd_bwd" in r:
            parts[0] += f", {r['threads_fwd_bwd']:.2f} (forward + backward)"
        if "processes_fwd" in r:
            parts[0] += f" against {r['processes_fwd']:.2f}" + (
                f" / {r['processes_fwd_bwd']:.2f}" if "processes_fwd_bwd" in r else "") + (
                " for two separate one-thread processes of N/2 each")
        if "one_thread_fwd_over_mujoco" in r:
            parts.append(f"one thread / MuJoCo {r['one_thread_fwd_over_mujoco']:.2f} (forward)"
                         + (f", {r['one_thread_fwd_bwd_over_mujoco']:.2f} (forward + backward)"
                            if "one_thread_fwd_bwd_over_mujoco" in r else ""))
            parts.append(f"kept for backward {r['kept_stored_mib']:.0f} MiB stored, {r['kept_checkpoint_mib']:.1f} "
                         f"MiB checkpointed (checkpointed time x{r['checkpoint_time_ratio']:.2f})")
        if "env_over_sim" in r:
            parts.append(f"env / bare simulator {r['env_over_sim']:.2f} without gradients"
                         + (f", {r['env_over_sim_grad']:.2f} with a backward per step" if "env_over_sim_grad" in r
                            else ""))
        lines.append("")
        lines.append(f"Ratios at N = {out['ratio_n']}: " + "; ".join(parts) + ".")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
