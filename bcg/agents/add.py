"""ADD imitation reward (docs/method.md §6): an adversarial *differential* discriminator on normalised residuals.

The residual of a step is Delta = phi(reference) - phi(simulated) [N, 233], the 233-D discriminator features of
:func:`bcg.motion.features.disc_features` (one function for the robot and for the reference) at the phase-matched
frame. It is normalised elementwise by the running mean of ``|Delta|`` (floor 1e-4, no centring), and an MLP
discriminator ``l(Delta~)`` is trained to tell the single positive sample, the zero residual, from the policy's
residuals (the current ones and as many from a replay buffer). The policy's reward is ``2 softplus(min(l, 9))``
(= -2 log(1 - sigmoid(l)), MimicKit's reward with its 1e-4 floor written stably).

:class:`ADDReward` is a reward callable of the environment protocol (``env.reward_fn = ADDReward(env, config)``):

* inside the reward, the discriminator's parameters and the normaliser are constants (a frozen copy), the reference
  features are constants, and the simulated features keep their graph, the root position included (MimicKit
  detaches it; a differentiable simulator must not), so SHAC backpropagates the reward into the simulated state;
* every call records its detached residuals; :meth:`ADDReward.update` trains the discriminator once on the residuals
  recorded since the previous call (SHAC: once per window; PPO: at the end of each rollout) and pushes them into the
  replay buffer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.func import functional_call

from bcg.envs.rewards import StepContext
from bcg.motion.features import Features

if TYPE_CHECKING:
    from bcg.envs.vector_env import G1TrackingVectorEnv

__all__ = ["ADDConfig", "ADDReward", "DiffNormalizer", "ResidualReplay", "build_discriminator"]


@dataclass(frozen=True)
class ADDConfig:
    """Options of the ADD reward and its discriminator (MimicKit's ``add_g1_agent.yaml``; docs/method.md §6.2)."""

    hidden: tuple[int, ...] = (1024, 512)
    """Hidden layer widths of the discriminator MLP (ReLU)."""
    lr: float = 2.5e-4
    """Discriminator learning rate (SGD)."""
    momentum: float = 0.9
    """SGD momentum of the discriminator optimiser."""
    weight_decay: float = 1e-4
    """SGD weight decay of the discriminator optimiser."""
    grad_penalty: float = 2.0
    """Weight of the gradient penalty 0.5 (mean |dl/dx|^2 at the negatives + |dl/dx|^2 at the zero positive)."""
    logit_reg: float = 0.01
    """Weight of the logit regularisation |w_out|^2 on the output layer's weights."""
    reward_scale: float = 2.0
    """Reward = reward_scale * softplus(min(logit, logit_clamp))."""
    logit_clamp: float = 9.0
    """Upper clamp of the logit inside the reward (9 mirrors MimicKit's 1e-4 floor on 1 - D; reward <= 18)."""
    norm_floor: float = 1e-4
    """Floor of the running mean |Delta| that divides the residuals."""
    epochs: int = 2
    """Passes over the recorded residuals per :meth:`ADDReward.update`."""
    minibatches: int = 2
    """Minibatches per pass (each with as many replay residuals as current ones)."""
    replay_capacity: int = 200_000
    """Residuals kept in the replay buffer (a ring)."""
    replay_push: int = 1000
    """Once the replay buffer is full, this many random new residuals are pushed per update (before: all)."""
    action_rate_weight: float = 0.0
    """Weight w of an extra -w |a_t - a_{t-1}|^2 term (actions before tanh). The paper uses 0.8 (docs/method.md §6.4);
    off by default because a negative per-step term teaches an exploring policy to end episodes early (docs/envs.md)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.hidden, tuple) and len(self.hidden) >= 1
                and all(isinstance(h, int) and h >= 1 for h in self.hidden)):
            raise ValueError(f"ADDConfig.hidden must be a non-empty tuple of positive ints, got {self.hidden!r}")
        for name in ("lr", "reward_scale", "logit_clamp", "norm_floor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ADDConfig.{name} must be a finite number > 0, got {v!r}")
        for name in ("momentum",):
            v = getattr(self, name)
            if not (0 <= v < 1):
                raise ValueError(f"ADDConfig.{name} must be in [0, 1), got {v!r}")
        for name in ("weight_decay", "grad_penalty", "logit_reg", "action_rate_weight"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"ADDConfig.{name} must be a finite number >= 0, got {v!r}")
        for name in ("epochs", "minibatches", "replay_capacity", "replay_push"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"ADDConfig.{name} must be an integer >= 1, got {v!r}")


def build_discriminator(in_dim: int, hidden: tuple[int, ...], generator: torch.Generator,
                        device: torch.device | str = "cpu") -> nn.Sequential:
    """MLP ``in_dim -> hidden... -> 1`` with ReLU; hidden weights U(+-1/sqrt(fan_in)) (torch's default scale), output
    weights U(-1, 1) (MimicKit), all biases zero; every draw from ``generator``."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h, device=device), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, 1, device=device))
    with torch.no_grad():
        for m in layers:
            if isinstance(m, nn.Linear):
                bound = 1.0 if m is layers[-1] else 1.0 / math.sqrt(m.in_features)
                u = torch.rand(m.weight.shape, generator=generator, device=generator.device)
                m.weight.copy_((2 * u - 1) * bound)
                m.bias.zero_()
    return nn.Sequential(*layers)


class DiffNormalizer:
    """Running mean of |Delta| per feature, count-weighted (MimicKit's DiffNormalizer; no centring, no clipping).

    ``normalize(x) = x / max(mean_abs, floor)``. Starts at mean_abs = 1 (identity) with count 0, so the first
    :meth:`record` replaces it entirely.
    """

    def __init__(self, dim: int, floor: float, device: torch.device | str = "cpu"):
        self.mean_abs = torch.ones(dim, device=device)
        """[D] running mean of |Delta|."""
        self.count = 0
        """Residuals recorded so far."""
        self.floor = float(floor)

    def record(self, x: torch.Tensor) -> None:
        """Fold residuals ``x`` [M, D] into the running mean."""
        m = x.shape[0]
        if m == 0:
            return
        batch = x.abs().mean(0)
        total = self.count + m
        self.mean_abs = self.mean_abs * (self.count / total) + batch * (m / total)
        self.count = total

    def scale(self) -> torch.Tensor:
        """[D] the divisor max(mean_abs, floor)."""
        return self.mean_abs.clamp_min(self.floor)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.scale()


class ResidualReplay:
    """Ring buffer of raw residuals [capacity, D] with MimicKit's push rule: every new residual while the buffer is
    not full, afterwards ``push_count`` random ones per push. Storage grows by doubling up to ``capacity``."""

    def __init__(self, dim: int, capacity: int, push_count: int, device: torch.device | str = "cpu"):
        self.dim, self.capacity, self.push_count = dim, int(capacity), int(push_count)
        self.data = torch.zeros(0, dim, device=device)
        """[allocated, D] storage; rows ``[0, size)`` hold residuals."""
        self.head = 0
        """Next row to write."""
        self.size = 0
        """Rows filled (<= capacity)."""

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    def _reserve(self, n: int) -> None:
        want = min(self.capacity, n)
        if self.data.shape[0] >= want:
            return
        new = min(self.capacity, max(want, 2 * self.data.shape[0]))
        grown = torch.zeros(new, self.dim, device=self.data.device, dtype=self.data.dtype)
        grown[: self.data.shape[0]] = self.data
        self.data = grown

    def push(self, x: torch.Tensor, generator: torch.Generator) -> int:
        """Store residuals ``x`` [M, D] by the push rule; returns how many were stored."""
        m = x.shape[0]
        if m == 0:
            return 0
        perm = torch.randperm(m, generator=generator, device=generator.device).to(x.device)
        n = min(m, self.push_count) if self.full else min(m, self.capacity)
        x = x[perm[:n]]
        self._reserve(self.size + n)
        idx = (self.head + torch.arange(n, device=x.device)) % self.capacity
        self.data[idx] = x.to(self.data)
        self.head = (self.head + n) % self.capacity
        self.size = min(self.capacity, self.size + n)
        return n

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` residuals drawn uniformly with replacement [n, D] (empty if the buffer is)."""
        if self.size == 0 or n == 0:
            return self.data[:0]
        idx = torch.randint(0, self.size, (n,), generator=generator, device=generator.device)
        return self.data[idx.to(self.data.device)]


class ADDReward:
    """The ADD reward of an environment: a reward callable ``reward(sim, ref, ctx) -> [N]`` and its discriminator.

    Args:
        env: the environment whose feature function (``env.feature_fn``) defines the residuals; its device is used.
        config: :class:`ADDConfig`.
        seed: seeds the discriminator's own generator (initialisation, minibatches, replay push and sampling).
    """

    def __init__(self, env: G1TrackingVectorEnv, config: ADDConfig | None = None, seed: int = 0):
        self.config = config if config is not None else ADDConfig()
        cfg = self.config
        self.feature_fn = env.feature_fn
        self.device = torch.device(env.device)
        # the generator lives on the CPU: its draws are then identical on every device
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        probe = self.feature_fn.disc(env.ref_features(torch.zeros(1, dtype=torch.long, device=self.device)))
        self.dim = int(probe.shape[-1])
        """Residual dimension (233 for the G1)."""
        self.disc = build_discriminator(self.dim, tuple(cfg.hidden), self.generator, self.device)
        self.optimizer = torch.optim.SGD(self.disc.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                         weight_decay=cfg.weight_decay)
        self.normalizer = DiffNormalizer(self.dim, cfg.norm_floor, self.device)
        self.replay = ResidualReplay(self.dim, cfg.replay_capacity, cfg.replay_push, self.device)
        self._pending: list[torch.Tensor] = []
        self.num_updates = 0
        """Discriminator updates so far."""
        self._freeze()

    # ------------------------------------------------------------------------------------------------ reward

    def _freeze(self) -> None:
        """Constant copies of the parameters and the normaliser for the reward (refreshed after every update), so
        the reward's graph never reaches the trainable parameters and an optimiser step cannot invalidate it."""
        self._frozen = {k: v.detach().clone() for k, v in self.disc.named_parameters()}
        self._frozen_scale = self.normalizer.scale().clone()

    def residual(self, sim: Features, ref: Features) -> torch.Tensor:
        """Delta = phi(ref) - phi(sim) [N, D], differentiable in ``sim`` (reference detached)."""
        phi_ref = self.feature_fn.disc(Features(*[x.detach() for x in ref]))
        return phi_ref - self.feature_fn.disc(sim)

    def logit_of_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [M] of normalised residuals ``x`` [M, D] through the frozen discriminator (constant parameters,
        cast to ``x``'s dtype so a float64 check runs in float64)."""
        params = {k: v.to(x.dtype) for k, v in self._frozen.items()}
        return functional_call(self.disc, params, (x,))[:, 0]

    def reward_of_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """``reward_scale softplus(min(l(x), logit_clamp))`` [M] of normalised residuals ``x`` [M, D]."""
        cfg = self.config
        return cfg.reward_scale * nn.functional.softplus(self.logit_of_normalized(x).clamp(max=cfg.logit_clamp))

    def __call__(self, sim: Features, ref: Features, ctx: StepContext) -> torch.Tensor:
        """Reward [N] of one step; records the detached residuals for the next :meth:`update`."""
        delta = self.residual(sim, ref)
        self.record(delta)
        x = delta / self._frozen_scale.to(delta.dtype)
        r = self.reward_of_normalized(x)
        if self.config.action_rate_weight > 0:
            r = r - self.config.action_rate_weight * (ctx.actions - ctx.prev_actions).pow(2).sum(1)
        return r

    def record(self, delta: torch.Tensor) -> None:
        """Keep raw residuals ``delta`` [M, D] (detached; rows with a non-finite entry dropped, so a diverged
        environment cannot poison the normaliser and the replay) for the next :meth:`update`."""
        if delta.ndim != 2 or delta.shape[1] != self.dim:
            raise ValueError(f"residuals must have shape [M, {self.dim}], got {list(delta.shape)}")
        d = delta.detach().to(self.device, torch.float32)
        self._pending.append(d[torch.isfinite(d).all(1)])

    @property
    def num_pending(self) -> int:
        """Residuals recorded since the last :meth:`update`."""
        return sum(int(p.shape[0]) for p in self._pending)

    # ------------------------------------------------------------------------------------------------ update

    def loss(self, neg: torch.Tensor) -> dict[str, torch.Tensor]:
        """Discriminator loss on normalised negatives ``neg`` [M, D] and the zero positive (trainable parameters).

        0.5 (softplus(-l(0)) + mean softplus(l(neg))) + logit_reg |w_out|^2
        + grad_penalty 0.5 (mean |dl/dneg|^2 + |dl/d0|^2).
        """
        cfg = self.config
        neg = neg.detach().requires_grad_(True)
        pos = torch.zeros(1, self.dim, device=neg.device, dtype=neg.dtype, requires_grad=True)
        l_pos = self.disc(pos)[:, 0]
        l_neg = self.disc(neg)[:, 0]
        cls = 0.5 * (nn.functional.softplus(-l_pos).mean() + nn.functional.softplus(l_neg).mean())
        w_out = self.disc[-1].weight
        logit_loss = w_out.pow(2).sum()
        g_neg, g_pos = torch.autograd.grad((l_neg.sum(), l_pos.sum()), (neg, pos), create_graph=True)
        gp_neg = g_neg.pow(2).sum(1).mean()
        gp_pos = g_pos.pow(2).sum(1).mean()
        gp = 0.5 * (gp_neg + gp_pos)
        total = cls + cfg.logit_reg * logit_loss + cfg.grad_penalty * gp
        return {"disc_loss": total, "disc_cls_loss": cls, "disc_grad_penalty": gp, "disc_logit_loss": logit_loss,
                "disc_logit_pos": l_pos.mean(), "disc_logit_neg": l_neg.mean(),
                "disc_acc_pos": (l_pos > 0).float().mean(), "disc_acc_neg": (l_neg < 0).float().mean()}

    def update(self) -> dict[str, float]:
        """One discriminator update from the residuals recorded since the previous call, then clear them.

        Order: the normaliser absorbs the new residuals; ``epochs`` passes of ``minibatches`` minibatches, each
        minibatch's negatives = its current residuals + as many sampled from the replay buffer (none while it is
        empty), normalised with the updated statistic; then the new residuals enter the replay buffer (MimicKit
        stores after the update, so a replay sample is never a current residual). Returns the means over the
        minibatches of :meth:`loss`'s terms, plus ``disc_residuals`` and ``disc_replay_size``; NaN losses (and no
        step) when nothing was recorded.
        """
        cfg = self.config
        raw = torch.cat(self._pending) if self._pending else torch.zeros(0, self.dim, device=self.device)
        self._pending = []
        m = raw.shape[0]
        out: dict[str, float] = {}
        if m == 0:
            names = ("disc_loss", "disc_cls_loss", "disc_grad_penalty", "disc_logit_loss", "disc_logit_pos",
                     "disc_logit_neg", "disc_acc_pos", "disc_acc_neg")
            out = dict.fromkeys(names, float("nan"))
        else:
            # normalise with the statistic the next rewards will use, so the discriminator is trained in the same
            # coordinates (MimicKit updates it after the model; at its first update that mixes two scalings)
            self.normalizer.record(raw)
            scale = self.normalizer.scale()
            sums: dict[str, float] = {}
            count = 0
            for _ in range(cfg.epochs):
                perm = torch.randperm(m, generator=self.generator).to(raw.device)
                for chunk in perm.tensor_split(min(cfg.minibatches, m)):
                    cur = raw[chunk]
                    neg = torch.cat([cur, self.replay.sample(cur.shape[0], self.generator)]) / scale
                    terms = self.loss(neg)
                    self.optimizer.zero_grad(set_to_none=True)
                    terms["disc_loss"].backward()
                    self.optimizer.step()
                    for k, v in terms.items():
                        sums[k] = sums.get(k, 0.0) + float(v.detach())
                    count += 1
            self.optimizer.zero_grad(set_to_none=True)  # free them; the reward never writes into them
            out = {k: v / count for k, v in sums.items()}
            self.replay.push(raw, self.generator)
            self.num_updates += 1
        self._freeze()
        out["disc_residuals"] = float(m)
        out["disc_replay_size"] = float(self.replay.size)
        return out

    # ------------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimiser, normaliser, replay contents and position, pending residuals, generator state: only
        tensors and plain values (``torch.load(..., weights_only=True)`` reads it)."""
        return {
            "config": asdict(self.config),
            "disc": {k: v.detach().clone() for k, v in self.disc.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "norm_mean_abs": self.normalizer.mean_abs.clone(),
            "norm_count": int(self.normalizer.count),
            "replay_data": self.replay.data[: self.replay.size].clone(),
            "replay_head": int(self.replay.head),
            "pending": (torch.cat(self._pending) if self._pending
                        else torch.zeros(0, self.dim, device=self.device)).clone(),
            "generator": self.generator.get_state(),
            "num_updates": int(self.num_updates),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (same residual dimension and network shape)."""
        missing = {"disc", "optimizer", "norm_mean_abs", "norm_count", "replay_data", "replay_head", "pending",
                   "generator", "num_updates"} - set(state)
        if missing:
            raise ValueError(f"ADD state is missing {sorted(missing)}")
        hidden = tuple(state.get("config", {}).get("hidden", self.config.hidden))
        if hidden != tuple(self.config.hidden):
            raise ValueError(f"ADD state has a discriminator with hidden layers {list(hidden)}, this reward "
                             f"{list(self.config.hidden)}")
        data = state["replay_data"]
        if data.ndim != 2 or data.shape[1] != self.dim or data.shape[0] > self.replay.capacity:
            raise ValueError(f"ADD state: replay data has shape {list(data.shape)}, expected [<= "
                             f"{self.replay.capacity}, {self.dim}]")
        self.disc.load_state_dict(state["disc"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.normalizer.mean_abs = state["norm_mean_abs"].to(self.device).clone()
        self.normalizer.count = int(state["norm_count"])
        self.replay.data = data.to(self.device).clone()
        self.replay.size = int(data.shape[0])
        self.replay.head = int(state["replay_head"])
        pending = state["pending"].to(self.device)
        self._pending = [pending.clone()] if pending.shape[0] else []
        self.generator.set_state(state["generator"].cpu())
        self.num_updates = int(state["num_updates"])
        self._freeze()
