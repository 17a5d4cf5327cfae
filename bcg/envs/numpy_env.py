"""A numpy view of the batched G1 environment for Gymnasium's vector wrappers.

Gymnasium's vector wrappers expect numpy arrays, and several (``NormalizeObservation``) accept only the
``NEXT_STEP`` autoreset mode. :class:`NumpyVectorEnv` wraps a :class:`~bcg.envs.vector_env.G1TrackingVectorEnv`
made with ``autoreset=False`` and gives exactly that: numpy observations, rewards and flags, and Gymnasium's
``NEXT_STEP`` autoreset (the step after an episode ended resets that environment, ignores its action and returns
reward 0 and no termination for it). No gradients; one simulator call per step for all environments.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode, VectorEnv

from bcg.envs.vector_env import G1TrackingVectorEnv

__all__ = ["NumpyVectorEnv", "make_numpy_vec"]


def _np(x: Any) -> Any:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


class NumpyVectorEnv(VectorEnv):
    """``G1TrackingVectorEnv`` (``autoreset=False``) as a numpy ``VectorEnv`` with ``AutoresetMode.NEXT_STEP``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50, "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, env: G1TrackingVectorEnv):
        if not isinstance(env, G1TrackingVectorEnv):
            raise TypeError(f"NumpyVectorEnv wraps a G1TrackingVectorEnv, got {type(env).__name__}")
        if env.autoreset:
            raise ValueError("NumpyVectorEnv does the autoreset itself (NEXT_STEP): make the environment with "
                             "autoreset=False, or use bcg.envs.make_numpy_vec")
        if env.differentiable:
            raise ValueError("NumpyVectorEnv needs a non-differentiable environment (differentiable=False)")
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.render_mode = env.render_mode
        self.metadata = dict(self.metadata, render_fps=round(1.0 / env.control_dt))
        self._pending = np.zeros(env.num_envs, dtype=bool)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if isinstance(seed, list):  # Gymnasium passes one seed per environment; the batched env takes one
            seed = seed[0]
        obs, info = self.env.reset(seed=seed, options=options)
        mask = None if options is None else options.get("reset_mask")
        if mask is None:
            self._pending[:] = False
        else:
            self._pending[np.asarray(mask, dtype=bool)] = False
        return _np(obs), {k: _np(v) for k, v in info.items()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        a = torch.as_tensor(np.asarray(actions, dtype=np.float32), device=self.env.device)
        obs, rew, term, trunc, info = self.env.step(a)
        obs, rew, term, trunc = _np(obs), _np(rew).astype(np.float64), _np(term), _np(trunc)
        info = {k: _np(v) for k, v in info.items() if k not in ("final_obs", "_final_obs", "final_critic_obs")}
        if self._pending.any():  # NEXT_STEP: environments that finished last step start a new episode now
            obs_r, info_r = self.env.reset(options={"reset_mask": self._pending})
            obs = np.where(self._pending[:, None], _np(obs_r), obs)
            if "critic_obs" in info and "critic_obs" in info_r:
                info["critic_obs"] = np.where(self._pending[:, None], _np(info_r["critic_obs"]), info["critic_obs"])
            rew = np.where(self._pending, 0.0, rew)
            term = np.where(self._pending, False, term)
            trunc = np.where(self._pending, False, trunc)
        self._pending = term | trunc
        return obs, rew, term, trunc, info

    def render(self) -> np.ndarray | None:
        return self.env.render()

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()


def make_numpy_vec(env_id: str = "BCG-G1-Run-v0", num_envs: int = 8, **kwargs: Any) -> NumpyVectorEnv:
    """``gym.make_vec(env_id, num_envs, autoreset=False, **kwargs)`` as a :class:`NumpyVectorEnv`."""
    from bcg.envs.registration import register_envs

    register_envs()
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", autoreset=False, **kwargs)
    return NumpyVectorEnv(env)
