"""``bcg train`` / ``bcg export``: the run directory, metrics, checkpoints, Ctrl-C, exact resume, config parsing.

The loop machinery is tested with a small fake agent (the Agent protocol, defined here); exact resume and the export
also with the real SHAC agent on a tiny config (2 environments, windows of 4 steps, 2 + 2 iterations).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import signal
import time

import pytest
import torch

from bcg.agents.base import METRIC_NAMES, Agent
from bcg.agents.checkpoint import CheckpointError, load_checkpoint
from bcg.agents.train import Trainer

# -------------------------------------------------------------------------------------------- a fake agent


class FakeAgent:
    """A random walk w <- w + 0.1 noise with its own generator; metrics are functions of w (exact state: w, the
    generator, the counters)."""

    def __init__(self, seed: int = 0, width: int = 3, interrupt_at: int | None = None, crash_at: int | None = None,
                 interrupt_with: int = signal.SIGINT):
        self.iteration = 0
        self.samples = 0
        self.w = torch.zeros(width, dtype=torch.float64)
        self.gen = torch.Generator().manual_seed(seed)
        self.interrupt_at, self.crash_at, self.interrupt_with = interrupt_at, crash_at, interrupt_with

    def train_iteration(self) -> dict[str, float]:
        if self.crash_at is not None and self.iteration + 1 == self.crash_at:
            raise RuntimeError("simulated crash")
        self.w = self.w + 0.1 * torch.randn(self.w.shape, generator=self.gen, dtype=torch.float64)
        if self.interrupt_at is not None and self.iteration + 1 == self.interrupt_at:
            signal.raise_signal(self.interrupt_with)  # Ctrl-C (or SIGTERM) in the middle of an iteration
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
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN when started in the background
    a, b = tmp_path / "a", tmp_path / "b"
    assert _trainer(a, FakeAgent(), iterations=6, every=0).run() == 0
    assert _trainer(b, FakeAgent(interrupt_at=3), iterations=6, every=0).run() == 130
    err = capsys.readouterr().err
    assert "Ctrl-C" in err and "bcg train --resume" in err
    ck = load_checkpoint(b)
    assert ck.iteration == 3 and len(_rows(b)) == 3  # the interrupted iteration was completed, then saved
    assert _trainer(b, FakeAgent(), iterations=6, every=0, resume=ck).run() == 0
    assert _rows(b) == _rows(a)
    assert signal.getsignal(signal.SIGINT) is before  # the handler was restored to what it was


def test_ctrl_c_test_passes_when_sigint_is_ignored(tmp_path, capsys):
    """Started from a background job SIGINT is ignored; the trainer restores SIG_IGN (the test above must accept
    that rather than insist on default_int_handler)."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        test_ctrl_c_finishes_iteration_checkpoints_and_resumes(tmp_path, capsys)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_sigterm_finishes_iteration_checkpoints_and_resumes(tmp_path, capsys):
    """SIGTERM (a scheduler's or `kill`'s stop) is handled as Ctrl-C: the iteration is finished and checkpointed;
    the status is 143 (128 + SIGTERM) and the run resumes to the same rows."""
    before = signal.getsignal(signal.SIGTERM)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _trainer(a, FakeAgent(), iterations=5, every=0).run() == 0
    assert _trainer(b, FakeAgent(interrupt_at=2, interrupt_with=signal.SIGTERM), iterations=5, every=0).run() == 143
    err = capsys.readouterr().err
    assert "SIGTERM" in err and "bcg train --resume" in err
    ck = load_checkpoint(b)
    assert ck.iteration == 2 and len(_rows(b)) == 2
    assert _trainer(b, FakeAgent(), iterations=5, every=0, resume=ck).run() == 0
    assert _rows(b) == _rows(a)
    assert signal.getsignal(signal.SIGTERM) is before


