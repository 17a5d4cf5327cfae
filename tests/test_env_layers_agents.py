"""The env's optional layers (adaptive start sampling, demonstration replay, deviation termination) inside the agents
and the `bcg train` options: exact resume of SHAC with all three on, the start sampler's scores in PPO's state, and
the command-line flags that turn them on."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.agents.shac import SHAC, SHACConfig
from bcg.envs.config import LAYER_FIELDS, EnvConfig


@pytest.fixture(autouse=True)
def _one_torch_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def layered(tmp_path_factory: pytest.TempPathFactory) -> EnvConfig:
    """A 2 s synthetic clip with every layer on and thresholds low enough that each acts within a few windows."""
    path = write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=2.0)
    return EnvConfig.from_kwargs(motion_file=str(path), action_offset="reference", adaptive_start=True,
                                 adaptive_start_bin_s=0.5, adaptive_start_alpha=0.5, replay_threshold=0.03,
                                 termination_anchor_height=0.02, termination_gravity_z=0.05,
                                 termination_end_effector_height=0.05)


def _numbers(m: dict[str, float]) -> list[float]:
    return [m[k] for k in sorted(m)]


def test_shac_resume_with_every_layer_is_exact(layered: EnvConfig) -> None:
    cfg = SHACConfig(num_envs=3, horizon=4, actor_hidden=(16,), critic_hidden=(16,), critic_iterations=2,
                     critic_minibatches=2, max_iterations=10, init_action_std=0.3)

    a = SHAC(cfg, layered, seed=2)
    first = [a.train_iteration() for _ in range(2)]
    assert float(a.env.start_sampler.scores.sum()) > 0  # episodes failed and were recorded
    assert sum(m["replay_rate"] for m in first) > 0  # rows were replayed
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert torch.equal(state["env_layers"]["start_sampler"]["scores"], a.env.start_sampler.scores)
    cont = [_numbers(a.train_iteration()) for _ in range(2)]
    b = SHAC(cfg, layered, seed=5)
    b.load_state_dict(state)
    assert torch.equal(b.env.start_sampler.scores, state["env_layers"]["start_sampler"]["scores"])
    resumed = [_numbers(b.train_iteration()) for _ in range(2)]
    assert cont == resumed
    assert a.env.state.equal(b.env.state) and torch.equal(a.env.start_sampler.scores, b.env.start_sampler.scores)
    # a state saved with the sampler does not load into an agent without it, and the other way round
    plain = SHAC(cfg, EnvConfig.from_kwargs(layered, adaptive_start=False), seed=2)
    assert "env_layers" not in plain.state_dict()
    with pytest.raises(ValueError, match="adaptive start"):
        plain.load_state_dict(state)


def test_ppo_state_carries_the_start_sampler(layered: EnvConfig) -> None:
    from bcg.agents.ppo import PRESETS, PPOAgent

    tiny = dataclasses.replace(PRESETS["cpu-small"], num_envs=4, n_steps=8, n_epochs=1, n_minibatches=2,
                               actor_hidden=(16,), critic_hidden=(16,))
    a = PPOAgent(tiny, layered, seed=0)
    a.train_iteration()
    scores = a.env.start_sampler.scores
    assert float(scores.sum()) > 0
    b = PPOAgent(tiny, layered, seed=1)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.env.start_sampler.scores, scores)
    state = a.state_dict()
    del state["env"]["layers"]  # a state written before the layers existed loads into an agent without them
    PPOAgent(tiny, EnvConfig.from_kwargs(layered, adaptive_start=False), seed=0).load_state_dict(state)


def test_train_flags_reach_the_env_config(capsys: pytest.CaptureFixture) -> None:
    from bcg.agents.train import config_from_dict, config_to_dict, parse_train_args

    cfg = parse_train_args(["--adaptive-start", "--adaptive-start-bin-s", "0.5", "--adaptive-start-alpha", "0.01",
                            "--adaptive-start-floor", "0.2", "--replay-threshold", "0.4",
                            "--termination-anchor-height", "0.25", "--termination-gravity-z", "0.8",
                            "--termination-end-effector-height", "0.25", "--reference-joint-margin", "0.04"])
    env = cfg.env_config().layers
    assert cfg.env_config().reference_joint_margin == 0.04
    assert parse_train_args([]).env_config().reference_joint_margin == 0.0
    assert (env.adaptive_start, env.adaptive_start_bin_s, env.adaptive_start_alpha, env.adaptive_start_floor) == (
        True, 0.5, 0.01, 0.2)
    assert (env.replay_threshold, env.termination_anchor_height, env.termination_gravity_z,
            env.termination_end_effector_height) == (0.4, 0.25, 0.8, 0.25)
    # bcg train's default: randomisation, adaptive starts and BeyondMimic's three terminations; no replay
    default = parse_train_args([]).env_config()
    assert default.domain_randomization and default.layers.adaptive_start and default.layers.replay_threshold is None
    default = default.layers
    assert (default.termination_anchor_height, default.termination_gravity_z,
            default.termination_end_effector_height) == (0.25, 0.8, 0.25)
    assert default.adaptive_start_credit == "end"
    trained = parse_train_args([])
    assert trained.contact_randomization and trained.torque_limit_randomization
    off_flags = ["--no-domain-randomization", "--no-contact-randomization", "--no-torque-limit-randomization",
                 "--no-adaptive-start", "--termination-anchor-height", "None",
                 "--termination-gravity-z", "None", "--termination-end-effector-height", "None"]
    off = parse_train_args(off_flags)
    assert all(getattr(off.env_config().layers, k) == getattr(EnvConfig().layers, k) for k in LAYER_FIELDS)
    assert not off.env_config().domain_randomization
    # runs written before these options (or before they were on by default) had none of them: their configs read
    # back with the layers and the randomisations off
    old = {k: v for k, v in config_to_dict(parse_train_args([])).items()
           if k not in ("layers", "domain_randomization", "contact_randomization", "torque_limit_randomization")}
    assert config_from_dict(old) == off
    assert config_from_dict(config_to_dict(cfg)) == cfg
    from bcg.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--replay-threshold", "-1"])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.replace("\u2502", " ").split())  # tyro boxes and wraps its messages
    assert "replay_threshold must be a finite number > 0" in err
