"""The standard single Gymnasium environment (numpy float32), ``gym.make("BCG-G1-Run-v0")`` and siblings.

It holds a :class:`~bcg.envs.vector_env.G1TrackingVectorEnv` with one environment, no autoreset and no gradients,
and converts at the boundary. Everything about observations, rewards and episodes is the vector env's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from bcg.envs.config import EnvConfig
from bcg.envs.vector_env import G1TrackingVectorEnv

__all__ = ["G1TrackingEnv"]


class G1TrackingEnv(gym.Env):
    """One G1 tracking environment with numpy observations [obs_dim] float32 and ``Box(-1, 1, (29,))`` actions.

    Takes the options of :class:`~bcg.envs.config.EnvConfig` (as ``config=`` and / or keywords) except
    ``differentiable`` and ``autoreset``. ``render_mode="rgb_array"`` renders the robot and its reference ghost
    offscreen.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, motion_file: Any = None, render_mode: str | None = None, *, config: EnvConfig | None = None,
                 default_motion: str = "run", **kwargs: Any):
        for k in ("num_envs", "differentiable", "autoreset"):
            if k in kwargs:
                raise TypeError(f"G1TrackingEnv does not take {k!r} (use gym.make_vec for batched environments)")
        self.vec = G1TrackingVectorEnv(1, motion_file, config=config, default_motion=default_motion,
                                       render_mode=render_mode, autoreset=False, differentiable=False, **kwargs)
        self.render_mode = render_mode
        self.metadata = dict(self.metadata, render_fps=round(1.0 / self.vec.control_dt))
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space

    @property
    def motion(self):
        return self.vec.motion

    @property
    def model(self):
        return self.vec.model

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is None and self.vec._np_random is None:
            seed = int(self.np_random.integers(2**31))
        obs, info = self.vec.reset(seed=seed, options=options)
        return obs[0].cpu().numpy(), self._info(info)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.action_space.shape:
            raise ValueError(f"action must have shape {self.action_space.shape}, got {a.shape}")
        obs, rew, term, trunc, info = self.vec.step(torch.as_tensor(a[None], device=self.vec.device))
        info = self._info(info)
        for k in ("final_obs", "_final_obs", "final_critic_obs"):
            info.pop(k, None)
        if bool(trunc[0]):
            info["TimeLimit.truncated"] = True
        return obs[0].cpu().numpy(), float(rew[0]), bool(term[0]), bool(trunc[0]), info

    @staticmethod
    def _info(info: dict) -> dict:
        out = {}
        for k, v in info.items():
            if isinstance(v, torch.Tensor):
                v = v[0].detach().cpu().numpy()
                out[k] = v.item() if v.ndim == 0 else v
            else:
                out[k] = v
        return out

    def render(self) -> np.ndarray | None:
        return self.vec.render()

    def close(self) -> None:
        self.vec.close()
