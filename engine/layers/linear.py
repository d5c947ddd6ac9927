"""Linear layers, tensor-parallel in the Megatron layout (column-parallel output features, row-parallel input features
all-reduced), each cutting its slice of the checkpoint tensor; products run on ctx.kernels.linear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..distributed.info import TPInfo

if TYPE_CHECKING:
    from ..core import Context


class Linear(nn.Module):

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return ctx.kernels.linear(x, self.weight, self.bias)

    def load_slice(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return full


class ColumnParallelLinear(Linear):
    """out_features is this rank's share."""

    def __init__(self, in_features: int, out_features: int, tp: TPInfo, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.tp = tp

    def load_slice(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp.size, dim=0)[self.tp.rank] if self.tp.size > 1 else full


class MergedLinear(ColumnParallelLinear):
    """Several HF projections stacked on the output dim; `shards` names them with this rank's sizes."""

    def __init__(self, in_features: int, shards: dict[str, int], tp: TPInfo, bias: bool = False) -> None:
        super().__init__(in_features, sum(shards.values()), tp, bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shards.items():
            self.shard_offsets[name] = (start, size)
            start += size


class RowParallelLinear(Linear):
    """in_features is this rank's share; the partial outputs are all-reduced, so no bias."""

    def __init__(self, in_features: int, out_features: int, tp: TPInfo) -> None:
        super().__init__(in_features, out_features)
        self.tp = tp

    def forward(self, x: torch.Tensor, ctx: Context, gated: bool = False) -> torch.Tensor:
        """gated: x is a merged [gate | up] projection, and the layer's input is SiLU(gate) * up."""
        out = ctx.kernels.linear(x, self.weight, gated=gated)
        return ctx.comm.all_reduce(out) if self.tp.size > 1 else out

    def load_slice(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp.size, dim=1)[self.tp.rank] if self.tp.size > 1 else full


def narrowing_weights_column_major(model: nn.Module) -> None:
    """Column-major narrowing weights: cuBLAS's batch-1 GEMV is faster on them, same result (RESULTS.md)."""
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, Linear) or isinstance(module, MergedLinear):
                continue
            if module.weight.shape[1] > module.weight.shape[0]:
                module.weight.data = module.weight.data.t().contiguous().t()
