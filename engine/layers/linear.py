"""Linear layers. Merged projections (qkv, gate_up) are one weight filled shard by shard at load time.

On CUDA a Linear that narrows (input wider than output: o_proj, down_proj) keeps its weight column-major, as a
transposed view of a contiguous [in, out] tensor; the math is the same, and cuBLAS's batch-1 GEMV for the
Qwen3-0.6B o_proj takes 5.0 µs that way against 11.7 µs row-major, with bitwise equal results (RESULTS.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class MergedLinear(Linear):
    """Several HF projections stacked along the output dim; `shards` names them with their sizes."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shards.values()), bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shards.items():
            self.shard_offsets[name] = (start, size)
            start += size


def narrowing_weights_column_major(model: nn.Module) -> None:
    """Restride the weight of every plain Linear whose input is wider than its output (see the module doc)."""
    with torch.no_grad():
        for module in model.modules():
            if type(module) is Linear and module.weight.shape[1] > module.weight.shape[0]:
                module.weight.data = module.weight.data.t().contiguous().t()
