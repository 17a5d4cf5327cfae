"""SHAC: Short-Horizon Actor-Critic (Xu et al., ICLR 2022) through a pluggable gradient estimator.

A single-file reference implementation (docs/method.md §5), read top to bottom:

1. :class:`SHACConfig` (the paper's settings as defaults) and :data:`PRESETS`;
2. the **rollout** of one window: N control steps of E environments through the configured estimator (``bptt``,
   ``grs``, ``bcg``, ...), accumulating the actor loss with its critic bootstrap;
3. the **losses**: the actor loss (built during the rollout), the TD(lambda) critic targets and the critic loss;
4. the **update**: actor step, critic regression, target critics, the ADD discriminator, metrics;
5. the exact state (``state_dict`` / ``load_state_dict``) and the policy export.

One iteration (``train_iteration``) is one window: the environment state is detached at the window start (no
gradient crosses windows), the observation normaliser is frozen for the window while its running statistics keep
updating, the actor is differentiated through the simulator over the window, then the critics regress TD(lambda)
targets of the same window.

Guards (docs/method.md §10.2, R1/R2): an actor or critic step whose gradient norm before clipping is non-finite or above
``SHACConfig.skip_grad_norm`` is skipped (never applied) and counted; environments whose state became non-finite
are reset by the environment (reward 0, terminated, gradient blocked) and counted from ``info["num_unstable"]``;
a time-out's bootstrap value is 0 when its pre-reset observation is non-finite or beyond ``max_bootstrap_obs``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from bcg.agents.critic_fit import CriticFitRunner, guarded_step
from bcg.agents.networks import ACTIVATIONS, CriticEnsemble, GaussianActor
from bcg.agents.normalization import FrozenNormalizer, RunningMeanStd
from bcg.agents.threads import update_threads as resolve_update_threads
from bcg.envs.config import EnvConfig

__all__ = ["PRESETS", "SHAC", "SHACConfig", "STATE_FORMAT", "check_env", "make_env", "td_lambda_targets"]

STATE_FORMAT = "bcg.shac/2"
"""Format of :meth:`SHAC.state_dict` (2: the critics stacked per layer; states of format 1, with K separate critic
modules, are converted on load)."""


# ==================================================================================================== 1. config


@dataclass(frozen=True)
class SHACConfig:
    """Options of SHAC (defaults: docs/method.md §5.3, BCG's SHAC table; §5.4's SAPO conventions where it is silent)."""

    num_envs: int = 64
    """E, parallel environments (BCG: 64 for SHAC+BCG, 128 for vanilla SHAC)."""
    horizon: int = 32
    """N, control steps per window (one iteration = one window; gradients never cross windows)."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """lambda of the TD(lambda) critic targets."""
    actor_lr: float = 5e-3
    """Initial actor learning rate."""
    critic_lr: float = 2e-3
    """Initial critic learning rate."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """"linear": lr_e = lr_0 + (final_lr - lr_0) min(e / max_iterations, 1) for actor and critic; "constant"."""
    final_lr: float = 1e-5
    """Learning rate reached at max_iterations by the linear schedule."""
    max_iterations: int = 3000
    """Length of the learning-rate schedule in iterations (BCG trains 3000)."""
    betas: tuple[float, float] = (0.7, 0.95)
    """Adam (beta1, beta2) of both optimisers."""
    num_critics: int = 3
    """Critics in the ensemble. Critic targets bootstrap with the min over the critics, the actor with the mean."""
    target_critic_alpha: float = 0.995
    """Polyak weight of the old target critics, phi' <- alpha phi' + (1 - alpha) phi after every iteration (DiffRL
    humanoid: 0.995). 0 means no target critic (SAPO): the bootstrap is the critics as they were at the window
    start."""
    critic_iterations: int = 16
    """Passes of critic regression over the window's N * E samples per iteration."""
    critic_minibatches: int = 4
    """Contiguous minibatches per pass (no shuffling, as DiffRL)."""
    actor_grad_norm: float = 1.0
    """Global gradient-norm clip of the actor."""
    critic_grad_norm: float = 10.0
    """Global gradient-norm clip of the critics."""
    skip_grad_norm: float = 1e6
    """An actor or critic step whose gradient norm before clipping is non-finite or above this is skipped and
    counted (skipped_updates), never applied."""
    init_action_std: float = 1.0
    """Initial standard deviation of the Gaussian action noise (learned, state-independent)."""
    actor_output_scale: float = 1.0
    """Factor on the initial weights and biases of the actor's output layer (1: PyTorch's default initialisation,
    as DiffRL; smaller values start from mean actions near 0, i.e. PD targets near the default pose)."""
    obs_norm: bool = True
    """Normalise observations with running mean / std (frozen inside a window)."""
    obs_clip: float | None = 10.0
    """Bound of the normalised observations (None: unbounded)."""
    obs_eps: float = 1e-5
    """Added to the observation variance before the square root."""
    ret_norm: bool = True
    """Divide rewards by the running std of the discounted return, sqrt(Var[ret] + 1e-6); the actor loss is scaled
    back by the same factor (DiffRL's ret_rms)."""
    rew_scale: float = 1.0
    """Constant factor on the environment reward."""
    max_bootstrap_obs: float = 1e6
    """A time-out whose pre-reset observation has an entry beyond this (or non-finite) bootstraps with 0."""
    actor_bootstrap_warmup: int = 0
    """Iterations at the start in which the actor loss leaves out the critic bootstrap (the window's discounted
    rewards only) while the critics learn; 0 is SHAC as published. An untrained critic's bootstrap gradient is a
    random direction as large as the rewards' (measured: from a standing start at reward 0.93, 20 iterations at
    actor lr 1e-3 end at 0.63 with the bootstrap and at 0.93 without it, docs/shac.md)."""
    actor_hidden: tuple[int, ...] = (512, 256, 128)
    """Hidden widths of the actor's mean network."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """Hidden widths of each critic."""
    activation: Literal["elu", "relu", "tanh", "silu"] = "elu"
    """Hidden activation of actor and critics (followed by LayerNorm)."""
    layer_norm: bool = True
    """LayerNorm after every hidden activation."""

    def __post_init__(self) -> None:
        def integer(name: str, minimum: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or int(v) < minimum:
                raise ValueError(f"SHACConfig.{name} must be an integer >= {minimum}, got {v!r}")
            object.__setattr__(self, name, int(v))

        def real(name: str, lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            if not ok:
                rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
                raise ValueError(f"SHACConfig.{name} must be a finite number in {rng}, got {v!r}")
            object.__setattr__(self, name, float(v))

        for name in ("num_envs", "horizon", "max_iterations", "num_critics", "critic_iterations",
                     "critic_minibatches"):
            integer(name, 1)
        integer("actor_bootstrap_warmup", 0)
        real("gamma", 0.0, 1.0, hi_open=False)
        real("lam", 0.0, 1.0)
        for name in ("actor_lr", "critic_lr", "final_lr"):
            real(name, 0.0)
        real("target_critic_alpha", 0.0, 1.0, hi_open=True)
        for name in ("actor_grad_norm", "critic_grad_norm", "skip_grad_norm", "init_action_std", "rew_scale",
                     "max_bootstrap_obs"):
            real(name, 0.0, lo_open=True)
        real("obs_eps", 0.0)
        real("actor_output_scale", 0.0)
        if self.obs_clip is not None:
            real("obs_clip", 0.0, lo_open=True)
        if self.lr_schedule not in ("linear", "constant"):
            raise ValueError(f"SHACConfig.lr_schedule must be 'linear' or 'constant', got {self.lr_schedule!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, numbers.Real) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"SHACConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        for name in ("actor_hidden", "critic_hidden"):
            widths = tuple(getattr(self, name))
            if not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= 1 for w in widths):
                raise ValueError(f"SHACConfig.{name} must be a tuple of integers >= 1, got {getattr(self, name)!r}")
            object.__setattr__(self, name, tuple(int(w) for w in widths))
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"SHACConfig.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.critic_minibatches > self.num_envs * self.horizon:
            raise ValueError(f"SHACConfig.critic_minibatches ({self.critic_minibatches}) exceeds the window's "
                             f"num_envs * horizon = {self.num_envs * self.horizon} samples")


PRESETS: dict[str, SHACConfig] = {
    "paper": SHACConfig(),
    # 2 CPU cores (docs/shac.md, "A preset that learns on a CPU"): 16 environments x 16 steps, smaller networks, a
    # schedule of 500 iterations and no target critic (with alpha = 0.995 the target would still be 86 % the random
    # initial critic after 30 iterations). A policy that starts at the zero residual (output scale 0.01) with little
    # noise (std 0.02), small actor steps (3e-4), and no critic bootstrap in the actor loss for the first 200
    # iterations: measured on jump, the bootstrap of a critic trained for a few minutes undoes what the actor learnt.
    # Critics 64-128: the first layer over the 849 inputs is most of the fit's arithmetic, and at 64 wide the critics
    # predict unseen values as well as at 128 (docs/learning_throughput.md) for three fifths of the fit's time.
    "cpu-small": SHACConfig(num_envs=16, horizon=16, max_iterations=500, actor_hidden=(256, 128),
                            critic_hidden=(64, 128), target_critic_alpha=0.0, actor_lr=3e-4, init_action_std=0.02,
                            actor_output_scale=0.01, actor_bootstrap_warmup=200),
}
"""Named configurations: ``"paper"`` (docs/method.md §5.3) and ``"cpu-small"`` (2 CPU cores, meant with the env's
residual action map, ``bcg train``'s cpu-small default: the deterministic policy's tracking error on jump falls from
24.5 to 16.9 cm in 60 iterations, about 90 s; docs/shac.md)."""


def make_env(config: SHACConfig, env_config: EnvConfig) -> Any:
    """The differentiable batched environment of ``config.num_envs`` environments (``env_config`` with
    ``differentiable=True``; the clip is ``env_config.motion_file``, default ``run``): what SHAC is handed."""
    from bcg.envs.vector_env import G1TrackingVectorEnv

    if not isinstance(env_config, EnvConfig):
        raise TypeError(f"env_config must be a bcg.envs.EnvConfig, got {type(env_config).__name__}")
    if not env_config.autoreset:
        raise ValueError("SHAC needs EnvConfig.autoreset=True (finished environments reset inside step)")
    cfg = dataclasses.replace(env_config, differentiable=True)
    return G1TrackingVectorEnv(config.num_envs, config=cfg, default_motion="run")


def check_env(env: Any, num_envs: int) -> None:
    """Raise ``ValueError`` unless ``env`` is a differentiable, autoresetting batched env of ``num_envs`` rows
    (what :func:`make_env` builds)."""
    from bcg.envs.vector_env import G1TrackingVectorEnv

    if not isinstance(env, G1TrackingVectorEnv):
        raise TypeError(f"env must be a bcg.envs.G1TrackingVectorEnv, got {type(env).__name__}")
    if env.num_envs != num_envs or not env.differentiable or not env.autoreset:
        raise ValueError(f"SHAC needs a differentiable, autoresetting env of {num_envs} environments (the config's "
                         f"num_envs), got num_envs={env.num_envs}, differentiable={env.differentiable}, "
                         f"autoreset={env.autoreset} (bcg.agents.shac.make_env builds one)")


def _derived_seed(seed: int, stream: int) -> int:
    """A seed in [0, 2^63) for one random stream of the agent (networks, action noise, env, estimator)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + stream * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 31
    return x & (2**63 - 1)