def test_stale_temporaries_are_removed_and_files_get_one_mode(tmp_path, capsys):
    """A write killed with SIGKILL leaves its temporary file (.NAME.XXXX.tmp); the next start removes it. Checkpoints
    and policy.pt (written through mkstemp, 0600) get the mode of the run's other files (0666 less the umask)."""
    import os

    run = tmp_path / "run"
    assert _trainer(run, FakeAgent(), iterations=2).run() == 0
    stale = [run / "checkpoints" / ".iter_000003.pt.k1ll3d.tmp", run / ".policy.pt.abcd1234.tmp",
             run / ".config.json.tmp"]
    for f in stale:
        f.write_bytes(b"")
    keep = run / "checkpoints" / "notes.tmp"  # not one of ours: no leading dot
    keep.write_text("mine\n")
    assert _trainer(run, FakeAgent(), iterations=3, resume=load_checkpoint(run)).run() == 0
    assert not any(f.exists() for f in stale) and keep.exists()
    assert "left by a write that was killed" in capsys.readouterr().err
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [*run.iterdir(), *(run / "checkpoints").iterdir()]
             if p.is_file()}
    assert set(modes.values()) == {0o666 & ~mask}, modes


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


def test_a_time_limit_alone_runs_past_the_default_iteration_count(tmp_path):
    """`bcg train --max-time-s T` without --iterations stopped at 100 iterations long before T: the limit is time."""
    from bcg.agents.train import DEFAULT_ITERATIONS, parse_train_args

    assert parse_train_args([]).iteration_limit() == DEFAULT_ITERATIONS == 100
    assert parse_train_args(["--max-time-s", "3600"]).iteration_limit() is None
    assert parse_train_args(["--max-time-s", "3600", "--iterations", "7"]).iteration_limit() == 7

    class Slow(FakeAgent):
        def train_iteration(self):
            if self.iteration >= 120:  # the time limit falls after iteration 120
                time.sleep(0.05)
            return super().train_iteration()

    run = tmp_path / "run"
    t = Trainer(Slow(), run_dir=run, config=CONFIG, iterations=None, checkpoint_every=50, max_time_s=0.5,
                progress=False, tensorboard=False, export=False)
    assert t.run() == 0
    n = len(_rows(run))
    assert n > DEFAULT_ITERATIONS and load_checkpoint(run).iteration == n
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[:2] == ["iter_000050.pt", "iter_000100.pt"]


def test_the_trainer_gives_the_agent_the_share_of_its_time_budget_spent(tmp_path):
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args

    class Scheduled(FakeAgent):
        seen: list = []

        def set_schedule_progress(self, fraction):
            self.seen.append(fraction)

    run = tmp_path / "run"
    agent = Scheduled()
    t = Trainer(agent, run_dir=run, config=CONFIG, iterations=5, checkpoint_every=0, max_time_s=1e3,
                schedule_over_time=True, progress=False, tensorboard=False, export=False)
    assert t.run() == 0
    walls = [0.0] + [float(r["wall_time_s"]) / 1e3 for r in _rows(run, drop=())][:-1]
    assert agent.seen == walls  # before iteration k + 1: the time spent after k, over the budget
    with pytest.raises(ValueError, match="needs max_time_s"):
        Trainer(FakeAgent(), run_dir=run, config=CONFIG, iterations=1, schedule_over_time=True)
    # on by default exactly when the run's length is its time budget; a run written before the option stays as it was
    assert parse_train_args(["--max-time-s", "60"]).schedule_follows_time()
    assert not parse_train_args(["--max-time-s", "60", "--iterations", "9"]).schedule_follows_time()
    assert not parse_train_args([]).schedule_follows_time()
    assert parse_train_args(["--max-time-s", "60", "--iterations", "9", "--schedule-over-time", "True"]
                            ).schedule_follows_time()
    with pytest.raises(ValueError, match="needs --max-time-s"):
        parse_train_args(["--schedule-over-time", "True"])
    old = config_to_dict(parse_train_args(["--max-time-s", "60"]))
    del old["schedule_over_time"]
    assert config_from_dict(old).schedule_follows_time() is False


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


def test_friction_range_replaces_the_randomised_friction_and_survives_the_config_file():
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args
    from bcg.agents.train_config import CONTACT_RANDOMIZATION, TORQUE_LIMIT_RANDOMIZATION
    from bcg.envs.randomization import DomainRandomization

    cfg = parse_train_args(["--friction-range", "0.2", "0.8", "--no-contact-randomization"])
    dr = cfg.env_config().domain_randomization
    assert dr.friction == (0.2, 0.8) and dr.torque_limit_scale == (0.85, 1.2) and dr.contact_beta is None
    assert dr.gain_scale == DomainRandomization().gain_scale  # the rest of domain randomisation is kept
    alone = parse_train_args(["--friction-range", "0.2", "0.8", "--no-domain-randomization"])
    dr = alone.env_config().domain_randomization
    assert dr.friction == (0.2, 0.8) and dr.gain_scale is None and dr.observation_noise is False
    # unset: the default ranges, with the ground's and the torque limits' draws that bcg train adds by default
    assert parse_train_args([]).env_config().domain_randomization == dataclasses.replace(
        DomainRandomization(), **CONTACT_RANDOMIZATION, **TORQUE_LIMIT_RANDOMIZATION)
    plain = parse_train_args(["--no-contact-randomization", "--no-torque-limit-randomization"])
    assert plain.env_config().domain_randomization is True
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    d = config_to_dict(parse_train_args([]))
    del d["friction_range"]  # a run recorded before the option existed
    assert config_from_dict(d).friction_range is None


