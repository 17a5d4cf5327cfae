"""The stable-baselines3 adapter: VecEnv protocol, terminal observations and time-limit flags, one simulator call per
step, and a short PPO run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_env_common import write_synthetic_motion

from bcg.envs.sb3 import SB3VecEnv, make_sb3_vec_env


@pytest.fixture(scope="module")
def motion_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_motion(tmp_path_factory.mktemp("motion") / "syn.npz", seconds=0.4)


def test_adapter_protocol_and_infos(motion_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bcg.sim

    venv = make_sb3_vec_env("BCG-G1-Run-v0", num_envs=4, motion_file=str(motion_path))
    assert isinstance(venv, SB3VecEnv) and venv.num_envs == 4
    venv.seed(0)
    obs = venv.reset()
    assert obs.shape == (4, 849) and obs.dtype == np.float32
    calls = []
    real = bcg.sim.step
    monkeypatch.setattr(bcg.sim, "step", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    saw_truncation = False
    for _ in range(25):
        venv.step_async(np.zeros((4, 29), np.float32))
        obs, rew, done, infos = venv.step_wait()
        assert obs.shape == (4, 849) and rew.shape == (4,) and done.shape == (4,)
        for i in np.flatnonzero(done):
            assert infos[i]["terminal_observation"].shape == (849,)
            assert "TimeLimit.truncated" in infos[i]
            saw_truncation |= infos[i]["TimeLimit.truncated"]
    assert calls == [4] * 25  # one batched simulator call per step
    assert saw_truncation  # the 0.4 s clip ends within 25 steps
    assert venv.get_attr("obs_dim") == [849] * 4
    assert venv.env_is_wrapped(object) == [False] * 4


def test_adapter_rejects_differentiable(motion_path: Path) -> None:
    with pytest.raises(ValueError, match="differentiable"):
        make_sb3_vec_env("BCG-G1-Run-v0", num_envs=2, motion_file=str(motion_path), differentiable=True)


def test_ppo_trains_on_the_adapter_and_records_episodes(motion_path: Path) -> None:
    """A short PPO run: SB3's episode records agree with the clip length and our reward range [0, 1] per step, and
    the update changes every policy parameter."""
    from stable_baselines3 import PPO

    torch.manual_seed(0)
    venv = make_sb3_vec_env("BCG-G1-Run-v0", num_envs=4, motion_file=str(motion_path))
    model = PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=2, seed=0, device="cpu",
                policy_kwargs=dict(net_arch=[64, 64]))
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(total_timesteps=256)
    assert model.rollout_buffer.rewards.shape == (64, 4) and model.rollout_buffer.rewards.std() > 0
    episodes = list(model.ep_info_buffer)
    longest = venv.env.num_frames - 1  # an episode starting at frame 0 is truncated at the clip's last frame
    assert longest == 20 and episodes, "the 0.4 s clip ends within 20 steps: SB3 must have recorded episodes"
    for ep in episodes:
        assert 1 <= ep["l"] <= longest and 0 <= ep["r"] <= ep["l"]
    changed = sum(float((p.detach() - b).abs().max()) > 0 for p, b in zip(model.policy.parameters(), before))
    assert changed == len(before)