@dataclass
class Window:
    """What one rollout recorded (N steps x E environments)."""

    actor_loss: torch.Tensor
    """Scalar actor loss with its graph (already scaled back by the return std when ret_norm is on)."""
    critic_obs: torch.Tensor
    """[N, E, D] normalised noise-free observations at the start of every step (detached)."""
    rewards: torch.Tensor
    """[N, E] rewards as the critic sees them (scaled, divided by the return std; detached)."""
    next_values: torch.Tensor
    """[N, E] bootstrap of the critic targets V'(s_{t+1}) (min over the target critics; 0 after falls)."""
    dones: torch.Tensor
    """[N, E] bool: episode ended at step t (terminated or truncated)."""
    stats: dict[str, float]
    """Rollout scalars (raw reward, tracking error, episodes, trigger rate, samples, unstable resets; with
    demonstration replay, replay_rate: the share of steps whose state was put back on the reference)."""
    next_obs: torch.Tensor | None = None
    """[N, E, D] the normalised observations ``next_values`` were computed from (the pre-reset ones where an episode
    ended; detached), so that other critics can bootstrap the same window (benchmarks/critic_workload.py)."""
    next_value_zero: torch.Tensor | None = None
    """[N, E] bool: rows whose bootstrap is 0 whatever the critic (a fall, or a non-finite observation)."""