def test_torque_limit_range_replaces_the_torque_limit_draw_only_when_that_draw_is_on():
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args

    cfg = parse_train_args(["--torque-limit-range", "1.0", "1.4"])
    dr = cfg.env_config().domain_randomization
    assert dr.torque_limit_scale == (1.0, 1.4) and dr.contact_beta == (0.1, 0.5) and dr.friction == (0.3, 1.2)
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    d = config_to_dict(parse_train_args([]))
    del d["torque_limit_range"]  # a run recorded before the option existed
    assert config_from_dict(d).torque_limit_range is None
    with pytest.raises(ValueError, match="torque_limit_range is the range of --torque-limit-randomization, which is "
                                         "off"):
        parse_train_args(["--torque-limit-range", "1.0", "1.4", "--no-torque-limit-randomization"])


def test_contact_dropout_range_draws_the_dropout_with_or_without_domain_randomization():
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args

    cfg = parse_train_args(["--contact-dropout-range", "0", "1"])
    dr = cfg.env_config().domain_randomization
    assert dr.dropout_probability == (0.0, 1.0) and dr.contact_beta == (0.1, 0.5) and dr.friction == (0.3, 1.2)
    assert config_from_dict(json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    alone = parse_train_args(["--contact-dropout-range", "0.2", "0.4", "--no-domain-randomization",
                              "--no-contact-randomization", "--no-torque-limit-randomization"])
    dr = alone.env_config().domain_randomization
    assert dr.dropout_probability == (0.2, 0.4) and dr.friction is None and dr.physics_active
    d = config_to_dict(parse_train_args([]))
    del d["contact_dropout_range"]  # a run recorded before the option existed
    assert config_from_dict(d).contact_dropout_range is None


@pytest.mark.parametrize("args, message", [
    (["--iterations", "0"], "iterations must be an integer >= 1, got 0"),
    (["--motion", "moonwalk"], "unknown motion 'moonwalk': expected one of run, jump, fight, dance"),
    (["--estimator", "magic"], "unknown estimator 'magic'; registered: bcg, bptt, grs"),  # + plugins, sorted
    (["--agent", "ppo", "--estimator", "bcg"], "applies to SHAC only"),
    (["--checkpoint-every", "-1"], "checkpoint_every must be an integer >= 0"),
    (["--kappa", "-5"], "kappa must be a finite number > 0"),
    (["--seed", "-1"], "seed must be an integer in"),
    (["--shac.num-envs", "0"], "num_envs"),
    (["--friction-range", "0.8", "0.2"], "friction_range must be two numbers LO HI with 0 < LO <= HI"),
    (["--torque-limit-range", "0", "1.2"], "torque_limit_range must be two numbers LO HI with 0 < LO <= HI"),
    (["--contact-dropout-range", "0.5", "1.5"],
     "contact_dropout_range must be two numbers LO HI with 0 <= LO <= HI <= 1"),
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
    mid = load_checkpoint(part.run_dir / "checkpoints" / "iter_000002.pt").agent_state["env_state"]["memory"]
    assert (mid["bcg.left"] > 0).any()  # the resume starts inside open bundles (their offsets travel too)
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "4", "--no-progress"]) == 0
    rows_full, rows_part = _rows(full.run_dir), _rows(part.run_dir)
    assert len(rows_full) == 4 and rows_part == rows_full
    assert float(rows_full[-1]["trigger_rate"]) >= 0 and int(rows_full[-1]["samples"]) > 4 * 2 * 4  # branches count
    # resuming with another estimator is refused, naming the field
    capsys.readouterr()
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "5", "--estimator", "grs"]) == 2
    assert "estimator.name: checkpoint 'bcg', requested 'grs'" in capsys.readouterr().err

    assert main(["export", str(part.run_dir), "--out", str(tmp_path)]) == 2  # a folder: one line, nothing written
    assert capsys.readouterr().err.strip() == (f"bcg export: error: --out {tmp_path} is a folder; expected the path of "
                                               f"the policy file to write, e.g. {tmp_path / 'policy.pt'}")
    assert not (tmp_path / "policy.pt").exists()
    out = tmp_path / "exported.pt"
    assert main(["export", str(part.run_dir), "--out", str(out)]) == 0
    # a branched run's checkpoints rebuild as any other's (bcg curve and bcg export read them): its config says
    # --branch, which alone (without --resume) is refused
    from bcg.agents.train import checkpoint_export

    assert main(["train", "--resume", str(part.run_dir / "checkpoints" / "iter_000002.pt"), "--branch", "--out",
                 str(tmp_path), "--name", "br", "--iterations", "3", "--no-progress"]) == 0
    assert "tensors" in checkpoint_export(tmp_path / "br" / "checkpoints" / "iter_000003.pt")
    # a checkpoint written before the agent's state had "last_fit" (the overlapped critic fit's losses) still loads
    old = torch.load(part.run_dir / "checkpoints" / "iter_000002.pt", weights_only=True)
    del old["agent"]["last_fit"]
    torch.save(old, tmp_path / "old.pt")
    assert "tensors" in checkpoint_export(tmp_path / "old.pt")
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
    # the file holds the nominal map: no per-environment joint offset (domain randomisation's calibration error)
    no_offset = torch.zeros(agent.env.num_envs, 29)
    assert torch.equal(pol.action_to_target(a, ref_next), agent.env.action_to_target(a, no_offset))
    with pytest.raises(ValueError, match="reference_joint_pos"):
        pol.action_to_target(a)
    # the deployment graph of the same checkpoint (RUN/policy.onnx): the same actions and targets
    from bcg.agents.graph_policy import load_graph_policy

    assert main(["export", str(part.run_dir), "--format", "onnx"]) == 0
    targets, actions = load_graph_policy(part.run_dir / "policy.onnx")(obs, ref_next)
    assert (actions - expected).abs().max() <= 1e-5
    assert (targets - agent.env.action_to_target(expected, no_offset)).abs().max() <= 1e-5


