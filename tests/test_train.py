"""``bcg train`` / ``bcg export``: the run directory, metrics, checkpoints, Ctrl-C, exact resume, config parsing.

The loop machinery is tested with a small fake agent (the Agent protocol, defined here); exact resume and the export
also with the real SHAC agent on a tiny config (2 environments, windows of 4 steps, 2 + 2 iterations).
"""

from __future__ import annotations

import csv
import json
import math
import signal

import pytest
import torch

from bcg.agents.base import METRIC_NAMES, Agent
from bcg.agents.checkpoint import CheckpointError, load_checkpoint
from bcg.agents.train import Trainer

# -------------------------------------------------------------------------------------------- a fake agent


class FakeAgent:
    """A random walk w <- w + 0.1 noise with its own generator; metrics are functions of w (exact state: w, the
    generator, the counters)."""

    def __init__(self, seed: int = 0, width: int = 3, interrupt_at: int | None = None, crash_at: int | None = None):
        self.iteration = 0
        self.samples = 0
        self.w = torch.zeros(width, dtype=torch.float64)
        self.gen = torch.Generator().manual_seed(seed)
        self.interrupt_at, self.crash_at = interrupt_at, crash_at

    def train_iteration(self) -> dict[str, float]:
        if self.crash_at is not None and self.iteration + 1 == self.crash_at:
            raise RuntimeError("simulated crash")
        self.w = self.w + 0.1 * torch.randn(self.w.shape, generator=self.gen, dtype=torch.float64)
        if self.interrupt_at is not None and self.iteration + 1 == self.interrupt_at:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C in the middle of an iteration
        self.iteration += 1
        self.samples += 32
        m = {k: math.nan for k in METRIC_NAMES}
        m.update(reward=float(self.w.sum()), tracking_error_cm=float(100 * self.w.norm()), grad_norm=float(self.w[0]),
                 skipped_updates=0.0, extra_metric=float(self.w.abs().max()))
        return m

    def state_dict(self) -> dict:
        return {"w": self.w.clone(), "gen": self.gen.get_state(), "iteration": self.iteration, "samples": self.samples}

    def load_state_dict(self, state) -> None:
        self.w = state["w"].clone()
        self.gen.set_state(state["gen"])
        self.iteration, self.samples = int(state["iteration"]), int(state["samples"])

    def export_policy(self) -> dict:
        raise NotImplementedError("the fake agent has no policy")


CONFIG = {"agent": "fake", "seed": 0, "iterations": 6, "checkpoint_every": 2, "estimator": {"name": "bptt"}}


def _trainer(run_dir, agent, iterations=6, every=2, resume=None, config=CONFIG):
    return Trainer(agent, run_dir=run_dir, config={**config, "iterations": iterations}, iterations=iterations,
                   checkpoint_every=every, resume_from=resume, progress=False, tensorboard=True, export=False)


def _rows(run_dir, drop=("wall_time_s",)):
    """metrics.csv rows without the wall time and the evaluation columns (a run evaluates after its own last
    iteration, so an interrupted run has evaluations where the uninterrupted one has none)."""
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if k not in drop and not k.startswith("eval_")} for r in rows]


def test_fake_agent_is_an_agent():
    assert isinstance(FakeAgent(), Agent)