class SHAC:
    """SHAC on the differentiable G1 tracking environment (implements :class:`bcg.agents.base.Agent`).

    Args:
        config: a :class:`SHACConfig` (e.g. ``PRESETS["cpu-small"]``).
        env_config: the environment's :class:`~bcg.envs.EnvConfig` (``differentiable`` is forced on); or None with
            ``env``.
        estimator: the gradient estimator (a :class:`bcg.estimators.Estimator`); None means ``bptt``. Its random
            draws are reseeded from its own ``seed`` field and ``seed`` (seed 0 keeps the field's draws).
        add: an ``bcg.agents.add.ADDConfig`` to train with the ADD imitation reward (installed as the env's
            reward); None keeps the env's own reward (``env_config.reward``, default tracking).
        seed: seeds the networks, the action noise, the environment's resets and the estimator.
        update_threads: torch threads of the critic fit (None: :func:`bcg.agents.threads.dense_update_threads` of
            the minibatch size and OpenMP's wait policy: every core for the paper's sizes where OpenMP spins, else
            one).
        env: the environment to train on, built by the caller (:func:`make_env`; differentiable, autoresetting,
            ``config.num_envs`` rows), instead of ``env_config``. SHAC attaches the estimator to it and resets it.
        overlap_critic_fit: fit the critics on a second thread while the actor's backward pass (through the
            simulator), the ADD update and the next window's steps run, where the fit and the rest use one torch
            thread each. The fit is joined, and the target critics updated from it, right before the next window
            reads them (its bootstrap values at its end) or a state is saved; nothing else reads or writes what the
            fit uses, so the numbers are those of the serial order, bit for bit, and only the wall time changes.
            The critic columns of an iteration's metrics are then those of the previous window's fit (NaN at the
            first iteration).
        critic_fit_worker: where an overlapping fit runs: ``"thread"`` (a second thread of this process) or
            ``"process"`` (a worker process, :class:`bcg.agents.critic_fit.ProcessCriticFit`: outside this
            interpreter's lock, the critics and their optimiser state in shared memory; the same numbers).
    """

    LATER_STATE_KEYS = ("last_fit",)
    """Entries of :meth:`state_dict` that checkpoints written before they existed lack (:meth:`load_state_dict`
    supplies them)."""

    def __init__(self, config: SHACConfig, env_config: EnvConfig | None = None, estimator: Any = None,
                 add: Any = None, seed: int = 0, update_threads: int | None = None, *, env: Any = None,
                 overlap_critic_fit: bool = False, critic_fit_worker: Literal["thread", "process"] = "thread"):
        from bcg.estimators import Estimator, make

        if not isinstance(config, SHACConfig):
            raise TypeError(f"config must be a SHACConfig, got {type(config).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2^63 - 1], got {seed!r}")
        if estimator is None:
            estimator = make("bptt")
        if not isinstance(estimator, Estimator):
            raise TypeError(f"estimator must be a bcg.estimators.Estimator or None, got {type(estimator).__name__}")
        self.config = config
        self.seed = int(seed)
        rows = math.ceil(config.num_envs * config.horizon / config.critic_minibatches)
        width = config.num_critics * (config.critic_hidden[0] if config.critic_hidden else 1)
        self.update_threads = resolve_update_threads(update_threads, rows, width)
        """Torch intra-op threads of the critic fit (the rollout keeps the caller's setting)."""
        self._last_fit: tuple[float, float, float] = (math.nan, math.nan, math.nan)  # joined last: loss, norm, new
        if (env is None) == (env_config is None):
            raise ValueError("SHAC takes an env_config or an env (one of them)")
        if env is not None:
            check_env(env, config.num_envs)
        self.env = env if env is not None else make_env(config, env_config)
        self.device = self.env.device
        self.estimator = estimator
        estimator.attach(self.env)
        estimator.reset(seed=(int(getattr(estimator, "seed", 0)) + 1_000_003 * self.seed) % 2**63)
        self.add_reward: Any = None
        if add is not None:
            from bcg.agents.add import ADDReward

            self.add_reward = ADDReward(self.env, add, seed=self.seed)
            self.env.reward_fn = self.add_reward

        obs_dim, act_dim = int(self.env.single_observation_space.shape[0]), int(self.env.single_action_space.shape[0])
        self.obs_dim, self.act_dim = obs_dim, act_dim
        with torch.random.fork_rng(devices=[]):  # network initialisation from the seed, global RNG untouched
            torch.manual_seed(_derived_seed(self.seed, 1))
            self.actor = GaussianActor(obs_dim, act_dim, config.actor_hidden, config.activation, config.layer_norm,
                                       config.init_action_std, config.actor_output_scale).to(self.device)
            self.critics = CriticEnsemble(obs_dim, config.critic_hidden, config.num_critics, config.activation,
                                          config.layer_norm).to(self.device)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=config.actor_lr, betas=config.betas)
        self.critic_opt = torch.optim.Adam(self.critics.parameters(), lr=config.critic_lr, betas=config.betas,
                                           fused=True)
        self.critic_fit = CriticFitRunner(self.critics, self.critic_opt, passes=config.critic_iterations,
                                          minibatches=config.critic_minibatches, clip=config.critic_grad_norm,
                                          skip_norm=config.skip_grad_norm, threads=self.update_threads,
                                          overlap=overlap_critic_fit, worker=critic_fit_worker)
        """Where the critic fit runs and when it is joined (see the class docstring)."""
        self.obs_rms = RunningMeanStd(obs_dim, eps=config.obs_eps, clip=config.obs_clip, device=self.device)
        self.ret_rms = RunningMeanStd((), eps=1e-6, device=self.device)
        self.noise_gen = torch.Generator(device=self.device).manual_seed(_derived_seed(self.seed, 2))
        """Generator of the action noise (saved and restored with the agent)."""

        self.iteration = 0
        self._schedule_progress: float | None = None  # set_schedule_progress
        self.samples = 0
        self.skipped_actor_updates = 0
        self.skipped_critic_updates = 0
        self.nonfinite_resets = 0
        obs, info = self.env.reset(seed=_derived_seed(self.seed, 3) % 2**62)
        self._obs = obs.detach()
        self._critic_obs = info.get("critic_obs", obs).detach()
        if config.obs_norm:
            self.obs_rms.update(self._obs)
        n = config.num_envs
        self._ret = torch.zeros(n, dtype=torch.float64, device=self.device)  # discounted return for ret_rms
        self._ep_return = torch.zeros(n, dtype=torch.float64, device=self.device)
        self._ep_length = torch.zeros(n, dtype=torch.long, device=self.device)

    @property
    def skipped_updates(self) -> int:
        """Actor and critic steps skipped so far (non-finite or absurd gradient norm)."""
        return self.skipped_actor_updates + self.skipped_critic_updates

    # ================================================================================================ 2. rollout

    def _begin_window(self) -> tuple[FrozenNormalizer | None, float]:
        """Window start: cut the graph at the current state (DiffRL's ``initialize_trajectory``) and freeze the
        statistics used inside the window: (observation normaliser or None, return std sqrt(Var[ret] + 1e-6))."""
        self.env.detach()
        norm = self.obs_rms.frozen() if self.config.obs_norm else None
        ret_std = float(torch.sqrt(self.ret_rms.var + 1e-6)) if self.config.ret_norm else 1.0
        return norm, ret_std

    def _rollout(self, norm: FrozenNormalizer | None, ret_std: float) -> Window:
        """One window of N steps from the current (detached) state; returns the actor loss and the critic data.

        Actor loss (docs/method.md §5.1 step 3), minimised, per environment and per segment [t0, t1] of the window
        (a segment ends at an episode end or at the window end; discount and sum restart after an episode end):
        ``-(sum_t gamma^(t - t0) r_t + gamma^(t1 - t0 + 1) V(s_{t1 + 1}))``, summed and divided by N E. The bootstrap
        V is the mean over the target critics of the next (noise-free, normalised) observation, differentiated
        through the observation: 0 after a fall (terminated), the pre-reset observation's value after a time-out
        (0 if that observation is non-finite or beyond ``max_bootstrap_obs``).
        """
        cfg, env = self.config, self.env
        n_steps, n_envs = cfg.horizon, cfg.num_envs
        normalize = norm.normalize if norm is not None else (lambda x: x)
        obs, cobs = self._obs.detach(), self._critic_obs.detach()
        dtype, dev = obs.dtype, obs.device
        # Per step only the policy and the environment run; everything else is done once per window on the stacked
        # steps. Right after the physics every distinct torch operation runs with cold caches (8-50 us each), so
        # per-step bookkeeping used to cost a third of the rollout at 16 environments.
        steps = _WindowSteps()
        for _ in range(n_steps):
            steps.start_critic_obs.append(cobs)
            noise = torch.randn(n_envs, self.act_dim, generator=self.noise_gen, device=dev, dtype=dtype)
            actions = self.actor(normalize(obs), noise)
            obs, reward, terminated, truncated, info = env.step(actions)
            cobs = info.get("critic_obs", obs)
            steps.record(obs, reward, terminated, truncated, info)
        self._obs, self._critic_obs = obs.detach(), cobs.detach()
        self.sync()  # the previous window's fit, if it still runs: the bootstrap below reads its result

        raw = torch.stack(steps.rewards)                                   # [N, E] with the graph
        terminated, truncated = torch.stack(steps.terminated), torch.stack(steps.truncated)
        dones = terminated | truncated
        r = raw * cfg.rew_scale
        if cfg.obs_norm:  # one merge of the window's N E observations (the window used frozen statistics)
            self.obs_rms.update(torch.stack(steps.obs).detach())
        if cfg.ret_norm:
            with torch.no_grad():
                returns = torch.empty(n_steps, n_envs, dtype=torch.float64, device=dev)
                for t in range(n_steps):
                    self._ret = self._ret * cfg.gamma + r[t].detach().to(torch.float64)
                    returns[t] = self._ret
                    self._ret = torch.where(dones[t], torch.zeros_like(self._ret), self._ret)
                self.ret_rms.update(returns)
            r = r / ret_std

        # bootstrap values of the next states (the pre-reset states of environments that finished)
        final = torch.stack(steps.final_obs)                               # [N, E, D] with the graph
        with torch.no_grad():
            fd = final.detach()
            bad = ~torch.isfinite(fd).all(-1) | (fd.abs() > cfg.max_bootstrap_obs).any(-1)
            zero = terminated | bad
            boot = normalize(torch.where(bad[..., None], torch.zeros_like(fd), fd))
            next_values = self.target_critics.min(boot.reshape(-1, self.obs_dim)).reshape(n_steps, n_envs)
            next_values = torch.nan_to_num(next_values, nan=0.0, posinf=0.0, neginf=0.0)
            next_values = torch.where(zero, torch.zeros_like(next_values), next_values)
        ends = dones.clone()
        ends[-1] = True
        v_actor = torch.zeros(n_steps, n_envs, dtype=dtype, device=dev)
        if self.iteration >= cfg.actor_bootstrap_warmup:  # segments cut by a time-out or the window end
            t_idx, e_idx = (ends & ~zero).nonzero(as_tuple=True)
            if t_idx.numel():
                v_actor = v_actor.index_put((t_idx, e_idx), self.target_critics.mean(normalize(final[t_idx, e_idx])))
        loss = _segment_loss(r, v_actor, dones, ends, cfg.gamma) / (n_steps * n_envs)
        if cfg.ret_norm:
            loss = loss * ret_std  # back to the reward's scale (DiffRL)
        critic_obs = normalize(torch.stack(steps.start_critic_obs)).detach()
        stats = self._window_stats(raw.detach(), dones, torch.stack(steps.tracking_error), steps)
        return Window(loss, critic_obs, r.detach(), next_values, dones, stats, next_obs=boot, next_value_zero=zero)

    @torch.no_grad()
    def _window_stats(self, raw: torch.Tensor, dones: torch.Tensor, tracking: torch.Tensor,
                      steps: _WindowSteps) -> dict[str, float]:
        """Rollout scalars from the window's raw rewards, done flags and tracking errors [N, E]; carries the
        per-environment episode return and length across windows."""
        n_steps = raw.shape[0]
        ep_ret = torch.zeros((), dtype=torch.float64, device=raw.device)
        ep_len = torch.zeros((), dtype=torch.float64, device=raw.device)
        for t in range(n_steps):
            self._ep_return += raw[t].to(torch.float64)
            self._ep_length += 1
            ep_ret += torch.where(dones[t], self._ep_return, 0.0).sum()
            ep_len += torch.where(dones[t], self._ep_length, 0).sum()
            self._ep_return = torch.where(dones[t], torch.zeros_like(self._ep_return), self._ep_return)
            self._ep_length = torch.where(dones[t], torch.zeros_like(self._ep_length), self._ep_length)
        episodes = int(dones.sum())
        extra = {"replay_rate": float(torch.stack(steps.replayed).float().mean())} if steps.replayed else {}
        return {
            "reward": float(raw.mean()),
            "tracking_error_cm": 100.0 * float(tracking.mean()),
            "episode_return": float(ep_ret) / episodes if episodes else math.nan,
            "episode_length": float(ep_len) / episodes if episodes else math.nan,
            "episodes": float(episodes),
            "trigger_rate": steps.triggered / steps.envs if steps.envs else 0.0,
            "branches": float(steps.branches),
            "unstable": float(steps.unstable),
            **extra,
        }

    # ================================================================================================ 3. losses

    @staticmethod
    def td_lambda_targets(rewards: torch.Tensor, next_values: torch.Tensor, dones: torch.Tensor, gamma: float,
                          lam: float) -> torch.Tensor:
        """TD(lambda) critic targets [N, E] of a window (docs/method.md §5.1 step 5), computed backwards:

        ``V~_t = r_t + gamma ((1 - lam) V'_{t+1} + lam V~_{t+1})`` where the episode goes on, and
        ``V~_t = r_t + gamma V'_{t+1}`` where it ended at step t (``dones[t]``) and at the window's last step.
        ``next_values[t]`` is V'(s_{t+1}) (already 0 after a fall, the pre-reset value after a time-out).
        """
        return td_lambda_targets(rewards, next_values, dones, gamma, lam)

    # ================================================================================================ 4. update

    def set_schedule_progress(self, fraction: float | None) -> None:
        """Drive the learning-rate schedule by ``fraction`` in [0, 1] of the run (e.g. the share of a time budget
        spent, set before each iteration) instead of ``iteration / max_iterations``; None: by iterations again."""
        if fraction is not None and not (isinstance(fraction, numbers.Real) and math.isfinite(fraction)):
            raise ValueError(f"schedule progress must be a finite number or None, got {fraction!r}")
        self._schedule_progress = None if fraction is None else min(max(float(fraction), 0.0), 1.0)

    def _lr(self, lr0: float) -> float:
        cfg = self.config
        if cfg.lr_schedule == "constant":
            return lr0
        progress = self._schedule_progress
        if progress is None:
            progress = min(self.iteration / cfg.max_iterations, 1.0)
        return lr0 + (cfg.final_lr - lr0) * progress

    def _guarded_step(self, opt: torch.optim.Optimizer, params: list[nn.Parameter], clip: float) -> tuple[float, bool]:
        """Clip the gradients of ``params`` to ``clip`` and step ``opt``, unless the norm before clipping is
        non-finite or above ``skip_grad_norm``: then nothing is applied. Returns (norm before clipping, applied)."""
        return guarded_step(opt, params, clip, self.config.skip_grad_norm)

    def _actor_update(self, window: Window) -> float:
        """Backpropagate the window's actor loss (through the simulator) and step the actor; returns the gradient
        norm before clipping. The loss reaches the target critics (the bootstrap), never the critics being fitted."""
        self.actor_opt.zero_grad(set_to_none=True)
        window.actor_loss.backward()
        grad_norm, applied = self._guarded_step(self.actor_opt, list(self.actor.parameters()),
                                                self.config.actor_grad_norm)
        self.skipped_actor_updates += not applied
        self.actor_opt.zero_grad(set_to_none=True)
        return grad_norm

    @property
    def overlap_critic_fit(self) -> bool:
        """Whether the critic fit may run beside the actor update (see the class docstring)."""
        return self.critic_fit.overlap

    @property
    def critic_fit_worker(self) -> str:
        """Where an overlapping critic fit runs: ``"thread"`` or ``"process"``."""
        return self.critic_fit.worker

    def _start_critic_fit(self, window: Window, lr: float) -> bool:
        """Begin the critics' regression of the window's TD(lambda) targets at critic learning rate ``lr``
        (:class:`~bcg.agents.critic_fit.CriticFitRunner`: beside the caller where it may, else now); :meth:`sync`
        completes it. Returns whether it runs beside the caller."""
        return self.critic_fit.start(*self._fit_data(window), lr)

    def stop_workers(self) -> None:
        """Join the fit still running and stop the critic fit's worker process and thread, if any (a later
        iteration starts them again); ``bcg train`` calls it when a run ends."""
        self.sync()
        self.critic_fit.close()

    def sync(self) -> None:
        """Complete the critic fit still running beside the caller, if any: wait for it (raising what it raised),
        count its skipped steps, update the target critics from it and keep its losses for the metrics. The next
        window and :meth:`state_dict` do this themselves; call it before reading the critics from outside. The fit
        regresses the targets in ``critic_iterations`` passes over ``critic_minibatches`` contiguous minibatches of
        the window's N E samples; its first pass meets every minibatch before training on it, so its loss measures
        how well the critics predict targets they have not seen (progressive validation)."""
        result = self.critic_fit.join()
        if result is None:
            return
        loss, norm, loss_new, skipped = result
        self.skipped_critic_updates += skipped
        self._update_target_critics()
        self._last_fit = (loss, norm, loss_new)

    def _fit_data(self, window: Window) -> tuple[torch.Tensor, torch.Tensor]:
        """The fit's samples of a window: observations [N E, D] and TD(lambda) targets [N E]."""
        cfg = self.config
        targets = self.td_lambda_targets(window.rewards, window.next_values, window.dones, cfg.gamma, cfg.lam)
        return window.critic_obs.reshape(-1, self.obs_dim), targets.reshape(-1)

    @torch.no_grad()
    def _update_target_critics(self) -> None:
        """phi' <- alpha phi' + (1 - alpha) phi (alpha = 0: a copy of the critics)."""
        polyak_(self.target_critics, self.critics, self.config.target_critic_alpha)

    def train_iteration(self) -> dict[str, float]:
        """One window: rollout, actor step, critic regression, target critics, ADD discriminator; returns the
        scalars of :data:`bcg.agents.base.METRIC_NAMES` plus SHAC's own (and the discriminator's with ADD)."""
        cfg = self.config
        lr_a, lr_c = self._lr(cfg.actor_lr), self._lr(cfg.critic_lr)
        for g in self.actor_opt.param_groups:
            g["lr"] = lr_a

        norm, ret_std = self._begin_window()
        window = self._rollout(norm, ret_std)

        # critic regression on the window's TD(lambda) targets (on the second thread, beside the actor update, the
        # ADD update and the next window's steps, where it may); the target critics follow when it is joined, after
        # the actor's backward pass has read their weights
        overlapped = self._start_critic_fit(window, lr_c)
        grad_norm = self._actor_update(window)
        metrics = {k: v for k, v in window.stats.items() if k not in ("branches", "unstable", "episodes")}
        # the discriminator learns from the residuals of this window (its own networks, optimiser and generator)
        if self.add_reward is not None:
            metrics.update({k: float(v) for k, v in self.add_reward.update().items()})
        if not overlapped:  # a fit on the second thread is joined by the next window instead
            self.sync()
        critic_loss, critic_grad_norm, critic_loss_new = self._last_fit

        self.iteration += 1
        self.samples += int(window.stats["branches"])
        self.nonfinite_resets += int(window.stats["unstable"])
        metrics.update({
            "grad_norm": grad_norm,
            "skipped_updates": float(self.skipped_updates),
            "nonfinite_resets": float(self.nonfinite_resets),
            "actor_loss": float(window.actor_loss.detach()),
            "critic_loss": critic_loss,
            "critic_loss_new": critic_loss_new,
            "lr": lr_a,
            "critic_lr": lr_c,
            "critic_grad_norm": critic_grad_norm,
            "skipped_actor_updates": float(self.skipped_actor_updates),
            "skipped_critic_updates": float(self.skipped_critic_updates),
            "action_std": float(self.actor.std.detach().mean()),
            "episodes": window.stats["episodes"],
            "return_std": ret_std,
        })
        return metrics

    # ================================================================================================ 5. state, export

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly (tensors and plain values only; ``torch.load(...,
        weights_only=True)`` reads it): networks, target critics, optimisers, the schedule position (iteration),
        normalisers, the environment's state, generator and layer state (adaptive start scores), the estimator's
        state, the ADD reward's state, the agent's and torch's RNG states, counters."""
        self.sync()
        env_state = self.env.state.saved()
        est_sd = self.estimator.state_dict() if hasattr(self.estimator, "state_dict") else None
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "config": dataclasses.asdict(self.config),
            "obs_dim": self.obs_dim,
            "act_dim": self.act_dim,
            "iteration": self.iteration,
            "samples": self.samples,
            "skipped_actor_updates": self.skipped_actor_updates,
            "skipped_critic_updates": self.skipped_critic_updates,
            "last_fit": [float(x) for x in self._last_fit],
            "nonfinite_resets": self.nonfinite_resets,
            "actor": self.actor.state_dict(),
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "obs_rms": self.obs_rms.state_dict(),
            "ret_rms": self.ret_rms.state_dict(),
            "ret": self._ret.clone(),
            "episode_return": self._ep_return.clone(),
            "episode_length": self._ep_length.clone(),
            "obs": self._obs.clone(),
            "critic_obs": self._critic_obs.clone(),
            "env_state": env_state,
            "env_generator": self.env.reset_generator.get_state(),
            "env_nonfinite_count": int(self.env.nonfinite_count),
            "estimator": est_sd,
            "add": self.add_reward.state_dict() if self.add_reward is not None else None,
            "noise_generator": self.noise_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        # the env's layers beyond its state (adaptive start scores): an entry only when one is on, so that states
        # saved without layers keep their entries (a resume compares them)
        layers = self.env.layers_state_dict()
        if layers:
            out["env_layers"] = layers
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output into this agent (built with the same config and environment);
        afterwards ``train_iteration`` repeats the original run's numbers (bit for bit on CPU)."""
        from bcg.envs.state import EnvState

        self.sync()  # a fit still running would write into the critics being replaced
        self.critic_fit.close()  # the optimiser's state is replaced below: a new worker shares the new one
        if state.get("format") == "bcg.shac/1":
            state = _stack_critics_of_v1(state, self.critics)
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a SHAC state (format {state.get('format')!r}, expected {STATE_FORMAT!r} or "
                             "'bcg.shac/1')")
        mine = dataclasses.asdict(self.config)
        theirs = dict(state["config"])
        diff = sorted(k for k in mine if k not in theirs or _plain(theirs[k]) != _plain(mine[k]))
        if diff:
            raise ValueError("the SHAC state was made with a different config; differing fields: "
                             + ", ".join(f"{k} (state {theirs.get(k)!r}, agent {mine[k]!r})" for k in diff))
        if (state["obs_dim"], state["act_dim"]) != (self.obs_dim, self.act_dim):
            raise ValueError(f"the SHAC state has observation / action sizes {state['obs_dim']} / {state['act_dim']}, "
                             f"this agent {self.obs_dim} / {self.act_dim}")
        if (state["add"] is None) != (self.add_reward is None):
            raise ValueError("the SHAC state was made " + ("without" if state["add"] is None else "with")
                             + " the ADD reward, this agent " + ("with" if state["add"] is None else "without"))
        self.actor.load_state_dict(state["actor"])
        self.critics.load_state_dict(state["critics"])
        self.target_critics.load_state_dict(state["target_critics"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.obs_rms.load_state_dict(state["obs_rms"])
        self.ret_rms.load_state_dict(state["ret_rms"])
        dev = self.device
        self._ret = state["ret"].to(dev).clone()
        self._ep_return = state["episode_return"].to(dev).clone()
        self._ep_length = state["episode_length"].to(dev).clone()
        self._obs = state["obs"].to(dev).clone()
        self._critic_obs = state["critic_obs"].to(dev).clone()
        self.env.load_state(EnvState.from_saved(state["env_state"], self.env.model, dev))
        self.env.reset_generator.set_state(state["env_generator"])
        self.env.nonfinite_count = int(state["env_nonfinite_count"])
        self.env.load_layers_state_dict(state.get("env_layers", {}))
        if state["estimator"] is not None:
            if not hasattr(self.estimator, "load_state_dict"):
                raise ValueError(f"the state holds estimator state but {type(self.estimator).__name__} cannot load it")
            self.estimator.load_state_dict(state["estimator"])
        if self.add_reward is not None:
            self.add_reward.load_state_dict(state["add"])
        self.noise_gen.set_state(state["noise_generator"])
        torch.set_rng_state(state["torch_rng"])
        self.iteration = int(state["iteration"])
        self.samples = int(state["samples"])
        self.skipped_actor_updates = int(state["skipped_actor_updates"])
        self.skipped_critic_updates = int(state["skipped_critic_updates"])
        self.nonfinite_resets = int(state["nonfinite_resets"])
        # the losses of the fit joined last (reported by the next iteration when the fit overlaps; absent in states
        # written before the fit could overlap)
        self._last_fit = tuple(float(x) for x in state.get("last_fit", (math.nan,) * 3))

    def export_policy(self) -> dict[str, Any]:
        """The deterministic policy (normalised observation -> mean raw action, before the env's tanh) in the
        self-contained format of :func:`bcg.agents.export.policy_export`."""
        from bcg.agents.export import policy_export

        cfg = self.config
        if cfg.obs_norm:
            mean, var, eps, clip = self.obs_rms.mean, self.obs_rms.var, cfg.obs_eps, cfg.obs_clip
        else:
            mean = torch.zeros(self.obs_dim, dtype=torch.float64, device=self.device)
            var, eps, clip = torch.ones_like(mean), 0.0, None
        return policy_export(self.actor.mean_net, mean, var, obs_eps=eps, obs_clip=clip, env=self.env, agent="shac")


@torch.no_grad()
def polyak_(target: nn.Module, source: nn.Module, alpha: float) -> None:
    """target <- alpha target + (1 - alpha) source, parameter by parameter (alpha = 0: a copy)."""
    for pt, p in zip(target.parameters(), source.parameters(), strict=True):
        pt.mul_(alpha).add_(p.detach(), alpha=1.0 - alpha) if alpha > 0 else pt.copy_(p)


class _WindowSteps:
    """What each step of a rollout hands over for the window's end (lists of [E, ...] tensors, estimator counts)."""

    def __init__(self) -> None:
        self.start_critic_obs: list[torch.Tensor] = []
        self.obs: list[torch.Tensor] = []
        self.final_obs: list[torch.Tensor] = []
        self.rewards: list[torch.Tensor] = []
        self.terminated: list[torch.Tensor] = []
        self.truncated: list[torch.Tensor] = []
        self.tracking_error: list[torch.Tensor] = []
        self.replayed: list[torch.Tensor] = []  # [E] bool per step, with demonstration replay on
        self.envs = self.triggered = self.branches = self.unstable = 0

    def record(self, obs: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
               info: Mapping[str, Any]) -> None:
        """Keep one step's outputs (``env.step``'s five values); no torch operation runs here."""
        n = reward.shape[0]
        self.obs.append(obs)
        self.final_obs.append(info.get("final_critic_obs", info["final_obs"]))  # = the next obs where not done
        self.rewards.append(reward)
        self.terminated.append(terminated)
        self.truncated.append(truncated)
        self.tracking_error.append(info["tracking_error"])
        if "replayed" in info:
            self.replayed.append(info["replayed"])
        est = info.get("estimator")
        self.envs += int(est["envs"]) if est else n
        self.triggered += int(est["envs_triggered"]) if est else 0
        self.branches += int(est["branches_simulated"]) if est else n
        self.unstable += int(info.get("num_unstable", 0))


def _segment_loss(rewards: torch.Tensor, bootstrap: torch.Tensor, dones: torch.Tensor, ends: torch.Tensor,
                  gamma: float) -> torch.Tensor:
    """Minus the sum over the window's segments of ``sum_t gamma^(t - t0) r_t + gamma^(t1 - t0 + 1) V_t1``.

    Args:
        rewards: [N, E] rewards (with their graph).
        bootstrap: [N, E] the value of the state after step t where a segment ends there with a bootstrap (0
            elsewhere, and after falls).
        dones: [N, E] bool, an episode ended at step t (discount and sum restart after it).
        ends: [N, E] bool, a segment ends at step t (``dones``, and every environment at the window's last step).
    Returns:
        the scalar loss (not yet divided by N E).
    """
    disc = torch.ones_like(rewards[0])    # gamma^(t - t0)
    acc = torch.zeros_like(rewards[0])    # sum_t gamma^(t - t0) r_t of the open segment
    loss = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    for t in range(rewards.shape[0]):
        acc = acc + disc * rewards[t]
        seg = acc + gamma * disc * bootstrap[t]
        loss = loss - torch.where(ends[t], seg, torch.zeros_like(seg)).sum()
        disc = torch.where(dones[t], torch.ones_like(disc), disc * gamma)
        acc = torch.where(dones[t], torch.zeros_like(acc), acc)
    return loss


def _stack_critics_of_v1(state: Mapping[str, Any], critics: CriticEnsemble) -> dict[str, Any]:
    """A ``bcg.shac/1`` state (separate critic modules, one Adam state per module parameter) in the stacked
    layout of ``bcg.shac/2``: the critics' and target critics' weights and the critic optimiser's moments are
    stacked per layer. Adam is elementwise, so the stacked moments continue the same optimisation."""
    out = dict(state)
    out["critics"] = critics.stack_separate_state_dict(state["critics"])
    out["target_critics"] = critics.stack_separate_state_dict(state["target_critics"])
    old_names = list(critics.separate_names())
    new_names = [n for n, _ in critics.named_parameters()]
    opt = state["critic_opt"]
    group = opt["param_groups"][0]
    if len(opt["param_groups"]) != 1 or len(group["params"]) != len(old_names):
        raise ValueError("the bcg.shac/1 state's critic optimiser does not match its critics")
    by_name = {old_names[i]: opt["state"].get(pid) for i, pid in enumerate(group["params"])}
    per_param: dict[int, dict[str, Any]] = {}
    if all(v is not None for v in by_name.values()):  # an optimiser that has stepped: stack its moments
        parts: dict[str, list[Any]] = {n: [None] * critics.num_critics for n in new_names}
        for old, (new, k) in critics.separate_names().items():
            parts[new][k] = by_name[old]
        for i, n in enumerate(new_names):
            first = parts[n][0]
            per_param[i] = {key: (first[key].clone() if key == "step" else torch.stack([p[key] for p in parts[n]]))
                            for key in first}
    # the stacked critics' Adam is the fused one (the loaded group's options replace the optimiser's own)
    out["critic_opt"] = {"state": per_param,
                         "param_groups": [{**group, "fused": True, "foreach": None,
                                           "params": list(range(len(new_names)))}]}
    out["format"] = STATE_FORMAT
    return out


def _plain(v: Any) -> Any:
    """Tuples and lists compare equal (a config read back from a checkpoint has lists)."""
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def td_lambda_targets(rewards: torch.Tensor, next_values: torch.Tensor, dones: torch.Tensor, gamma: float,
                      lam: float) -> torch.Tensor:
    """TD(lambda) targets [N, E]; see :meth:`SHAC.td_lambda_targets` (the window's last step counts as done)."""
    if not (rewards.shape == next_values.shape == dones.shape) or rewards.dim() != 2:
        raise ValueError(f"rewards, next_values and dones must be [N, E] alike, got {list(rewards.shape)}, "
                         f"{list(next_values.shape)}, {list(dones.shape)}")
    out = torch.empty_like(rewards)
    ahead = torch.zeros_like(rewards[0])  # V~_{t+1}
    for t in reversed(range(rewards.shape[0])):
        end = dones[t] | (t == rewards.shape[0] - 1)
        boot = torch.where(end, next_values[t], (1.0 - lam) * next_values[t] + lam * ahead)
        out[t] = rewards[t] + gamma * boot
        ahead = out[t]
    return out