def test_resume_of_a_checkpoint_written_before_a_config_field_existed(tmp_path):
    """A checkpoint whose config lacks a field added since (here contact_randomization, whose default changed from
    off to on) resumes: the field reads back as the run ran it (LEGACY_DEFAULTS), not as '<absent>' against today's
    default, and the continued run keeps that value."""
    from bcg.agents.checkpoint import save_checkpoint
    from bcg.agents.train import parse_train_args, train
    from bcg.cli import main

    part = train(parse_train_args([*TINY, "--iterations", "1", "--out", str(tmp_path), "--name", "old"]))
    assert part.status == 0
    path = part.run_dir / "checkpoints" / "iter_000001.pt"
    ck = load_checkpoint(path)
    assert ck.config["contact_randomization"] is True
    old = {k: v for k, v in ck.config.items() if k != "contact_randomization"}
    save_checkpoint(path, agent_state=ck.agent_state, iteration=ck.iteration, run_id=ck.run_id, config=old,
                    metrics_header=ck.metrics_header, metrics_rows=ck.metrics_rows)
    assert main(["train", "--resume", str(part.run_dir), "--iterations", "2", "--no-progress"]) == 0
    assert json.loads((part.run_dir / "config.json").read_text())["contact_randomization"] is False
    assert len(_rows(part.run_dir)) == 2


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


# -------------------------------------------------------------------------------------------- no run loses data


class PolicyAgent(FakeAgent):
    """A FakeAgent whose exported 'policy' records the iteration it was taken at (train() exports at the end)."""

    def export_policy(self) -> dict:
        return {"format": "bcg-policy", "version": 1, "meta": {"iteration": self.iteration}, "tensors": {}}


def _policy_iteration(path) -> int:
    return json.loads(torch.load(path, weights_only=True)["meta_json"])["iteration"]


