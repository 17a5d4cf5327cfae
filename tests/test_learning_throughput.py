"""The learning-throughput benchmark on tiny sizes: every part is measured, the timers come off afterwards, and the
arithmetic floor counts what the fit computes."""

from __future__ import annotations

import pytest

from bcg.evaluation.learning_throughput import (
    PHASES,
    _Clock,
    _instrumented,
    _mlp_fit_flops,
    critic_fit_flops,
    measure_ppo,
    measure_shac,
    table,
)

TINY_SHAC = dict(num_envs=2, horizon=3, critic_iterations=2, critic_minibatches=1, actor_hidden=(16,),
                 critic_hidden=(16,))


@pytest.mark.parametrize("method", ["bptt", "bcg"])
def test_shac_parts_are_measured_and_the_timers_removed(method: str) -> None:
    overrides = dict(TINY_SHAC, num_envs=4) if method == "bcg" else TINY_SHAC
    # the fit on the thread (or in this process, serially), where the critic part is timed
    r = measure_shac("cpu-small", method, iterations=2, warmup=1, overrides=overrides, critic_fit_worker="thread")
    p = r["parts"]
    assert set(PHASES) | {"iteration"} == set(p)
    for name in ("sim_fwd", "sim_bwd", "env", "policy", "critic", "backward"):
        assert p[name] > 0, name
    assert p["add"] == 0.0
    assert sum(p[k] for k in PHASES) == pytest.approx(p["iteration"], rel=1e-9)
    assert r["env_window"] > 0 and r["ratio"] == pytest.approx(p["iteration"] / r["env_window"])
    assert r["critic_floor"] > 0 and r["update_threads"] == 1
    assert f"| cpu-small | {method} | {r['num_envs']} x 3 |" in table([r])


