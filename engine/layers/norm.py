"""RMSNorm computed the way HF computes it: in float32, cast back, then scaled by the weight."""

from __future__ import annotations

import torch
from torch import nn

from .kernels import TORCH_KERNELS, LayerKernels


class RMSNorm(nn.Module):
    kernels: LayerKernels = TORCH_KERNELS  # the engine installs its choice (see kernels.install_kernels)

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def forward_residual(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused residual add: returns (norm(x + residual), x + residual)."""
        if self.kernels.fuses_residual:
            return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)
        x = x + residual
        return self.forward(x), x
