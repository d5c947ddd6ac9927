"""RMSNorm computed the way HF computes it: in float32, cast back, then scaled by the weight."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        # HF casts back to the input dtype before the weight multiply; doing it after changes bf16 results.
        return self.weight * h.to(dtype)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused residual add: returns (norm(x + residual), x + residual)."""
        x = x + residual
        return self.forward(x), x