def _run(tmp_path, *args, agent=PolicyAgent):
    """``bcg train ARGS`` through parse_train_args and train() with a fake agent (no simulator)."""
    from bcg.agents.train import parse_train_args, train

    cfg = parse_train_args(["--no-progress", "--no-tensorboard", "--eval-every", "0", "--torch-threads", "None",
                            "--out", str(tmp_path), *args])
    return train(cfg, agent_factory=lambda c: agent())


def _snapshot(folder):
    """{relative path: bytes} of every file below ``folder``."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_from_an_older_checkpoint_refuses_naming_the_later_ones(tmp_path):
    from bcg.errors import UserError

    run = _run(tmp_path, "--iterations", "6", "--checkpoint-every", "1", "--name", "run").run_dir
    before = _snapshot(run)
    old = run / "checkpoints" / "iter_000003.pt"
    with pytest.raises(UserError, match=r"iter_000003\.pt is at iteration 3 but .*later checkpoints "
                                        r"\(iter_000004\.pt, iter_000005\.pt, iter_000006\.pt\).*--branch"):
        _run(tmp_path, "--resume", str(old), "--iterations", "4")
    assert _snapshot(run) == before  # nothing deleted, replaced or added
    assert _policy_iteration(run / "policy.pt") == 6


def test_branch_continues_an_older_checkpoint_in_a_new_run_directory(tmp_path):
    run = _run(tmp_path, "--iterations", "6", "--checkpoint-every", "1", "--name", "run").run_dir
    before = _snapshot(run)
    res = _run(tmp_path, "--resume", str(run / "checkpoints" / "iter_000003.pt"), "--iterations", "4", "--branch",
               "--name", "branch")
    assert res.status == 0 and res.run_dir == tmp_path / "branch"
    assert _snapshot(run) == before
    assert _rows(res.run_dir) == _rows(run)[:4]  # the branch repeats the run's iteration 4 exactly
    assert sorted(p.name for p in (res.run_dir / "checkpoints").iterdir()) == ["iter_000004.pt"]
    assert _policy_iteration(res.run_dir / "policy.pt") == 4
    saved = json.loads((res.run_dir / "config.json").read_text())
    assert saved["name"] == "branch" and saved["branch"] is True
    # without --name the branch goes beside the run, named after it and the iteration it starts from
    res2 = _run(tmp_path / "elsewhere", "--resume", str(run / "checkpoints" / "iter_000002.pt"), "--iterations", "3",
                "--branch", "--out", str(run.parent))
    assert res2.run_dir.parent == run.parent and res2.run_dir.name.startswith("run-from-iter2-")
    # and the branch run itself resumes in place (its own checkpoints/), not as another branch
    res3 = _run(tmp_path, "--resume", str(res.run_dir), "--iterations", "5")
    assert res3.run_dir == res.run_dir and _rows(res.run_dir) == _rows(run)[:5]


def test_resume_of_a_checkpoint_outside_a_run_does_not_write_beside_it(tmp_path):
    from bcg.errors import UserError

    run = _run(tmp_path, "--iterations", "4", "--checkpoint-every", "2", "--name", "run").run_dir
    d = tmp_path / "D"
    d.mkdir()
    (d / "ck.pt").write_bytes((run / "checkpoints" / "iter_000004.pt").read_bytes())
    for name in ("config.json", "metrics.csv", "policy.pt"):
        (d / name).write_text(f"the user's own {name}\n")
    before = _snapshot(d)
    with pytest.raises(UserError, match=r"ck\.pt is not in a run's checkpoints/ folder.*--branch"):
        _run(tmp_path, "--resume", str(d / "ck.pt"), "--iterations", "5")
    assert _snapshot(d) == before
    res = _run(tmp_path, "--resume", str(d / "ck.pt"), "--iterations", "5", "--branch", "--name", "from-copy")
    assert res.run_dir == tmp_path / "from-copy" and _rows(res.run_dir) == _rows(run) + _rows(res.run_dir)[4:]
    assert _snapshot(d) == before


def test_name_or_out_with_an_in_place_resume_is_refused(tmp_path):
    from bcg.errors import UserError

    run = _run(tmp_path, "--iterations", "2", "--name", "run").run_dir
    for extra, flag in ((["--name", "other"], "--name other"), (["--out", str(tmp_path / "x")], "--out")):
        with pytest.raises(UserError, match=rf"{flag}.*a resumed run stays in .*run.*--branch"):
            _run(tmp_path, "--resume", str(run), "--iterations", "3", *extra)
    assert json.loads((run / "config.json").read_text())["name"] == "run"
    with pytest.raises(ValueError, match="--branch continues a checkpoint in a new run directory; it needs --resume"):
        _run(tmp_path, "--iterations", "2", "--branch")


def test_motion_file_is_recorded_absolute_with_its_hash(tmp_path, monkeypatch):
    from bcg.agents.train import parse_train_args
    from bcg.errors import UserError
    from bcg.files import file_sha256
    from bcg.motion import load_motion

    clips = tmp_path / "clips"
    clips.mkdir()
    clip = load_motion("jump").save(clips / "myjump.npz")
    monkeypatch.chdir(clips)
    assert parse_train_args(["--motion", "myjump.npz"]).motion == str(clip.resolve())
    run = _run(tmp_path, "--motion", "myjump.npz", "--iterations", "2", "--name", "run").run_dir
    saved = json.loads((run / "config.json").read_text())
    assert saved["motion"] == str(clip.resolve()) and saved["motion_sha256"] == file_sha256(clip)
    monkeypatch.chdir(tmp_path)  # from another folder the run still finds its clip
    assert _run(tmp_path, "--resume", str(run), "--iterations", "3").status == 0
    clip.write_bytes(clip.read_bytes() + b"\0")
    with pytest.raises(UserError, match=r"myjump\.npz has changed since the run recorded it \(sha256 "):
        _run(tmp_path, "--resume", str(run), "--iterations", "4")
    clip.unlink()
    with pytest.raises(ValueError, match=r"motion file '.*myjump\.npz' does not exist"):
        _run(tmp_path, "--resume", str(run), "--iterations", "4")
    assert load_checkpoint(run).iteration == 3


@pytest.mark.parametrize("args, message", [
    (["--device", "foo"], "unknown device 'foo'; expected 'cpu', 'cuda' or 'cuda:K'"),
    (["--out", "FILE"], "--out {tmp}/FILE is a file; expected a folder in which the run directory is made"),
    (["--out", "/proc/no/such"], "cannot create the run directory /proc/no/such/"),
])
def test_run_settings_that_cannot_work_are_refused_before_training(tmp_path, args, message):
    from bcg.errors import UserError

    (tmp_path / "FILE").write_text("a file\n")
    args = [a.replace("FILE", str(tmp_path / "FILE")) for a in args]
    with pytest.raises(UserError, match=message.replace("{tmp}", str(tmp_path)).replace("(", r"\(")):
        _run(tmp_path / "runs", "--iterations", "1", *args)
    assert not (tmp_path / "runs").exists()


def test_cuda_without_a_gpu_is_refused(tmp_path):
    import warp as wp

    from bcg.errors import UserError

    wp.init()
    if wp.is_cuda_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(UserError, match="device 'cuda' requested but Warp finds no CUDA device"):
        _run(tmp_path, "--iterations", "1", "--device", "cuda")


def test_a_taken_run_name_suggests_resume_only_where_there_is_a_checkpoint(tmp_path):
    from bcg.errors import UserError

    (tmp_path / "empty-run").mkdir()
    (tmp_path / "empty-run" / "notes.txt").write_text("not a run\n")
    with pytest.raises(UserError, match=r"empty-run exists and is not empty; choose another --name, or remove it$"):
        _run(tmp_path, "--iterations", "1", "--name", "empty-run")
    _run(tmp_path, "--iterations", "1", "--name", "run")
    with pytest.raises(UserError, match=r"run exists and is not empty; choose another --name, or continue it with "
                                        r"--resume .*run$"):
        _run(tmp_path, "--iterations", "1", "--name", "run")


def test_train_evaluates_only_with_an_evaluator_factory(tmp_path):
    """train() runs the factory's evaluator after iteration 1, every eval_every iterations and after the last
    (the columns hold NaN between); without a factory the run has no evaluation columns, whatever eval_every says.
    `bcg train` and `bcg compare` pass bcg.evaluation.periodic.policy_evaluator."""
    from bcg.agents.train import parse_train_args, train
    from bcg.cli import Train
    from bcg.evaluation.periodic import policy_evaluator

    seen = []

    def factory(cfg):
        def evaluate(agent):
            seen.append(agent.iteration)
            return {"eval_tracking_error_cm": 1.5, "eval_fall_rate": 0.25, "eval_episode_s": 3.0}
        return evaluate

    args = ["--no-progress", "--no-tensorboard", "--torch-threads", "None", "--out", str(tmp_path),
            "--iterations", "5", "--eval-every", "2"]
    run = train(parse_train_args([*args, "--name", "with"]), agent_factory=lambda c: PolicyAgent(),
                evaluator_factory=factory).run_dir
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert seen == [1, 2, 4, 5]
    assert [r["eval_fall_rate"] for r in rows] == ["0.25", "0.25", "nan", "0.25", "0.25"]
    run = train(parse_train_args([*args, "--name", "without"]), agent_factory=lambda c: PolicyAgent()).run_dir
    assert "eval_fall_rate" not in open(run / "metrics.csv").readline()
    cmd = Train.from_cli("bcg train", ["--motion", "run", "--eval-every", "3"])
    assert cmd.config.eval_every == 3 and callable(policy_evaluator(cmd.config))


def test_bcg_train_command_trains_with_the_periodic_evaluation(monkeypatch):
    """`bcg train` (cli.Train.run) hands train() the periodic evaluation of bcg.evaluation.periodic and returns
    the run's status."""
    import types

    from bcg.agents.train import parse_train_args
    from bcg.cli import Train
    from bcg.evaluation import periodic

    calls = []

    def fake_train(cfg, **kwargs):
        calls.append((cfg, kwargs))
        return types.SimpleNamespace(status=143)

    monkeypatch.setattr("bcg.agents.train.train", fake_train)
    cfg = parse_train_args(["--motion", "jump", "--eval-every", "4"])
    assert Train(cfg).run() == 143
    assert len(calls) == 1 and calls[0][0] is cfg
    assert calls[0][1] == {"evaluator_factory": periodic.policy_evaluator}


