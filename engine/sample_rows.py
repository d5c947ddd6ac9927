"""The torch sampler's full-vocabulary row passes, behind one interface: in torch (the reference, HF's op sequence)
and, on CUDA, the Triton ones of engine/sample_rows_triton.py, which give a row the same bits whatever its batch and
keep many programs busy on a single row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .device import triton_kernels_run_on


def softmax(x: torch.Tensor) -> torch.Tensor:
    return x.softmax(dim=-1)


def top_p_removed(values: torch.Tensor, kth: torch.Tensor | None, cut: torch.Tensor) -> torch.Tensor:
    """int64 [bs]: how many of each ascending row's first tokens top-p removes (cumulative mass <= cut, never the
    last), values below kth (top-k's, if any) counted as -inf."""
    if kth is not None:
        values = values.masked_fill(values < kth.unsqueeze(1), float("-inf"))
    cumulative = values.softmax(dim=-1).cumsum(dim=-1)
    return (cumulative[:, :-1] <= cut.unsqueeze(1)).sum(dim=-1)


def keep_from(scores: torch.Tensor, value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """scores with -inf before (value, index) in the stable ascending order: lower scores, and ties at lower index."""
    cols = torch.arange(scores.shape[1], device=scores.device)
    value, index = value.unsqueeze(1), index.unsqueeze(1)
    return scores.masked_fill((scores < value) | ((scores == value) & (cols < index)), float("-inf"))


@dataclass(frozen=True)
class RowPasses:
    softmax: Callable[[torch.Tensor], torch.Tensor]
    top_p_removed: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]
    keep_from: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


TORCH_ROW_PASSES = RowPasses(softmax, top_p_removed, keep_from)


def row_passes_for(device: torch.device) -> RowPasses:
    if triton_kernels_run_on(device):
        from . import sample_rows_triton as kernels

        return RowPasses(kernels.softmax, kernels.top_p_removed, kernels.keep_from)
    return TORCH_ROW_PASSES
