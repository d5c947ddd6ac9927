"""Linear layers, tensor-parallel in the Megatron layout: a Linear is replicated, a ColumnParallelLinear holds its
rank's output features (q/k/v and gate/up merged), a RowParallelLinear its input features and all-reduces the partial
sum; each cuts its slice from the checkpoint tensor (load_slice). Products run on ctx.kernels.linear; on CUDA a
narrowing weight is kept column-major, where cuBLAS's batch-1 GEMV is faster with the same result (RESULTS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ..distributed.info import TPInfo

if TYPE_CHECKING:
    from ..core import Context


class Linear(nn.Module):
    """Replicated: every rank holds the whole weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return ctx.kernels.linear(x, self.weight, self.bias)

    def load_slice(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of the checkpoint tensor for parameter `leaf` (weight or bias)."""
        return full


class ColumnParallelLinear(Linear):
    """Output features split over the TP ranks; out_features is this rank's share."""

    def __init__(self, in_features: int, out_features: int, tp: TPInfo, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.tp = tp

    def load_slice(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return full.chunk(self.tp.size, dim=0)[self.tp.rank] if self.tp.size > 1 else full


class MergedLinear(ColumnParallelLinear):
    """Several HF projections stacked along the output dim, each split over the ranks; `shards` names them with
    this rank's sizes."""

    def __init__(self, in_features: int, shards: dict[str, int], tp: TPInfo, bias: bool = False) -> None:
        super().__init__(in_features, sum(shards.values()), tp, bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shards.items():
            self.shard_offsets[name] = (start, size)
            start += size


class RowParallelLinear(Linear):
    """Input features split over the TP ranks (in_features is this rank's share); the partial outputs are summed
    across the ranks. No bias: it would be added once per rank."""

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
    """Restride the weight of every unmerged Linear whose input is wider than its output (see the module doc)."""
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, Linear) or isinstance(module, MergedLinear):
                continue
            if module.weight.shape[1] > module.weight.shape[0]:
                module.weight.data = module.weight.data.t().contiguous().t()
