"""Learning throughput: where a training iteration's time goes, against the differentiable env's own window.

For SHAC (through ``bptt`` and ``bcg``) and PPO at a preset's sizes, one process builds the agent exactly as
``bcg train`` does, runs warm-up iterations, then alternates timed iterations with timed windows of the bare
differentiable env (same N environments, same N x H steps, random actions, a backward of the reward sum), so that
both see the same machine load. Per iteration it reports, in seconds:

* ``sim_fwd`` / ``sim_bwd``: inside the simulator's autograd function (forward, backward);
* ``estimator``: the env's transition function minus the simulator's forward (branch bookkeeping, perturbations);
* ``env``: ``env.step`` minus its transition function (observation, reward, resets, checks);
* ``policy``: the actor's forward calls during the rollout;
* ``backward``: the actor update minus the simulator's backward (autograd through the policy, the env's torch
  operations and the estimator; the Adam step);
* ``critic``: SHAC's critic fit; ``add``: the ADD discriminator; ``other``: the rest (window-end bookkeeping);

and the ratio ``iteration / env window`` (``--block K``: K iterations in a row per timing, as in training, where
the critic fit runs beside the next window's steps), with the process's CPU seconds of both. For the critic fit it
also prints the floor its arithmetic sets on this machine: the fit's floating-point operations over the
matrix-product rate measured here, with the fit's threads, and ``floor / env = 1 + critic floor / env window``, the
ratio an iteration would have if everything but the env and the critic's arithmetic were free.
PPO is split into SB3's rollout and its ``train()``, and compared with the env's own steps per second without
gradients at the same number of environments.

The timers are the simulator runtime's (``bcg.sim.Runtime.timer``) and wrappers of the agent's parts, for the
duration of the measurement only (:func:`_instrumented`); they cost a few microseconds per call.

    bcg bench --learning                          # cpu-small and paper, bptt / bcg / PPO (about 10 minutes)
    python -m bcg.evaluation.learning_throughput --presets cpu-small --methods bptt bcg --iterations 4
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["PHASES", "branch_physics_ratio", "critic_fit_flops", "main", "matmul_rate", "measure_ppo", "measure_shac"]

PHASES = ("sim_fwd", "sim_bwd", "estimator", "env", "policy", "backward", "critic", "add", "other")
"""Parts of a SHAC iteration, in the order printed."""


class _Clock:
    """Sums of wall time per name; ``wrap`` returns a timed version of a callable."""

    def __init__(self) -> None:
        self.total: dict[str, float] = {}

    def add(self, name: str, dt: float) -> None:
        self.total[name] = self.total.get(name, 0.0) + dt

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed under ``name``; other attributes read through to ``fn`` (an estimator's ``last_stats``)."""
        return _Timed(self, name, fn)

    def take(self) -> dict[str, float]:
        out, self.total = self.total, {}
        return out


class _Timed:
    """A callable that adds its calls' wall time to a :class:`_Clock` and otherwise behaves as the wrapped one."""

    def __init__(self, clock: _Clock, name: str, fn: Callable[..., Any]) -> None:
        self._clock, self._name, self._fn = clock, name, fn

    def __call__(self, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._fn(*a, **k)
        finally:
            self._clock.add(self._name, time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fn, name)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """Set ``obj.name = value`` for the block (instance attribute, settable property or class attribute), then
    restore it."""
    had = name in vars(obj) or isinstance(getattr(type(obj), name, None), property)
    old = getattr(obj, name) if had else None
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def _instrumented(agent: Any, clock: _Clock) -> Iterator[None]:
    """Time the simulator's autograd function, the env step, its transition function, the actor's forward and the
    agent's update parts (SHAC) while the block runs."""
    from bcg.sim import default_runtime

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(default_runtime(), "timer",
                                     lambda kind, dt: clock.add("sim_fwd" if kind == "forward" else "sim_bwd", dt)))
        env = agent.env
        stack.enter_context(_patched(env, "step", clock.wrap("env_step", env.step)))
        stack.enter_context(_patched(env, "transition_fn", clock.wrap("transition", env.transition_fn)))
        if hasattr(agent, "actor"):  # SHAC
            stack.enter_context(_patched(agent.actor, "forward", clock.wrap("policy", agent.actor.forward)))
            stack.enter_context(_patched(agent, "_actor_update", clock.wrap("actor_update", agent._actor_update)))
            fitter = agent.critic_fit
            stack.enter_context(_patched(fitter, "fit", clock.wrap("critic", fitter.fit)))
        else:  # PPO: SB3's rollout and update
            stack.enter_context(_patched(agent.model, "train", clock.wrap("train", agent.model.train)))
        if getattr(agent, "add_reward", None) is not None:
            stack.enter_context(_patched(agent.add_reward, "update", clock.wrap("add", agent.add_reward.update)))
        yield


