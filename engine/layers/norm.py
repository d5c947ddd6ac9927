"""RMSNorm as HF computes it; the module holds the weight and eps, the op runs on ``ctx.kernels``, alone or folded
into the projection that reads its output."""

from __future__ import annotations

import torch
from torch import nn

from ..core import Context


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return ctx.kernels.rms_norm(x, self.weight, self.eps)

    def forward_residual(
        self, x: torch.Tensor, residual: torch.Tensor, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        if ctx.kernels.fuses_residual:
            return ctx.kernels.add_rms_norm(x, residual, self.weight, self.eps)
        x = x + residual
        return self.forward(x, ctx), x

    def forward_linear(
        self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
        ctx: Context,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(F.linear(norm(x + residual), weight, bias), x + residual); residual None: (F.linear(norm(x), ...), x)."""
        if ctx.kernels.fuses_residual:
            return ctx.kernels.norm_linear(x, residual, self.weight, self.eps, weight, bias)
        normed, residual = (self.forward(x, ctx), x) if residual is None else self.forward_residual(x, residual, ctx)
        return ctx.kernels.linear(normed, weight, bias), residual
