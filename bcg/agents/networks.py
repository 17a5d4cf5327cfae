"""Networks of the first-order agents (SHAC): a Gaussian actor, a critic MLP and an ensemble of critics.

Layout as in DiffRL (``models/actor.py``, ``models/critic.py``; docs/method.md §5.1): every hidden layer is
Linear -> activation -> LayerNorm. The actor's mean network is a plain :class:`torch.nn.Sequential` of ``Linear``,
activation and ``LayerNorm`` modules, so that :func:`bcg.agents.export.policy_export` can write it out. Its
log-std is one learned parameter per action dimension, independent of the state.

Initialisation (docs/method.md §5.1): critics orthogonal, gain sqrt(2), zero biases (every layer, the output layer
included); the stochastic actor's mean network keeps PyTorch's default initialisation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from torch import nn

__all__ = ["ACTIVATIONS", "CriticEnsemble", "GaussianActor", "mlp", "orthogonal_init_"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}
"""Activation names accepted by :func:`mlp` (the module types the policy export understands)."""

Activation = Literal["elu", "relu", "tanh", "silu"]


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: Activation = "elu",
        layer_norm: bool = True) -> nn.Sequential:
    """``Linear -> act -> [LayerNorm]`` per hidden width, then a final ``Linear`` to ``out_dim`` (no activation).

    Args:
        in_dim: input features D.
        hidden: hidden widths, e.g. ``(512, 256, 128)``.
        out_dim: outputs.
        activation: one of :data:`ACTIVATIONS`.
        layer_norm: add a LayerNorm after every hidden activation (DiffRL's order).
    Returns:
        an ``nn.Sequential`` mapping [..., in_dim] to [..., out_dim].
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    d = int(in_dim)
    for width in hidden:
        layers += [nn.Linear(d, int(width)), ACTIVATIONS[activation]()]
        if layer_norm:
            layers.append(nn.LayerNorm(int(width)))
        d = int(width)
    layers.append(nn.Linear(d, int(out_dim)))
    return nn.Sequential(*layers)


def orthogonal_init_(module: nn.Module, gain: float = math.sqrt(2.0)) -> nn.Module:
    """Orthogonal weights with ``gain`` and zero biases for every ``Linear`` inside ``module`` (in place)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight, gain=gain)
            nn.init.zeros_(m.bias)
    return module


class GaussianActor(nn.Module):
    """pi(a | o) = N(mean_net(o), diag(exp(log_std))^2) with a state-independent learned ``log_std`` [A].

    The sampled action is the raw action a (the environment applies tanh). Sampling is reparameterised, so the
    action is differentiable w.r.t. the mean network and ``log_std``.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], activation: Activation = "elu",
                 layer_norm: bool = True, init_std: float = 1.0, output_scale: float = 1.0):
        super().__init__()
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std!r}")
        if not output_scale >= 0:
            raise ValueError(f"output_scale must be >= 0, got {output_scale!r}")
        self.mean_net = mlp(obs_dim, hidden, act_dim, activation, layer_norm)
        """The deterministic policy: normalised observation [..., D] -> mean raw action [..., A]."""
        if output_scale != 1.0:  # a smaller first policy: mean actions near 0 (the default pose)
            with torch.no_grad():
                self.mean_net[-1].weight.mul_(output_scale)
                self.mean_net[-1].bias.mul_(output_scale)
        self.log_std = nn.Parameter(torch.full((int(act_dim),), math.log(init_std)))
        """[A] log standard deviation of the action noise (learned, shared by all states)."""

    def forward(self, obs: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Actions [B, A] for normalised observations ``obs`` [B, D]: ``mean + exp(log_std) * noise`` with
        ``noise`` [B, A] standard normal (drawn by the caller, so that its generator is the caller's), or the mean
        when ``noise`` is None (the deterministic policy)."""
        mean = self.mean_net(obs)
        if noise is None:
            return mean
        return mean + self.log_std.exp() * noise

    @property
    def std(self) -> torch.Tensor:
        """[A] current standard deviation of the action noise."""
        return self.log_std.exp()


class CriticEnsemble(nn.Module):
    """K value MLPs V_k(o) evaluated as one batched network (orthogonal initialisation, gain sqrt(2), zero biases).

    Each critic is ``mlp(obs_dim, hidden, 1)``; their weights are stacked along a leading critic axis so that a
    forward and backward pass costs a few large operations instead of K times a dozen small ones. All critics read
    the same observation, so the first layer is one matrix product ``[B, D] @ [D, K H_1]``; the later layers are
    batched products ``[K, B, H] @ [K, H, H']``. Parameters (``l`` the layer index, ``H_l`` its width):

    * ``weight_l`` [K, H_l, H_{l-1}] and ``bias_l`` [K, H_l] (``nn.Linear``'s [out, in] layout per critic);
    * ``norm_weight_l`` / ``norm_bias_l`` [K, H_l], the per-critic LayerNorm affine (when ``layer_norm``).

    :meth:`critic_mlp` returns critic k as a plain ``nn.Sequential`` (for export and tests); its outputs equal row k
    of :meth:`forward` up to float32 rounding.
    """

    def __init__(self, obs_dim: int, hidden: Sequence[int], num_critics: int = 3, activation: Activation = "elu",
                 layer_norm: bool = True):
        super().__init__()
        if int(num_critics) < 1:
            raise ValueError(f"num_critics must be >= 1, got {num_critics!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.obs_dim, self.hidden = int(obs_dim), tuple(int(w) for w in hidden)
        self.activation, self.layer_norm = activation, bool(layer_norm)
        self.act = ACTIVATIONS[activation]()
        # initialise each critic as its own mlp (same draws, same order as K separate modules), then stack
        members = [orthogonal_init_(mlp(obs_dim, hidden, 1, activation, layer_norm)) for _ in range(int(num_critics))]
        self._k = int(num_critics)
        linears = [[m for m in member if isinstance(m, nn.Linear)] for member in members]
        norms = [[m for m in member if isinstance(m, nn.LayerNorm)] for member in members]
        for i in range(len(self.hidden) + 1):
            self.register_parameter(f"weight_{i}", nn.Parameter(torch.stack([ls[i].weight.detach() for ls in linears])))
            self.register_parameter(f"bias_{i}", nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears])))
        for i in range(len(self.hidden) if self.layer_norm else 0):
            self.register_parameter(f"norm_weight_{i}",
                                    nn.Parameter(torch.stack([ns[i].weight.detach() for ns in norms])))
            self.register_parameter(f"norm_bias_{i}", nn.Parameter(torch.stack([ns[i].bias.detach() for ns in norms])))

    @property
    def num_critics(self) -> int:
        return self._k

    def _hidden_out(self, h: torch.Tensor, i: int) -> torch.Tensor:
        """Activation and the per-critic LayerNorm of hidden layer ``i`` on pre-activations [K, B, H_i]."""
        h = self.act(h)
        if self.layer_norm:
            h = nn.functional.layer_norm(h, (h.shape[-1],), eps=1e-5)
            h = torch.addcmul(getattr(self, f"norm_bias_{i}")[:, None], h, getattr(self, f"norm_weight_{i}")[:, None])
        return h

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Values [K, B] of normalised observations ``obs`` [B, D], one row per critic."""
        k, layers = self._k, len(self.hidden) + 1
        w0, b0 = self.weight_0, self.bias_0
        # first layer: one [B, D] x [D, K H] product, since every critic reads the same observation
        h = nn.functional.linear(obs, w0.reshape(-1, w0.shape[-1]), b0.reshape(-1))
        h = h.reshape(obs.shape[0], k, w0.shape[1]).transpose(0, 1)            # [K, B, H_0]
        for i in range(1, layers):
            h = self._hidden_out(h, i - 1)
            w, b = getattr(self, f"weight_{i}"), getattr(self, f"bias_{i}")
            h = torch.baddbmm(b[:, None], h, w.transpose(1, 2))              # [K, B, H_i]
        return h[..., 0]

    def critic_mlp(self, k: int) -> nn.Sequential:
        """Critic ``k`` as a separate ``mlp`` (a copy of its weights, no shared storage)."""
        if not 0 <= int(k) < self._k:
            raise IndexError(f"critic index {k} out of range for {self._k} critics")
        net = mlp(self.obs_dim, self.hidden, 1, self.activation, self.layer_norm).to(self.weight_0.device)
        linears = [m for m in net if isinstance(m, nn.Linear)]
        norms = [m for m in net if isinstance(m, nn.LayerNorm)]
        with torch.no_grad():
            for i, lin in enumerate(linears):
                lin.weight.copy_(getattr(self, f"weight_{i}")[k])
                lin.bias.copy_(getattr(self, f"bias_{i}")[k])
            for i, ln in enumerate(norms):
                ln.weight.copy_(getattr(self, f"norm_weight_{i}")[k])
                ln.bias.copy_(getattr(self, f"norm_bias_{i}")[k])
        return net

    def separate_names(self) -> dict[str, tuple[str, int]]:
        """The parameter names of the earlier layout, K separate ``mlp`` modules in an ``nn.ModuleList`` named
        ``critics`` (``critics.{k}.{i}.weight``), in that layout's parameter order, each mapped to (this module's
        parameter name, critic index k). Used to read checkpoints written before the critics were stacked."""
        step = 3 if self.layer_norm else 2  # Linear, activation[, LayerNorm] per hidden layer
        names: dict[str, tuple[str, int]] = {}
        for k in range(self._k):
            for j in range(len(self.hidden) + 1):
                names[f"critics.{k}.{step * j}.weight"] = (f"weight_{j}", k)
                names[f"critics.{k}.{step * j}.bias"] = (f"bias_{j}", k)
                if self.layer_norm and j < len(self.hidden):
                    names[f"critics.{k}.{step * j + 2}.weight"] = (f"norm_weight_{j}", k)
                    names[f"critics.{k}.{step * j + 2}.bias"] = (f"norm_bias_{j}", k)
        return names

    def stack_separate_state_dict(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A state dict of the separate-critics layout (see :meth:`separate_names`) in this module's layout."""
        names = self.separate_names()
        if set(state) != set(names):
            raise ValueError(f"not a state of {self._k} separate critics with hidden widths {list(self.hidden)}: "
                             f"keys {sorted(state)[:4]}...")
        parts: dict[str, list[torch.Tensor | None]] = {n: [None] * self._k for n, _ in self.named_parameters()}
        for old, (new, k) in names.items():
            parts[new][k] = state[old]
        return {n: torch.stack(ts) for n, ts in parts.items()}  # type: ignore[arg-type]

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        """[B] mean over the critics (SAPO's actor bootstrap, ``actor_loss_avgcritics``)."""
        return self(obs).mean(0)

    def min(self, obs: torch.Tensor) -> torch.Tensor:
        """[B] minimum over the critics (the pessimistic bootstrap of the TD(lambda) critic targets)."""
        return self(obs).amin(0)
