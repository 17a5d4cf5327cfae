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
from collections.abc import Sequence
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
    """K independent value MLPs V_k(o) (orthogonal initialisation, gain sqrt(2), zero biases)."""

    def __init__(self, obs_dim: int, hidden: Sequence[int], num_critics: int = 3, activation: Activation = "elu",
                 layer_norm: bool = True):
        super().__init__()
        if int(num_critics) < 1:
            raise ValueError(f"num_critics must be >= 1, got {num_critics!r}")
        self.critics = nn.ModuleList(orthogonal_init_(mlp(obs_dim, hidden, 1, activation, layer_norm))
                                     for _ in range(int(num_critics)))

    @property
    def num_critics(self) -> int:
        return len(self.critics)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Values [K, B] of normalised observations ``obs`` [B, D], one row per critic."""
        return torch.stack([c(obs)[..., 0] for c in self.critics], 0)

    def mean(self, obs: torch.Tensor) -> torch.Tensor:
        """[B] mean over the critics (SAPO's actor bootstrap, ``actor_loss_avgcritics``)."""
        return self(obs).mean(0)

    def min(self, obs: torch.Tensor) -> torch.Tensor:
        """[B] minimum over the critics (the pessimistic bootstrap of the TD(lambda) critic targets)."""
        return self(obs).amin(0)
