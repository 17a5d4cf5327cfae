"""PPO baseline on stable-baselines3 (docs/method.md §8): the same batched environment, gradients off.

The environment is :class:`bcg.envs.G1TrackingVectorEnv` behind the SB3 adapter :class:`bcg.envs.sb3.SB3VecEnv`
(one simulator call per step for all environments), wrapped in SB3's ``VecNormalize(norm_obs=True,
norm_reward=False)``. Observations, reward (the env's own, or :class:`bcg.agents.add.ADDReward` installed as
``env.reward_fn``), domain randomisation and termination are the environment's, exactly as SHAC sees them.

What SB3 lacks and this module adds:

* **rsl_rl's adaptive-KL learning rate** (docs/method.md §8.2), after each minibatch. A callback cannot do it: SB3
  calls callbacks per environment step and at rollout boundaries, never between minibatches. So
  :class:`AdaptiveKLPPO` subclasses ``PPO``: its ``train()`` wraps SB3's own (a snapshot of the rollout policy's
  mean network and std is taken first), and the policy (:class:`KLPolicy`) reports every minibatch's action
  distribution from ``evaluate_actions``, which SB3's ``train()`` calls exactly once per minibatch before that
  minibatch's optimiser step. The hook computes the Gaussian KL to the snapshot and sets the optimiser's learning
  rate, as rsl_rl does before its step. ``_update_learning_rate`` (SB3's per-``train()`` schedule) is overridden to
  keep the adaptive value. The rest of SB3's update (clipped surrogate, value clipping, gradient clipping,
  advantage normalisation) is untouched.
* Explicit iterations: :meth:`PPOAgent.train_iteration` is one ``collect_rollouts`` (``n_steps`` per environment)
  and one ``train()``, after a single ``_setup_learn`` at construction.
* The ADD discriminator update at the end of every rollout (:class:`_RolloutCallback`, an SB3 callback).
* An exact, pickle-free ``state_dict`` (policy, optimiser, VecNormalize statistics, environment state, SB3 counters,
  last observation, the global torch / numpy RNG states SB3 samples actions and shuffles minibatches with).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

from bcg.agents.add import ADDConfig, ADDReward
from bcg.agents.base import METRIC_NAMES
from bcg.agents.threads import torch_threads
from bcg.agents.threads import update_threads as resolve_update_threads
from bcg.envs.config import EnvConfig
from bcg.envs.sb3 import SB3VecEnv
from bcg.envs.state import EnvState
from bcg.envs.vector_env import G1TrackingVectorEnv

__all__ = ["PRESETS", "AdaptiveKLPPO", "KLPolicy", "PPOAgent", "PPOConfig", "adaptive_kl_lr", "gaussian_kl", "make_env"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}


@dataclass(frozen=True)
class PPOConfig:
    """PPO settings (defaults: the BCG paper's, docs/method.md §8.1, mapped onto SB3 as in 8.3)."""

    num_envs: int = 4096
    """Parallel environments (one batched simulator call per step)."""
    n_steps: int = 24
    """Rollout length per environment and iteration [control steps]."""
    n_epochs: int = 5
    """Passes over each rollout."""
    n_minibatches: int = 4
    """Minibatches per pass (SB3 ``batch_size`` = num_envs * n_steps / n_minibatches; must divide evenly)."""
    learning_rate: float = 1e-3
    """Initial learning rate (actor and critic share SB3's one Adam optimiser)."""
    adaptive_kl: bool = True
    """rsl_rl's adaptive-KL learning rate after each minibatch; False keeps ``learning_rate`` constant."""
    desired_kl: float = 0.01
    """Target KL* of the adaptive rule: lr / factor when KL > 2 KL*, lr * factor when 0 < KL < KL* / 2."""
    lr_factor: float = 1.5
    """Multiplicative step of the adaptive rule."""
    lr_min: float = 1e-5
    """Lower bound of the adaptive learning rate."""
    lr_max: float = 1e-2
    """Upper bound of the adaptive learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """PPO ratio clip epsilon."""
    clip_range_vf: float | None = 0.2
    """Value clipping around the rollout's values (None: off). SB3 clips the prediction (rsl_rl takes the max of
    the clipped and unclipped losses)."""
    vf_coef: float = 1.0
    """Value loss coefficient."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip over all policy and value parameters (SB3 clips them together)."""
    init_std: float = 0.3
    """Initial action standard deviation (learned, state independent)."""
    actor_hidden: tuple[int, ...] = (512, 256, 128)
    """Hidden widths of the policy MLP."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of the value MLP."""
    activation: str = "elu"
    """Activation of both MLPs: elu, relu, tanh or silu."""
    normalize_advantage: bool = True
    """Normalise advantages per minibatch (SB3's place; rsl_rl normalises over the rollout)."""
    obs_clip: float = 10.0
    """VecNormalize clips normalised observations to +-obs_clip."""
    obs_eps: float = 1e-8
    """VecNormalize's epsilon added to the observation variance."""
    device: str | None = None
    """Torch device of the networks (None: the environment's device)."""

    def __post_init__(self) -> None:
        def count(name: str, lo: int = 1) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"PPOConfig.{name} must be an integer >= {lo}, got {v!r}")

        def positive(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or not (v >= 0 if allow_zero else v > 0):
                raise ValueError(f"PPOConfig.{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, "
                                 f"got {v!r}")

        for name in ("num_envs", "n_steps", "n_epochs", "n_minibatches"):
            count(name)
        batch = self.num_envs * self.n_steps
        if batch % self.n_minibatches:
            raise ValueError(f"PPOConfig: num_envs * n_steps = {batch} is not divisible by n_minibatches = "
                             f"{self.n_minibatches}")
        if batch // self.n_minibatches < 2:
            raise ValueError(f"PPOConfig: minibatches of {batch // self.n_minibatches} sample(s); at least 2 are "
                             "needed (advantage normalisation)")
        for name in ("learning_rate", "desired_kl", "lr_min", "lr_max", "clip_range", "max_grad_norm", "init_std",
                     "obs_clip", "vf_coef"):
            positive(name)
        for name in ("ent_coef", "obs_eps"):
            positive(name, allow_zero=True)
        if self.clip_range_vf is not None:
            positive("clip_range_vf")
        if not self.lr_factor > 1:
            raise ValueError(f"PPOConfig.lr_factor must be > 1, got {self.lr_factor!r}")
        if not self.lr_min <= self.learning_rate <= self.lr_max:
            raise ValueError(f"PPOConfig.learning_rate {self.learning_rate} must lie in [lr_min, lr_max] = "
                             f"[{self.lr_min}, {self.lr_max}]")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"PPOConfig.gamma must be in (0, 1], got {self.gamma!r}")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"PPOConfig.gae_lambda must be in [0, 1], got {self.gae_lambda!r}")
        for name in ("actor_hidden", "critic_hidden"):
            v = getattr(self, name)
            if not (isinstance(v, tuple) and all(isinstance(h, int) and h >= 1 for h in v)):
                raise ValueError(f"PPOConfig.{name} must be a tuple of positive ints, got {v!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"PPOConfig.activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")

    @property
    def batch_size(self) -> int:
        """SB3's minibatch size."""
        return self.num_envs * self.n_steps // self.n_minibatches


PRESETS: dict[str, PPOConfig] = {
    "paper": PPOConfig(),
    "cpu-small": PPOConfig(num_envs=64),
}
"""``paper``: docs/method.md §8.1 (4096 environments); ``cpu-small``: 64 environments, otherwise the same (1536 samples
per iteration; see docs/add_ppo.md for its cost)."""


# ------------------------------------------------------------------------------------------------ adaptive KL


def gaussian_kl(mu_old: torch.Tensor, sigma_old: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """KL(old || new) [B] of diagonal Gaussians [B, A] (or broadcastable), rsl_rl's expression (docs/method.md §8.2):
    sum_j log(sigma_j / sigma_old_j + 1e-5) + (sigma_old_j^2 + (mu_old_j - mu_j)^2) / (2 sigma_j^2) - 1/2."""
    kl = (torch.log(sigma / sigma_old + 1.0e-5)
          + (sigma_old.pow(2) + (mu_old - mu).pow(2)) / (2.0 * sigma.pow(2)) - 0.5)
    return kl.sum(-1)


def adaptive_kl_lr(lr: float, kl: float, desired_kl: float, factor: float = 1.5, lr_min: float = 1e-5,
                   lr_max: float = 1e-2) -> float:
    """rsl_rl's rule: lr / factor (not below lr_min) if kl > 2 desired_kl; lr * factor (not above lr_max) if
    0 < kl < desired_kl / 2; otherwise unchanged."""
    if kl > 2.0 * desired_kl:
        return max(lr_min, lr / factor)
    if 0.0 < kl < desired_kl / 2.0:
        return min(lr_max, lr * factor)
    return lr


class KLPolicy(ActorCriticPolicy):
    """SB3's ``ActorCriticPolicy`` whose ``evaluate_actions`` also hands each minibatch's observations and action
    distribution to ``minibatch_hook`` (set by :class:`AdaptiveKLPPO` during ``train()`` only)."""

    minibatch_hook: Callable[[torch.Tensor, Any], None] | None = None

    def mean_net(self) -> nn.Sequential:
        """The deterministic policy as one ``nn.Sequential`` (normalised observation -> mean action, before the
        env's tanh): ``mlp_extractor.policy_net``'s layers then ``action_net`` (the features extractor flattens a
        1-D observation, i.e. it is the identity)."""
        return nn.Sequential(*self.mlp_extractor.policy_net, self.action_net)

    def evaluate_actions(self, obs: torch.Tensor, actions: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        # SB3's ActorCriticPolicy.evaluate_actions (shared features extractor), plus the hook
        features = self.extract_features(obs)
        latent_pi, latent_vf = self.mlp_extractor(features)
        distribution = self._get_action_dist_from_latent(latent_pi)
        if self.minibatch_hook is not None:
            self.minibatch_hook(obs, distribution)
        log_prob = distribution.log_prob(actions)
        values = self.value_net(latent_vf)
        entropy = distribution.entropy()
        return values, log_prob, entropy


class AdaptiveKLPPO(PPO):
    """SB3 ``PPO`` with rsl_rl's adaptive-KL learning rate after each minibatch and a pre-clipping gradient-norm
    meter. ``kl_rule`` None keeps SB3's schedule."""

    def __init__(self, *args: Any, kl_rule: dict[str, float] | None = None, **kwargs: Any):
        self.kl_rule = kl_rule
        """``{"desired_kl", "factor", "lr_min", "lr_max"}`` or None."""
        self.adaptive_lr = float(kwargs["learning_rate"])
        """The current learning rate of the adaptive rule."""
        self.kl_values: list[float] = []
        """KL of every minibatch of the last ``train()``."""
        self.grad_norms: list[float] = []
        """Gradient norm (all policy parameters, before clipping) of every minibatch of the last ``train()``."""
        super().__init__(*args, **kwargs)
        self._grad_sq: torch.Tensor | float = 0.0
        # the gradient norm before SB3's clip_grad_norm_: sum the squares as backward accumulates each gradient,
        # read and reset just before the optimiser step
        for p in self.policy.parameters():
            p.register_post_accumulate_grad_hook(self._accumulate_grad_sq)
        self.policy.optimizer.register_step_pre_hook(self._read_grad_norm)

    def _accumulate_grad_sq(self, p: torch.Tensor) -> None:
        self._grad_sq = self._grad_sq + p.grad.detach().pow(2).sum()

    def _read_grad_norm(self, *_: Any) -> None:
        self.grad_norms.append(float(torch.as_tensor(self._grad_sq).sqrt()))
        self._grad_sq = 0.0

    def _update_learning_rate(self, optimizers: list[torch.optim.Optimizer] | torch.optim.Optimizer) -> None:
        if self.kl_rule is None:
            super()._update_learning_rate(optimizers)
            return
        self.logger.record("train/learning_rate", self.adaptive_lr)
        self._set_lr(self.adaptive_lr)

    def _set_lr(self, lr: float) -> None:
        for group in self.policy.optimizer.param_groups:
            group["lr"] = lr

    def train(self) -> None:
        self.kl_values, self.grad_norms = [], []
        policy: KLPolicy = self.policy  # type: ignore[assignment]
        if self.kl_rule is None:
            super().train()
            return
        # the rollout policy (the parameters have not changed since the rollout)
        old_mean = copy.deepcopy(nn.Sequential(policy.features_extractor, policy.mean_net())).requires_grad_(False)
        old_std = policy.log_std.detach().exp().clone()
        rule = self.kl_rule

        def hook(obs: torch.Tensor, distribution: Any) -> None:
            with torch.no_grad():
                d = distribution.distribution
                kl = float(gaussian_kl(old_mean(obs), old_std, d.mean, d.stddev).mean())
            self.kl_values.append(kl)
            self.adaptive_lr = adaptive_kl_lr(self.adaptive_lr, kl, rule["desired_kl"], rule["factor"],
                                              rule["lr_min"], rule["lr_max"])
            self._set_lr(self.adaptive_lr)

        policy.minibatch_hook = hook
        try:
            super().train()
        finally:
            policy.minibatch_hook = None


# ------------------------------------------------------------------------------------------------ rollout stats


class _RolloutCallback(BaseCallback):
    """Per-rollout figures from the environment's infos, and the ADD update at the end of each rollout."""

    def __init__(self, add: ADDReward | None):
        super().__init__()
        self.add = add
        self.add_info: dict[str, float] = {}
        self._on_rollout_start()

    def _on_rollout_start(self) -> None:
        self.rewards: list[float] = []
        self.errors: list[float] = []
        self.ep_returns: list[float] = []
        self.ep_lengths: list[int] = []

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        # the rewards before SB3 adds the time-out bootstrap to them (it does so after this call)
        self.rewards.append(float(np.mean(self.locals["rewards"])))
        self.errors.append(float(np.mean([i["tracking_error"] for i in infos])))
        for i in infos:
            ep = i.get("episode")
            if ep is not None:
                self.ep_returns.append(ep["r"])
                self.ep_lengths.append(ep["l"])
        return True

    def _on_rollout_end(self) -> None:
        if self.add is not None:
            self.add_info = self.add.update()


# ------------------------------------------------------------------------------------------------ the agent


def _np_rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.as_tensor(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _set_np_rng_state(s: Mapping[str, Any]) -> None:
    np.random.set_state((s["name"], s["keys"].numpy().astype(np.uint32), int(s["pos"]), int(s["has_gauss"]),
                         float(s["cached_gaussian"])))


def make_env(config: PPOConfig, env_config: EnvConfig) -> G1TrackingVectorEnv:
    """The batched environment PPO is handed: ``config.num_envs`` rows of ``env_config`` without gradients and
    with autoreset (whatever ``differentiable`` / ``autoreset`` say)."""
    return G1TrackingVectorEnv(config.num_envs,
                               config=dataclasses.replace(env_config, differentiable=False, autoreset=True))


class PPOAgent:
    """PPO (stable-baselines3) on the batched G1 environment; implements :class:`bcg.agents.base.Agent`.

    Args:
        config: :class:`PPOConfig` (``PRESETS["paper"]``, ``PRESETS["cpu-small"]``, or your own).
        env_config: the environment (motion, randomisation, reward, ...); PPO runs it without gradients and with
            autoreset, whatever ``differentiable`` / ``autoreset`` say.
        add: the ADD reward's config (None: the environment's own reward, ``env_config.reward``).
        seed: seeds SB3 (network initialisation, action sampling, minibatch shuffling: the global torch and numpy
            generators, as SB3 does), the environment's resets and the ADD discriminator.
        update_threads: torch threads of SB3's ``train()`` (None: :func:`bcg.agents.threads.dense_update_threads`
            of the minibatch size and the two networks' first layers).
        env: the environment to train on, built by the caller (a :class:`G1TrackingVectorEnv` of
            ``config.num_envs`` rows, without gradients, with autoreset; :func:`make_env`), instead of
            ``env_config``.
    """

    def __init__(self, config: PPOConfig, env_config: EnvConfig | None = None, add: ADDConfig | None = None,
                 seed: int = 0, update_threads: int | None = None, *, env: G1TrackingVectorEnv | None = None):
        if not isinstance(config, PPOConfig):
            raise TypeError(f"config must be a PPOConfig, got {type(config).__name__}")
        first = sum(h[0] if h else 1 for h in (config.actor_hidden, config.critic_hidden))
        self.update_threads = resolve_update_threads(update_threads, config.batch_size, first)
        """Torch intra-op threads of SB3's update (the rollout keeps the caller's setting)."""
        if env is not None and env_config is not None:
            raise ValueError("PPOAgent takes an env_config or an env, not both")
        self.config = config
        self.seed = int(seed)
        if env is None:
            env = make_env(config, env_config if env_config is not None else EnvConfig())
        elif not isinstance(env, G1TrackingVectorEnv):
            raise TypeError(f"env must be a bcg.envs.G1TrackingVectorEnv, got {type(env).__name__}")
        elif env.num_envs != config.num_envs or env.differentiable or not env.autoreset:
            raise ValueError(f"PPO needs an autoresetting env of {config.num_envs} environments (the config's "
                             f"num_envs) without gradients, got num_envs={env.num_envs}, "
                             f"differentiable={env.differentiable}, autoreset={env.autoreset} "
                             "(bcg.agents.ppo.make_env builds one)")
        self.env_config = env.config
        self.env = env
        """The batched environment."""
        self.add: ADDReward | None = None
        if add is not None:
            self.add = ADDReward(self.env, add, seed=self.seed)
            self.env.reward_fn = self.add
        self.sb3_env = SB3VecEnv(self.env)
        self.vec_normalize = VecNormalize(self.sb3_env, norm_obs=True, norm_reward=False, clip_obs=config.obs_clip,
                                          epsilon=config.obs_eps, gamma=config.gamma)
        device = config.device if config.device is not None else str(self.env.device)
        kl_rule = (dict(desired_kl=config.desired_kl, factor=config.lr_factor, lr_min=config.lr_min,
                        lr_max=config.lr_max) if config.adaptive_kl else None)
        self.model = AdaptiveKLPPO(
            KLPolicy, self.vec_normalize, kl_rule=kl_rule,
            n_steps=config.n_steps, batch_size=config.batch_size, n_epochs=config.n_epochs,
            learning_rate=config.learning_rate, gamma=config.gamma, gae_lambda=config.gae_lambda,
            clip_range=config.clip_range, clip_range_vf=config.clip_range_vf,
            normalize_advantage=config.normalize_advantage,
            vf_coef=config.vf_coef, ent_coef=config.ent_coef, max_grad_norm=config.max_grad_norm,
            policy_kwargs=dict(net_arch=dict(pi=list(config.actor_hidden), vf=list(config.critic_hidden)),
                               activation_fn=_ACTIVATIONS[config.activation], log_std_init=math.log(config.init_std)),
            seed=self.seed, device=device, verbose=0,
        )
        # SB3's logger without outputs: train() records its figures there and we read them (the trainer logs)
        self.model.set_logger(Logger(folder=None, output_formats=[]))
        self._callback_obj = _RolloutCallback(self.add)
        # one setup for the whole run (it resets the env with the seed); iterations are then explicit
        self._total_timesteps, self._callback = self.model._setup_learn(2**62, self._callback_obj,
                                                                        reset_num_timesteps=True)
        self._callback.on_training_start(locals(), globals())
        self.iteration = 0
        """Iterations completed."""

    @property
    def samples(self) -> int:
        """Environment steps consumed so far (SB3's ``num_timesteps``)."""
        return int(self.model.num_timesteps)

    # ------------------------------------------------------------------------------------------------ iterate

    def train_iteration(self) -> dict[str, float]:
        """One SB3 iteration: a rollout of ``n_steps`` per environment (ADD update at its end), then ``train()``."""
        m, cb = self.model, self._callback_obj
        if not m.collect_rollouts(m.env, self._callback, m.rollout_buffer, n_rollout_steps=m.n_steps):
            raise RuntimeError("SB3 stopped the rollout early (a callback returned False)")
        m._update_current_progress_remaining(m.num_timesteps, self._total_timesteps)
        with torch_threads(self.update_threads):
            m.train()
        logged = dict(m.logger.name_to_value)
        m.logger.dump(m.num_timesteps)  # clears SB3's record (no outputs configured)
        self.iteration += 1
        nan = float("nan")
        out: dict[str, float] = dict.fromkeys(METRIC_NAMES, nan)
        out.update(
            reward=float(np.mean(cb.rewards)),
            tracking_error_cm=100.0 * float(np.mean(cb.errors)),
            episode_return=float(np.mean(cb.ep_returns)) if cb.ep_returns else nan,
            episode_length=float(np.mean(cb.ep_lengths)) if cb.ep_lengths else nan,
            trigger_rate=0.0,
            grad_norm=float(np.mean(m.grad_norms)) if m.grad_norms else nan,
            skipped_updates=0.0,
            nonfinite_resets=float(self.env.nonfinite_count),
            actor_loss=float(logged.get("train/policy_gradient_loss", nan)),
            critic_loss=float(logged.get("train/value_loss", nan)),
            lr=float(m.policy.optimizer.param_groups[0]["lr"]),
            approx_kl=float(logged.get("train/approx_kl", nan)),
            kl=float(np.mean(m.kl_values)) if m.kl_values else nan,
            clip_fraction=float(logged.get("train/clip_fraction", nan)),
            entropy_loss=float(logged.get("train/entropy_loss", nan)),
            explained_variance=float(logged.get("train/explained_variance", nan)),
            action_std=float(logged.get("train/std", nan)),
            episodes=float(len(cb.ep_returns)),
        )
        out.update(cb.add_info)
        return out

    # ------------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything to continue exactly; tensors and plain values only (``torch.load(weights_only=True)``)."""
        m, vn = self.model, self.vec_normalize
        ep_returns, ep_lengths = self.sb3_env.episode_state()
        return {
            "agent": "ppo",
            "config": asdict(self.config),
            "iteration": self.iteration,
            "policy": {k: v.detach().clone() for k, v in m.policy.state_dict().items()},
            "optimizer": m.policy.optimizer.state_dict(),
            "adaptive_lr": float(m.adaptive_lr),
            "num_timesteps": int(m.num_timesteps),
            "n_updates": int(m._n_updates),
            "episode_num": int(m._episode_num),
            "last_obs": torch.as_tensor(np.array(m._last_obs)),
            "last_episode_starts": torch.as_tensor(np.array(m._last_episode_starts, dtype=bool)),
            "vec_normalize": {
                "obs_mean": torch.as_tensor(vn.obs_rms.mean.copy()), "obs_var": torch.as_tensor(vn.obs_rms.var.copy()),
                "obs_count": float(vn.obs_rms.count),
                "ret_mean": float(vn.ret_rms.mean), "ret_var": float(vn.ret_rms.var),
                "ret_count": float(vn.ret_rms.count), "returns": torch.as_tensor(vn.returns.copy()),
            },
            "env": {
                "state": self.env.state.saved(),
                "nonfinite_count": int(self.env.nonfinite_count),
                "reset_generator": self.env.reset_generator.get_state(),
                "layers": self.env.layers_state_dict(),
                "episode_returns": torch.as_tensor(ep_returns),
                "episode_lengths": torch.as_tensor(ep_lengths),
            },
            "rng": {"torch": torch.get_rng_state(), "numpy": _np_rng_state()},
            "add": None if self.add is None else self.add.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output into this agent (made with the same config)."""
        if state.get("agent") != "ppo":
            raise ValueError(f"not a PPO agent state (agent = {state.get('agent')!r})")
        mine = asdict(self.config)
        theirs = dict(state["config"])
        diff = {k: (theirs.get(k), v) for k, v in mine.items()
                if k in ("num_envs", "actor_hidden", "critic_hidden", "activation") and
                (tuple(theirs.get(k)) if isinstance(v, tuple) else theirs.get(k)) != v}
        if diff:
            raise ValueError(f"the PPO state was made with a different network or env count: "
                             f"{ {k: f'{a} (state) vs {b} (this agent)' for k, (a, b) in diff.items()} }")
        if (state["add"] is None) != (self.add is None):
            raise ValueError("the PPO state and this agent disagree on the ADD reward "
                             f"(state: {'ADD' if state['add'] is not None else 'env reward'}, agent: "
                             f"{'ADD' if self.add is not None else 'env reward'})")
        m, vn = self.model, self.vec_normalize
        m.policy.load_state_dict(state["policy"])
        m.policy.optimizer.load_state_dict(state["optimizer"])
        m.adaptive_lr = float(state["adaptive_lr"])
        m.num_timesteps = int(state["num_timesteps"])
        m._n_updates = int(state["n_updates"])
        m._episode_num = int(state["episode_num"])
        m._last_obs = state["last_obs"].numpy().copy()
        m._last_episode_starts = state["last_episode_starts"].numpy().copy()
        v = state["vec_normalize"]
        vn.obs_rms.mean = v["obs_mean"].numpy().astype(np.float64).copy()
        vn.obs_rms.var = v["obs_var"].numpy().astype(np.float64).copy()
        vn.obs_rms.count = float(v["obs_count"])
        vn.ret_rms.mean, vn.ret_rms.var = np.float64(v["ret_mean"]), np.float64(v["ret_var"])
        vn.ret_rms.count = float(v["ret_count"])
        vn.returns = v["returns"].numpy().copy()
        e = state["env"]
        self.env.load_state(EnvState.from_saved(e["state"], self.env.model, self.env.device))
        self.env.nonfinite_count = int(e["nonfinite_count"])
        self.env.reset_generator.set_state(e["reset_generator"])
        self.env.load_layers_state_dict(e.get("layers", {}))  # states saved before the layers existed have none
        self.sb3_env.load_episode_state(e["episode_returns"].numpy(), e["episode_lengths"].numpy())
        if self.add is not None:
            self.add.load_state_dict(state["add"])
        torch.set_rng_state(state["rng"]["torch"])
        _set_np_rng_state(state["rng"]["numpy"])
        self.iteration = int(state["iteration"])

    # ------------------------------------------------------------------------------------------------ export

    def export_policy(self) -> dict[str, Any]:
        """The deterministic policy (SB3's mean action, before the env's tanh; SB3's own rollouts also clip the
        action to [-1, 1] first) with VecNormalize's observation statistics, via
        :func:`bcg.agents.export.policy_export`."""
        from bcg.agents.export import policy_export

        policy: KLPolicy = self.model.policy  # type: ignore[assignment]
        net = copy.deepcopy(policy.mean_net()).cpu()
        vn = self.vec_normalize
        return policy_export(net, torch.as_tensor(vn.obs_rms.mean.copy()), torch.as_tensor(vn.obs_rms.var.copy()),
                             obs_eps=float(vn.epsilon), obs_clip=float(vn.clip_obs), env=self.env, agent="ppo")
