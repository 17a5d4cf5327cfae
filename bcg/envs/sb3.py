"""stable-baselines3 ``VecEnv`` over the batched G1 environment: one simulator call per step for all environments.

The batched env already resets finished environments inside ``step`` (SAME_STEP autoreset), which is exactly what
SB3 expects: the returned observation is the new episode's first one, and ``infos[i]["terminal_observation"]``
holds the last observation of the finished episode, with ``infos[i]["TimeLimit.truncated"]`` true for time-outs
(clip end or ``max_episode_steps``) and false for falls. Every ``infos[i]`` has ``"tracking_error"``, the
environment's mean body-position error after the step [m].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from bcg.envs.vector_env import G1TrackingVectorEnv

__all__ = ["SB3VecEnv", "make_sb3_vec_env"]


class SB3VecEnv(VecEnv):
    """Adapter from :class:`G1TrackingVectorEnv` (torch, batched) to SB3's numpy ``VecEnv``; runs under no-grad."""

    def __init__(self, env: G1TrackingVectorEnv):
        if env.differentiable:
            raise ValueError("SB3VecEnv needs a non-differentiable environment (differentiable=False)")
        if not env.autoreset:
            raise ValueError("SB3VecEnv needs an environment with autoreset=True")
        self.env = env
        super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
        self.render_mode = env.render_mode
        self._actions: torch.Tensor | None = None
        self._seed: int | None = None
        self._episode_returns = np.zeros(env.num_envs)
        self._episode_lengths = np.zeros(env.num_envs, dtype=np.int64)

    def episode_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the running episode returns [N] and lengths [N] (what a checkpoint saves for an exact resume)."""
        return self._episode_returns.copy(), self._episode_lengths.copy()

    def load_episode_state(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        """Restore :meth:`episode_state`'s output."""
        self._episode_returns = np.array(returns, dtype=np.float64).reshape(self.num_envs)
        self._episode_lengths = np.array(lengths, dtype=np.int64).reshape(self.num_envs)

    def reset(self) -> VecEnvObs:
        seed = self._seed
        self._seed = None
        obs, _ = self.env.reset(seed=seed)
        self._episode_returns[:] = 0
        self._episode_lengths[:] = 0
        self.reset_infos = [{} for _ in range(self.num_envs)]
        return obs.cpu().numpy()

    def step_async(self, actions: np.ndarray) -> None:
        a = np.asarray(actions, dtype=np.float32).reshape(self.num_envs, -1)
        self._actions = torch.as_tensor(a, device=self.env.device)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() called without step_async()")
        with torch.no_grad():
            obs, rew, term, trunc, info = self.env.step(self._actions)
        self._actions = None
        obs_np = obs.cpu().numpy()
        rew_np = rew.cpu().numpy().astype(np.float32)
        term_np, trunc_np = term.cpu().numpy(), trunc.cpu().numpy()
        dones = term_np | trunc_np
        nonfinite = info["nonfinite"].cpu().numpy()
        self._episode_returns += rew_np
        self._episode_lengths += 1
        tracking_error = info["tracking_error"].cpu().numpy()
        infos: list[dict[str, Any]] = [{"tracking_error": float(e)} for e in tracking_error]
        if dones.any():
            final = info["final_obs"].cpu().numpy()
            for i in np.flatnonzero(dones):
                infos[i]["terminal_observation"] = final[i]
                infos[i]["TimeLimit.truncated"] = bool(trunc_np[i] and not term_np[i])
                infos[i]["episode"] = {"r": float(self._episode_returns[i]), "l": int(self._episode_lengths[i])}
                if nonfinite[i]:
                    infos[i]["nonfinite"] = True
            self._episode_returns[dones] = 0
            self._episode_lengths[dones] = 0
        return obs_np, rew_np, dones, infos

    def close(self) -> None:
        self.env.close()

    def seed(self, seed: int | None = None) -> Sequence[None | int]:
        self._seed = seed
        return [seed] * self.num_envs

    def render(self, mode: str | None = None) -> np.ndarray | None:
        return self.env.render()

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [self.env.render()] + [None] * (self.num_envs - 1)

    # The batched env is one object: attributes are shared by all indices.
    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.env, attr_name)] * len(self._get_indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self.env, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        out = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [out] * len(self._get_indices(indices))

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return [False] * len(self._get_indices(indices))

    def _get_indices(self, indices: VecEnvIndices) -> Iterable[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int):
            return [indices]
        return list(indices)


def make_sb3_vec_env(env_id: str = "BCG-G1-Run-v0", num_envs: int = 8, **kwargs: Any) -> SB3VecEnv:
    """``gym.make_vec(env_id, num_envs, vectorization_mode="vector_entry_point", **kwargs)`` wrapped for SB3."""
    from bcg.envs.registration import register_envs

    register_envs()
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    return SB3VecEnv(env.unwrapped if hasattr(env, "unwrapped") else env)