def _split(t: dict[str, float], iteration: float) -> dict[str, float]:
    """The named parts of one SHAC iteration from the raw timer sums."""
    parts = {
        "sim_fwd": t.get("sim_fwd", 0.0),
        "sim_bwd": t.get("sim_bwd", 0.0),
        "estimator": t.get("transition", 0.0) - t.get("sim_fwd", 0.0),
        "env": t.get("env_step", 0.0) - t.get("transition", 0.0),
        "policy": t.get("policy", 0.0),
        "backward": t.get("actor_update", 0.0) - t.get("sim_bwd", 0.0),
        "critic": t.get("critic", 0.0),
        "add": t.get("add", 0.0),
    }
    parts["other"] = iteration - sum(parts.values())
    return parts


def _env_window(env: Any, steps: int, gen: torch.Generator) -> float:
    """Seconds of one window of the bare differentiable ``env``: ``steps`` steps of random actions (scale 0.3), the
    reward summed over the window, one backward, the graph cut."""
    env.detach()
    t0 = time.perf_counter()
    total = torch.zeros(())
    for _ in range(steps):
        a = (0.3 * torch.randn(env.num_envs, 29, generator=gen)).requires_grad_(True)
        _, rew, *_ = env.step(a)
        total = total + rew.sum()
    total.backward()
    env.detach()
    return time.perf_counter() - t0


def matmul_rate(rows: int, inner: int, cols: int, threads: int, repeats: int = 20) -> float:
    """Floating-point operations per second of ``[rows, inner] @ [inner, cols]`` float32 products with ``threads``
    torch threads (best of ``repeats``)."""
    from bcg.agents.threads import torch_threads

    a, b = torch.randn(rows, inner), torch.randn(inner, cols)
    best = math.inf
    with torch_threads(threads):
        for _ in range(3):
            a @ b
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
    return 2.0 * rows * inner * cols / best


def critic_fit_flops(samples: int, obs_dim: int, hidden: tuple[int, ...], critics: int, passes: int) -> float:
    """Floating-point operations of a critic fit: ``passes`` over ``samples``, each sample through ``critics`` MLPs
    ``obs_dim -> hidden -> 1``: the forward product of every layer, the weight gradient of every layer and the input
    gradient of every layer but the first (2 operations per multiply-add)."""
    return critics * _mlp_fit_flops(samples, obs_dim, hidden, 1, passes)


def _shac_config(preset: str, method: str, motion: str, seed: int, overrides: dict[str, Any]) -> Any:
    from bcg.agents.train import default_config
    from bcg.estimators import make_spec

    cfg = default_config("shac", preset, motion=motion, seed=seed, estimator=make_spec(method))
    if overrides:
        cfg = dataclasses.replace(cfg, shac=dataclasses.replace(cfg.shac, **overrides))
    return cfg