def test_run_directory_and_metrics(tmp_path):
    run = tmp_path / "run"
    assert _trainer(run, FakeAgent(), iterations=5).run() == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002.pt", "iter_000004.pt",
                                                                       "iter_000005.pt"]
    rows = _rows(run, drop=())
    assert [int(r["iteration"]) for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["samples"] == "160"
    header = list(rows[0])
    assert header[:3] == ["iteration", "samples", "wall_time_s"] and set(METRIC_NAMES) <= set(header)
    assert "extra_metric" in header  # the agent's own scalars are logged too
    walls = [float(r["wall_time_s"]) for r in rows]
    assert walls == sorted(walls) and walls[0] >= 0
    assert json.loads((run / "config.json").read_text())["agent"] == "fake"
    versions = json.loads((run / "versions.json").read_text())
    assert {"python", "torch", "warp", "mujoco", "gymnasium", "stable_baselines3", "bcg"} <= set(versions)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert {"reward", "tracking_error_cm", "samples", "extra_metric"} <= set(acc.Tags()["scalars"])
    tb = [e.value for e in acc.Scalars("reward")]
    assert tb == pytest.approx([float(r["reward"]) for r in rows], rel=1e-6)  # float32 in the event file
    ck = load_checkpoint(run)
    assert ck.iteration == 5 and len(ck.metrics_rows) == 5 and ck.config["iterations"] == 5


def test_resume_equals_uninterrupted(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _trainer(a, FakeAgent(), iterations=4).run() == 0
    assert _trainer(b, FakeAgent(), iterations=2).run() == 0
    assert _trainer(b, FakeAgent(seed=123), iterations=4, resume=load_checkpoint(b)).run() == 0
    assert _rows(b) == _rows(a) and len(_rows(a)) == 4
    # wall time keeps counting across the resume
    walls = [float(r["wall_time_s"]) for r in _rows(b, drop=())]
    assert walls == sorted(walls)


def test_resume_after_crash_drops_rows_past_the_checkpoint(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _trainer(a, FakeAgent(), iterations=6).run() == 0
    with pytest.raises(RuntimeError, match="simulated crash"):
        _trainer(b, FakeAgent(crash_at=4), iterations=6).run()
    assert len(_rows(b)) == 3 and load_checkpoint(b).iteration == 2  # row 3 logged, checkpoint at 2
    assert _trainer(b, FakeAgent(), iterations=6, resume=load_checkpoint(b)).run() == 0
    assert _rows(b) == _rows(a)


def test_ctrl_c_finishes_iteration_checkpoints_and_resumes(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert _trainer(a, FakeAgent(), iterations=6, every=0).run() == 0
    assert _trainer(b, FakeAgent(interrupt_at=3), iterations=6, every=0).run() == 130
    err = capsys.readouterr().err
    assert "Ctrl-C" in err and "bcg train --resume" in err
    ck = load_checkpoint(b)
    assert ck.iteration == 3 and len(_rows(b)) == 3  # the interrupted iteration was completed, then saved
    assert _trainer(b, FakeAgent(), iterations=6, every=0, resume=ck).run() == 0
    assert _rows(b) == _rows(a)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler was restored


def test_resume_refuses_other_config_and_state(tmp_path):
    run = tmp_path / "run"
    _trainer(run, FakeAgent(), iterations=2).run()
    ck = load_checkpoint(run)
    other = {**CONFIG, "estimator": {"name": "grs"}, "seed": 1}
    with pytest.raises(CheckpointError, match="estimator.name: checkpoint 'bptt', requested 'grs'") as err:
        _trainer(run, FakeAgent(), iterations=4, resume=ck, config=other).run()
    assert "seed: checkpoint 0, requested 1" in str(err.value)
    with pytest.raises(CheckpointError, match=r"w: checkpoint \(3,\), agent \(5,\)"):
        _trainer(run, FakeAgent(width=5), iterations=4, resume=ck).run()
    with pytest.raises(CheckpointError, match="beyond --iterations"):
        _trainer(run, FakeAgent(), iterations=1, resume=ck).run()


def test_time_limit_stops_after_the_iteration_that_reaches_it(tmp_path):
    run = tmp_path / "run"
    t = Trainer(FakeAgent(), run_dir=run, config=CONFIG, iterations=6, checkpoint_every=0, max_time_s=1e-9,
                progress=False, tensorboard=False, export=False)
    assert t.run() == 0
    assert len(_rows(run)) == 1 and load_checkpoint(run).iteration == 1


def test_missing_metric_refused(tmp_path):
    class Lazy(FakeAgent):
        def train_iteration(self):
            m = super().train_iteration()
            del m["trigger_rate"]
            return m

    with pytest.raises(ValueError, match=r"did not return \['trigger_rate'\]"):
        _trainer(tmp_path / "r", Lazy(), iterations=1).run()


# -------------------------------------------------------------------------------------------- TrainConfig, CLI


def test_parse_presets_and_overrides():
    from bcg.agents.shac import PRESETS
    from bcg.agents.train import parse_train_args

    cfg = parse_train_args(["--shac.num-envs", "3", "--iterations", "7", "--estimator", "bcg", "--estimator.tau",
                            "123", "--motion", "run"])
    assert cfg.shac.num_envs == 3 and cfg.iterations == 7 and cfg.motion == "run"
    assert cfg.estimator.name == "bcg" and cfg.estimator.tau == 123.0
    assert cfg.shac.actor_hidden == PRESETS["cpu-small"].actor_hidden  # the rest of the preset stays
    paper = parse_train_args(["--preset", "paper", "--shac.horizon", "16"])
    assert paper.shac == PRESETS["paper"].__class__(**{**PRESETS["paper"].__dict__, "horizon": 16})
    assert paper.estimator.name == "bptt"
    # flags before and after the estimator's own fields
    cfg2 = parse_train_args(["--estimator.branches", "4", "--estimator=grs", "--seed", "3"])
    assert cfg2.estimator.name == "grs" and cfg2.estimator.branches == 4 and cfg2.seed == 3


def test_config_json_round_trip():
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args

    cfg = parse_train_args(["--estimator", "bcg", "--estimator.tau", "50", "--reward", "add", "--add.hidden", "64",
                            "32", "--shac.actor-hidden", "8", "8"])
    d = json.loads(json.dumps(config_to_dict(cfg)))
    assert d["estimator"]["name"] == "bcg" and d["add"]["hidden"] == [64, 32]
    back = config_from_dict(d)
    assert back == cfg and back.shac.actor_hidden == (8, 8)


@pytest.mark.parametrize("args, message", [
    (["--iterations", "0"], "iterations must be an integer >= 1, got 0"),
    (["--motion", "moonwalk"], "unknown motion 'moonwalk': expected one of run, jump, fight, dance"),
    (["--estimator", "magic"], "unknown estimator 'magic'; registered: bcg, bptt, grs"),  # + plugins, sorted
    (["--agent", "ppo", "--estimator", "bcg"], "applies to SHAC only"),
    (["--checkpoint-every", "-1"], "checkpoint_every must be an integer >= 0"),
    (["--kappa", "-5"], "kappa must be a finite number > 0"),
    (["--seed", "-1"], "seed must be an integer in"),
    (["--shac.num-envs", "0"], "num_envs"),
])
def test_bad_values_refused(args, message, capsys):
    from bcg.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", *args])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.replace("\u2502", " ").split())  # tyro boxes and wraps its messages
    if "registered:" in message:  # installed plugins join the list
        from bcg.estimators import ESTIMATORS

        message = message.replace("bcg, bptt, grs", ", ".join(ESTIMATORS))
    assert message in err, err


def test_help_lists_the_fields(capsys):
    from bcg.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--agent", "--motion", "--preset", "--reward", "--iterations", "--seed", "--out",
                 "--checkpoint-every", "--resume", "--device", "--kappa", "--domain-randomization",
                 "--shac.num-envs", "--shac.actor-lr", "--ppo.", "--add.", "estimator:bcg", "estimator:grs"):
        assert flag in out, flag
    with pytest.raises(SystemExit):
        main(["train", "--estimator", "bcg", "--help"])
    out = capsys.readouterr().out
    assert "--estimator.tau" in out and "--estimator.branches" in out and "--iterations" in out


# -------------------------------------------------------------------------------------------- the real SHAC

TINY = ["--shac.num-envs", "2", "--shac.horizon", "4", "--shac.critic-minibatches", "2", "--shac.actor-hidden", "16",
        "--shac.critic-hidden", "16", "--shac.critic-iterations", "2", "--estimator", "bcg", "--estimator.branches",
        "3", "--estimator.horizon", "3", "--estimator.trigger", "always", "--no-progress", "--checkpoint-every", "0"]


def test_shac_resume_equals_uninterrupted_and_export(tmp_path, capsys):
    """2 + 2 iterations of SHAC+BCG equal 4 uninterrupted, row for row, with bundles open across the checkpoint
    (trigger always, H = 3 over windows of 4 steps); `bcg export` of the run gives the agent's own policy."""
    from bcg.agents.export import load_policy
    from bcg.agents.train import build_agent, config_from_dict, parse_train_args, train
    from bcg.cli import main

    full = train(parse_train_args([*TINY, "--iterations", "4", "--out", str(tmp_path), "--name", "full"]))
    part = train(parse_train_args([*TINY, "--iterations", "2", "--out", str(tmp_path), "--name", "part"]))
    assert full.status == part.status == 0
    assert (part.run_dir / "policy.pt").is_file() and len(_rows(part.run_dir)) == 2
    mid = load_checkpoint(part.run_dir / "checkpoints" / "iter_000002.pt").agent_state["estimator"]["memory"]
    assert mid["open_ids"].numel() > 0  # the resume starts inside open bundles (their offsets travel too)
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "4", "--no-progress"]) == 0
    rows_full, rows_part = _rows(full.run_dir), _rows(part.run_dir)
    assert len(rows_full) == 4 and rows_part == rows_full
    assert float(rows_full[-1]["trigger_rate"]) >= 0 and int(rows_full[-1]["samples"]) > 4 * 2 * 4  # branches count
    # resuming with another estimator is refused, naming the field
    capsys.readouterr()
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "5", "--estimator", "grs"]) == 2
    assert "estimator.name: checkpoint 'bcg', requested 'grs'" in capsys.readouterr().err

    out = tmp_path / "exported.pt"
    assert main(["export", str(part.run_dir), "--out", str(out)]) == 0
    pol = load_policy(out)
    cfg = config_from_dict(json.loads((part.run_dir / "config.json").read_text()))
    agent = build_agent(cfg)
    agent.load_state_dict(load_checkpoint(part.run_dir).agent_state)
    obs = agent.env.observe()
    with torch.no_grad():
        expected = agent.actor.mean_net(agent.obs_rms.frozen().normalize(obs))
    assert torch.equal(pol(obs), expected)
    assert pol.agent == "shac" and pol.motion["name"] == "jump"
    # cpu-small's actions are residuals on the reference: the file's map needs the reference at the next frame
    assert pol.action_offset == "reference"
    a = torch.randn(agent.env.num_envs, 29)
    ref_next = agent.env.ref_features(agent.env.state.frame + 1).joint_pos
    assert torch.equal(pol.action_to_target(a, ref_next), agent.env.action_to_target(a))
    with pytest.raises(ValueError, match="reference_joint_pos"):
        pol.action_to_target(a)
    # the deployment graph of the same checkpoint (RUN/policy.onnx): the same actions and targets
    from bcg.agents.graph_policy import load_graph_policy

    assert main(["export", str(part.run_dir), "--format", "onnx"]) == 0
    targets, actions = load_graph_policy(part.run_dir / "policy.onnx")(obs, ref_next)
    assert (actions - expected).abs().max() <= 1e-5
    assert (targets - agent.env.action_to_target(expected)).abs().max() <= 1e-5


@pytest.mark.slow
def test_ppo_resume_equals_uninterrupted(tmp_path):
    """PPO (stable-baselines3) through the same trainer: 1 + 1 iterations equal 2 (about 20 s on 2 cores)."""
    from bcg.agents.train import parse_train_args, train
    from bcg.cli import main

    tiny = ["--agent", "ppo", "--ppo.num-envs", "4", "--ppo.n-steps", "8", "--ppo.actor-hidden", "16",
            "--ppo.critic-hidden", "16", "--no-progress", "--out", str(tmp_path)]
    full = train(parse_train_args([*tiny, "--iterations", "2", "--name", "full"]))
    part = train(parse_train_args([*tiny, "--iterations", "1", "--name", "part"]))
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "2", "--no-progress"]) == 0
    assert _rows(part.run_dir) == _rows(full.run_dir) and len(_rows(full.run_dir)) == 2
