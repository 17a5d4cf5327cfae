"""An identity whose backward pass zeroes flagged rows: how a non-finite environment or branch is kept out of the
gradient of the others."""

from __future__ import annotations

import torch

__all__ = ["RowGradMask"]


class RowGradMask(torch.autograd.Function):
    """Identity on ``x`` [M, ...] whose backward zeroes the rows flagged in ``holder["drop"]`` ([M] bool, filled in
    after the forward pass, once it is known which rows became non-finite).

    Placed on the simulator's inputs, it blocks the adjoint of those rows (which can itself be non-finite) without
    touching the gradient paths of the other rows or the other uses of the same tensor.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, holder: dict) -> torch.Tensor:  # type: ignore[override]
        ctx.holder = holder
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        drop = ctx.holder.get("drop")
        if drop is not None and bool(drop.any()):
            g = torch.where(drop.reshape(-1, *([1] * (g.dim() - 1))), torch.zeros_like(g), g)
        return g, None