def measure_shac(preset: str, method: str, *, motion: str = "jump", iterations: int = 5, warmup: int = 2,
                 seed: int = 0, overrides: dict[str, Any] | None = None, start: str | Path | None = None,
                 block: int = 1, critic_fit_worker: str = "process", progress: Callable[[str], None] | None = None
                 ) -> dict[str, Any]:
    """Time ``iterations`` SHAC iterations of ``preset`` through estimator ``method``, alternating with windows of
    the bare differentiable env of the same size. Returns medians per iteration (seconds), the env window, their
    ratio, and the critic fit's arithmetic floor.

    ``block``: consecutive iterations per timing (``iterations`` timings, each one's parts divided by ``block``),
    alternating with ``block`` env windows. With 1 the critic fit is joined after every iteration, so its overlap
    with the next window's steps (``bcg train``'s default order) is not counted; with more it runs beside them as in
    training and is joined only at the block's end.

    ``start``: a SHAC run directory or checkpoint of the same preset (any estimator) to start from, so that the
    policy, and with it the contact forces and ``bcg``'s trigger rate, are those of a policy that tracks; the
    estimator's own state is not carried over.

    ``critic_fit_worker``: where the overlapping critic fit runs (``TrainConfig.critic_fit_worker``); with
    ``"process"`` its time is not in the ``critic`` part but in what the iteration waits for it (``other``)."""
    from bcg.agents.shac import make_env
    from bcg.agents.train import build_agent

    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1 (consecutive iterations per timing), got {block!r}")
    cfg = dataclasses.replace(_shac_config(preset, method, motion, seed, overrides or {}),
                              critic_fit_worker=critic_fit_worker)
    agent = build_agent(cfg)
    if start is not None:
        from bcg.agents.checkpoint import load_checkpoint

        state = dict(load_checkpoint(start).agent_state, estimator=None)
        agent.load_state_dict(state)
    start_iteration = agent.iteration
    env = make_env(cfg.shac, cfg.env_config())
    env.reset(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(warmup):
        agent.train_iteration()
        _env_window(env, cfg.shac.horizon, gen)
    clock, rows, windows, triggers, critic_new = _Clock(), [], [], [], []
    cpu_iteration, cpu_window = [], []
    for i in range(iterations):
        with _instrumented(agent, clock):
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(block):
                m = agent.train_iteration()
                triggers.append(float(m["trigger_rate"]))
                critic_new.append(float(m["critic_loss_new"]))
            # a critic fit still running on SHAC's second thread is joined here and counted to the block, so that
            # the env windows below run alone
            agent.sync()
            dt = (time.perf_counter() - t0) / block
            cpu_iteration.append((time.process_time() - c0) / block)
        rows.append({"iteration": dt, **_split({k: v / block for k, v in clock.take().items()}, dt)})
        c0 = time.process_time()
        windows.append(statistics.mean(_env_window(env, cfg.shac.horizon, gen) for _ in range(block)))
        cpu_window.append((time.process_time() - c0) / block)
        if progress:
            progress(f"{preset} {method} {i + 1}/{iterations}: {dt:.3f} s (env window {windows[-1]:.3f} s)")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    c = cfg.shac
    samples = c.num_envs * c.horizon
    rows_per_batch = math.ceil(samples / c.critic_minibatches)
    flops = critic_fit_flops(samples, agent.obs_dim, c.critic_hidden, c.num_critics, c.critic_iterations)
    rate = matmul_rate(rows_per_batch, agent.obs_dim, c.num_critics * (c.critic_hidden or (1,))[0],
                       agent.update_threads)
    window = statistics.median(windows)
    return {
        "agent": "shac", "preset": preset, "method": method, "critic_fit_worker": critic_fit_worker,
        "num_envs": c.num_envs, "horizon": c.horizon,
        "samples": samples, "parts": med, "env_window": window, "ratio": med["iteration"] / window,
        "trigger_rate": statistics.mean(triggers), "critic_loss_new": statistics.mean(critic_new), "block": block,
        # the process's CPU seconds (every thread) per iteration and per env window: the work each does, which other
        # processes on the machine do not move as they move wall time
        "cpu_iteration": statistics.median(cpu_iteration), "cpu_env_window": statistics.median(cpu_window),
        "critic_flops": flops, "matmul_rate": rate, "critic_floor": flops / rate,
        "update_threads": agent.update_threads, "torch_threads": torch.get_num_threads(),
        "start_iteration": start_iteration,
        "critic": {"hidden": list(c.critic_hidden), "critics": c.num_critics, "passes": c.critic_iterations,
                   "minibatches": c.critic_minibatches},
    }


def measure_ppo(preset: str, *, motion: str = "jump", iterations: int = 3, warmup: int = 1, seed: int = 0,
                overrides: dict[str, Any] | None = None,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time PPO iterations (SB3's rollout and ``train()``) at ``preset`` and the env's own no-gradient rate at the
    same number of environments; also the floor that ``train()``'s arithmetic sets (its networks' products over the
    measured matrix-product rate)."""
    from bcg.agents.train import build_agent, default_config
    from bcg.evaluation import sim_throughput

    cfg = default_config("ppo", preset, motion=motion, seed=seed)
    if overrides:
        cfg = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, **overrides))
    agent = build_agent(cfg)
    for _ in range(warmup):
        agent.train_iteration()
    clock, rows = _Clock(), []
    for i in range(iterations):
        with _instrumented(agent, clock):
            t0 = time.perf_counter()
            agent.train_iteration()
            dt = time.perf_counter() - t0
        t = clock.take()
        rows.append({"iteration": dt, "train": t.get("train", 0.0), "rollout": dt - t.get("train", 0.0),
                     "env": t.get("env_step", 0.0)})
        if progress:
            progress(f"{preset} ppo {i + 1}/{iterations}: {dt:.3f} s")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    p = cfg.ppo
    samples = p.num_envs * p.n_steps
    obs_dim = int(agent.env.single_observation_space.shape[0])
    flops = (_mlp_fit_flops(samples, obs_dim, p.actor_hidden, 29, p.n_epochs)
             + _mlp_fit_flops(samples, obs_dim, p.critic_hidden, 1, p.n_epochs))
    threads = getattr(agent, "update_threads", torch.get_num_threads())
    rate = matmul_rate(p.batch_size, obs_dim, p.actor_hidden[0] if p.actor_hidden else 29, threads)
    env_rate = sim_throughput.env_rate(p.num_envs, 24, False, 3, motion=motion)
    return {
        "agent": "ppo", "preset": preset, "method": "ppo", "num_envs": p.num_envs, "horizon": p.n_steps,
        "samples": samples, "parts": med, "samples_per_s": samples / med["iteration"], "env_rate": env_rate,
        "rate_ratio": samples / med["iteration"] / env_rate, "train_flops": flops, "matmul_rate": rate,
        "train_floor": flops / rate, "update_threads": threads,
    }


def _mlp_fit_flops(samples: int, obs_dim: int, hidden: tuple[int, ...], out: int, passes: int) -> float:
    """Operations of ``passes`` forward + backward passes of ``samples`` through one MLP ``obs_dim -> hidden ->
    out`` (forward and weight gradients of every layer, input gradients after the first)."""
    dims = (obs_dim, *hidden, out)
    macs = [dims[i] * dims[i + 1] for i in range(len(dims) - 1)]
    return 2.0 * (2 * sum(macs) + sum(macs[1:])) * samples * passes


def table(results: list[dict[str, Any]]) -> str:
    """Markdown tables of :func:`measure_shac` and :func:`measure_ppo` results."""
    lines = []
    shac = [r for r in results if r["agent"] == "shac"]
    if shac:
        lines += ["| preset | method | N x H | iteration s | " + " | ".join(PHASES) + " | env window s | "
                  "iteration / env | critic floor s | floor / env | trigger rate | iterations per timing | "
                  "CPU s: iteration / env window |",
                  "|---" * (len(PHASES) + 11) + "|"]
        for r in shac:
            p = r["parts"]
            method = r["method"] + (" (fit in a process)" if r["critic_fit_worker"] == "process" else "")
            lines.append(f"| {r['preset']} | {method} | {r['num_envs']} x {r['horizon']} | "
                         f"{p['iteration']:.3f} | " + " | ".join(f"{p[k]:.3f}" for k in PHASES)
                         + f" | {r['env_window']:.3f} | **{r['ratio']:.2f}** | {r['critic_floor']:.3f} | "
                         f"{1 + r['critic_floor'] / r['env_window']:.2f} | {r['trigger_rate']:.3f} | "
                         f"{r['block']} | {r['cpu_iteration']:.3f} / {r['cpu_env_window']:.3f} = "
                         f"{r['cpu_iteration'] / r['cpu_env_window']:.2f} |")
        if any(r["critic_fit_worker"] == "process" for r in shac):
            lines.append("\n(fit in a process: the critic fit runs in the worker, so its time is not in `critic` but "
                         "in what the iteration waits for it, `other`, and its CPU seconds are not counted)")
        by = {(r["preset"], r["critic_fit_worker"], r["method"]): r for r in shac}
        for preset, worker, method in by:
            if method.split(":")[0] == "bcg" and (preset, worker, "bptt") in by:
                b, v = by[(preset, worker, method)], by[(preset, worker, "bptt")]
                where = " (fit in a process)" if worker == "process" else ""
                name = "SHAC+BCG" if method == "bcg" else f"SHAC+{method}"
                lines.append(f"\n{preset}{where}: {name} / SHAC(bptt) per iteration = "
                             f"**{b['parts']['iteration'] / v['parts']['iteration']:.2f}** at trigger rate "
                             f"{b['trigger_rate']:.3f}; the simulator's extra work alone would make "
                             f"{branch_physics_ratio(b, v):.2f}")
    ppo = [r for r in results if r["agent"] == "ppo"]
    if ppo:
        lines += ["", "| preset | PPO N x steps | iteration s | rollout s | train s | train floor s | samples/s | "
                  "env no-grad steps/s | ratio |", "|---" * 9 + "|"]
        for r in ppo:
            p = r["parts"]
            lines.append(f"| {r['preset']} | {r['num_envs']} x {r['horizon']} | {p['iteration']:.3f} | "
                         f"{p['rollout']:.3f} | {p['train']:.3f} | {r['train_floor']:.3f} | "
                         f"{r['samples_per_s']:.0f} | {r['env_rate']:.0f} | **{r['rate_ratio']:.2f}** |")
    return "\n".join(lines)


def branch_physics_ratio(bcg_result: dict[str, Any], bptt_result: dict[str, Any]) -> float:
    """What SHAC+BCG / SHAC per iteration would be if the bundles added only the simulator's work for their branch
    rows (forward and backward), everything else as in SHAC: ``1 + (sim_bcg - sim_bptt) / iteration_bptt`` from
    two :func:`measure_shac` results. The part of the ratio that no bookkeeping can remove at that trigger rate."""
    b, v = bcg_result["parts"], bptt_result["parts"]
    extra = (b["sim_fwd"] + b["sim_bwd"]) - (v["sim_fwd"] + v["sim_bwd"])
    return 1.0 + extra / v["iteration"]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["cpu-small", "paper"])
    ap.add_argument("--methods", nargs="+", default=["bptt", "bcg", "ppo"],
                    help="SHAC estimators (bptt, bcg, grs, ..., or a spec such as bcg:size=sensitivity,min_branches=2) "
                         "and/or ppo")
    ap.add_argument("--motion", default="jump")
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--block", type=int, default=1,
                    help="SHAC: consecutive iterations per timing, the critic fit joined at the block's end only (as "
                         "in training, where it runs beside the next window's steps); 1: joined every iteration")
    ap.add_argument("--critic-fit-worker", choices=("thread", "process"), default="process",
                    help="SHAC: where the overlapping critic fit runs (bcg train --critic-fit-worker)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--start", type=Path, default=None,
                    help="a SHAC run (of each preset timed) to start from: the trigger rate of a policy that tracks")
    args = ap.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or args.block < 1:
        ap.error("--iterations and --block must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.torch_threads)

    def say(msg: str) -> None:
        print(f"[bench --learning] {msg}", file=sys.stderr, flush=True)

    results = []
    for preset in args.presets:
        for method in args.methods:
            if method == "ppo":
                results.append(measure_ppo(preset, motion=args.motion, iterations=max(1, args.iterations // 2),
                                           warmup=min(1, args.warmup), progress=say))
            else:
                results.append(measure_shac(preset, method, motion=args.motion, iterations=args.iterations,
                                            warmup=args.warmup, start=args.start, block=args.block,
                                            critic_fit_worker=args.critic_fit_worker, progress=say))
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