def test_estimator_spec_syntax_of_bcg_train():
    """`bcg train --estimator name:key=value,...` takes the spec syntax of `bcg compare` and the studies; a later
    --estimator.FIELD overrides the spec's value; a wrong name or parameter is one ValueError naming what exists."""
    from bcg.agents.train import parse_train_args

    cfg = parse_train_args(["--estimator", "bcg:tau=200.0,branches=8", "--estimator.horizon", "3"])
    est = cfg.estimator
    assert (est.name, est.tau, est.branches, est.horizon) == ("bcg", 200.0, 8, 3)
    assert parse_train_args(["--estimator=grs:branches=4"]).estimator.branches == 4
    assert parse_train_args(["--estimator", "bcg"]).estimator.tau == 400.0
    with pytest.raises(ValueError, match="estimator 'bcg' has no parameter.*tauu.*its parameters: "):
        parse_train_args(["--estimator", "bcg:tauu=3"])
    with pytest.raises(ValueError, match="unknown estimator 'bcgx'; registered: .*bcg, bptt, grs"):
        parse_train_args(["--estimator", "bcgx:tau=3"])


def test_agents_are_handed_their_env():
    """SHAC and PPO train on the env they are handed (bcg train builds it: build_agent); an env of the wrong size or
    kind, or both an env and an env_config, is refused with a message that says what is needed."""
    from bcg.agents.ppo import PRESETS as PPO_PRESETS
    from bcg.agents.ppo import PPOAgent
    from bcg.agents.ppo import make_env as make_ppo_env
    from bcg.agents.shac import PRESETS, SHAC, make_env
    from bcg.envs import EnvConfig

    shac_cfg = dataclasses.replace(PRESETS["cpu-small"], num_envs=2, horizon=2)
    env = make_env(shac_cfg, EnvConfig(motion_file="jump"))
    agent = SHAC(shac_cfg, env=env)
    assert agent.env is env and env.transition_fn is agent.estimator
    with pytest.raises(ValueError, match="differentiable, autoresetting env of 3 environments"):
        SHAC(dataclasses.replace(shac_cfg, num_envs=3), env=env)
    with pytest.raises(ValueError, match="an env_config or an env"):
        SHAC(shac_cfg, EnvConfig(), env=env)
    ppo_cfg = dataclasses.replace(PPO_PRESETS["cpu-small"], num_envs=2)
    penv = make_ppo_env(ppo_cfg, EnvConfig(motion_file="jump"))
    assert PPOAgent(ppo_cfg, env=penv).env is penv
    with pytest.raises(ValueError, match="without gradients"):
        PPOAgent(ppo_cfg, env=env)