def test_a_block_times_consecutive_iterations_per_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    """--block K: K iterations in a row per timing; the parts are per iteration (they still add up to it) and K env
    windows are averaged beside each timing."""
    from bcg.agents.shac import SHAC
    from bcg.evaluation import learning_throughput as lt

    calls = {"train": 0, "window": 0}
    train, window = SHAC.train_iteration, lt._env_window

    def counted(name, fn):
        def wrapper(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(SHAC, "train_iteration", counted("train", train))
    monkeypatch.setattr(lt, "_env_window", counted("window", window))
    r = measure_shac("cpu-small", "bptt", iterations=2, warmup=0, overrides=TINY_SHAC, block=3)
    assert calls == {"train": 6, "window": 6}
    p = r["parts"]
    assert sum(p[k] for k in PHASES) == pytest.approx(p["iteration"], rel=1e-9)
    assert r["block"] == 3 and "| 3 | " in table([r]).splitlines()[2]
    assert r["cpu_iteration"] > 0 and r["cpu_env_window"] > 0
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        measure_shac("cpu-small", "bptt", iterations=1, warmup=0, overrides=TINY_SHAC, block=0)


def test_a_fit_in_a_worker_process_is_timed_by_what_the_iteration_waits_for() -> None:
    """--critic-fit-worker process: the fit runs in the worker (it overlaps on one torch thread), so the critic part
    is 0 and the table says where its time went."""
    from bcg.agents.threads import torch_threads

    with torch_threads(1):
        r = measure_shac("cpu-small", "bptt", iterations=2, warmup=1, overrides=TINY_SHAC, block=2,
                         critic_fit_worker="process")
    p = r["parts"]
    assert r["critic_fit_worker"] == "process" and p["critic"] == 0.0 and p["sim_fwd"] > 0
    assert sum(p[k] for k in PHASES) == pytest.approx(p["iteration"], rel=1e-9)
    text = table([r])
    assert "| cpu-small | bptt (fit in a process) |" in text and "its CPU seconds are not counted" in text
    # the bundles' cost per iteration is compared between rows of the same worker
    sim = p["sim_fwd"] + p["sim_bwd"]
    bundled = dict(p, iteration=2 * p["iteration"], sim_fwd=2 * p["sim_fwd"], sim_bwd=2 * p["sim_bwd"])
    text = table([r, dict(r, method="bcg", parts=bundled)])
    line = next(x for x in text.splitlines() if "SHAC+BCG / SHAC" in x)
    assert line.startswith("cpu-small (fit in a process): SHAC+BCG / SHAC(bptt) per iteration = **2.00**")
    # twice the simulator's work: the ratio its extra part alone would set
    assert line.endswith(f"the simulator's extra work alone would make {1 + sim / p['iteration']:.2f}")
    # a bcg spec (sized bundles) is compared with bptt the same way, under its own name
    spec = "bcg:size=sensitivity,min_branches=2"
    text = table([r, dict(r, method=spec, parts=bundled)])
    assert f"cpu-small (fit in a process): SHAC+{spec} / SHAC(bptt) per iteration = **2.00**" in text


def test_the_timed_transition_still_reports_the_estimators_statistics() -> None:
    """The timer around env.transition_fn must not hide the estimator's per-call statistics (trigger rate)."""
    from bcg.agents.shac import SHAC, SHACConfig
    from bcg.envs.config import EnvConfig
    from bcg.estimators import make

    agent = SHAC(SHACConfig(**TINY_SHAC), EnvConfig(motion_file="jump"), estimator=make("bcg", tau=20.0))
    with _instrumented(agent, _Clock()):
        m = agent.train_iteration()
    assert m["trigger_rate"] > 0  # every environment stands on the ground at a reset: forces above 20 N


def test_instrumentation_times_the_parts_and_comes_off() -> None:
    from bcg.agents.shac import SHAC, SHACConfig
    from bcg.envs.config import EnvConfig
    from bcg.sim import default_runtime

    agent = SHAC(SHACConfig(**TINY_SHAC), EnvConfig(motion_file="jump"))
    rt = default_runtime()
    before = (rt.timer, agent.env.transition_fn, vars(agent.env).get("step"))
    clock = _Clock()
    with _instrumented(agent, clock):
        agent.train_iteration()
    t = clock.take()
    assert {"sim_fwd", "sim_bwd", "env_step", "transition", "policy", "actor_update", "critic"} <= set(t)
    assert t["env_step"] >= t["transition"] >= t["sim_fwd"] > 0
    assert t["actor_update"] >= t["sim_bwd"] > 0
    after = (rt.timer, agent.env.transition_fn, vars(agent.env).get("step"))
    assert after == before and "step" not in vars(agent.env) and "fit" not in vars(agent.critic_fit)
    assert clock.take() == {}


def test_ppo_parts_and_env_rate() -> None:
    r = measure_ppo("cpu-small", iterations=1, warmup=1,
                    overrides=dict(num_envs=4, n_steps=4, n_minibatches=2, actor_hidden=(16,), critic_hidden=(16,)))
    p = r["parts"]
    assert p["train"] > 0 and p["rollout"] > 0 and p["iteration"] >= p["train"] + p["rollout"] - 1e-9
    assert r["samples"] == 16 and r["env_rate"] > 0 and r["samples_per_s"] > 0
    assert r["rate_ratio"] == pytest.approx(r["samples_per_s"] / r["env_rate"])
    assert "| cpu-small | 4 x 4 |" in table([r])


def test_fit_flops_count_forward_weight_and_input_gradients() -> None:
    # 10 -> 4 -> 1: forward 40 + 4 MACs, weight grads the same, input grad of the second layer 4 MACs
    assert _mlp_fit_flops(1, 10, (4,), 1, 1) == 2.0 * (2 * 44 + 4)
    assert critic_fit_flops(8, 10, (4,), 3, 2) == 3 * 8 * 2 * 2.0 * (2 * 44 + 4)


def test_timing_starts_from_a_trained_run_of_another_estimator(tmp_path) -> None:
    """--start loads a bptt run's agent (policy, critics, normalisers, env state) into the bcg agent being timed."""
    from bcg.agents.checkpoint import save_checkpoint
    from bcg.agents.train import build_agent
    from bcg.evaluation.learning_throughput import _shac_config

    trained = build_agent(_shac_config("cpu-small", "bptt", "jump", 0, TINY_SHAC))
    for _ in range(2):
        trained.train_iteration()
    path = save_checkpoint(tmp_path / "iter_000002.pt", agent_state=trained.state_dict(), iteration=2, run_id="t",
                           config={})
    r = measure_shac("cpu-small", "bcg", iterations=1, warmup=0, overrides=TINY_SHAC, start=path)
    assert r["start_iteration"] == 2 and r["method"] == "bcg" and r["parts"]["sim_fwd"] > 0
    assert measure_shac("cpu-small", "bcg", iterations=1, warmup=0, overrides=TINY_SHAC)["start_iteration"] == 0
