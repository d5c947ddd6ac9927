"""The parameter block of a sampled batch: one uint8 tensor packed on the host and uploaded once per run of the same
params, whose segments (top-k, top-p, request seeds, temperature, min-p, top-p and top-k as FlashInfer's kernels take
them, greedy, each [padded bs] of its own dtype) are read as views, so the batch's per-row tensors and the captured
step's parameters cost no kernel; for a graph batch it is copied into the static buffer of its size before the replay
(unless already there), padding rows greedy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from .core import SamplingParams
from .device import host_tensor, upload

# Widest dtype first, so every segment starts aligned to its element size.
_DTYPES = (
    torch.int64, torch.float64, torch.int64, torch.float32, torch.float32, torch.float32, torch.int32, torch.bool
)
TOP_P_OFF = 2.0  # FlashInfer's top-p threshold on rows without top-p: top_p = 1 can still reject a tail token in fp32
ROW_BYTES = sum(dtype.itemsize for dtype in _DTYPES)


class Rows(NamedTuple):
    """A block's per-row tensors, views of it: top_k is vocab on rows without top-k, seeds 0 on unseeded rows."""

    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float64: the cut 1 - top_p is taken in double and then rounded, as HF does
    seeds: torch.Tensor  # int64
    temperature: torch.Tensor  # float32; 1.0 on greedy rows
    min_p: torch.Tensor  # float32
    top_p_cut: torch.Tensor  # float32: top_p rounded once, TOP_P_OFF on rows without top-p (FlashInfer's threshold)
    top_k_int: torch.Tensor  # int32: top_k (FlashInfer's kernels take int32)
    greedy: torch.Tensor  # bool


def pack(params: Sequence[SamplingParams], pad: int, vocab: int) -> torch.Tensor:
    """uint8 [ROW_BYTES * (len(params) + pad)] on the host; the pad rows are greedy with every filter off."""
    top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params] + [vocab] * pad
    columns: tuple[Sequence[float], ...] = (
        top_k,
        [p.top_p for p in params] + [1.0] * pad,
        [p.seed or 0 for p in params] + [0] * pad,
        [1.0 if p.is_greedy else p.temperature for p in params] + [1.0] * pad,
        [p.min_p for p in params] + [0.0] * pad,
        [p.top_p if p.top_p < 1.0 else TOP_P_OFF for p in params] + [TOP_P_OFF] * pad,
        top_k,
        [p.is_greedy for p in params] + [True] * pad,
    )
    return torch.cat([host_tensor(column, dtype).view(torch.uint8) for column, dtype in zip(columns, _DTYPES)])


def upload_block(params: Sequence[SamplingParams], pad: int, vocab: int, device: torch.device) -> torch.Tensor:
    return upload(pack(params, pad, vocab), device)


def unpack(block: torch.Tensor, bs: int | None = None) -> Rows:
    """The first bs rows (all by default) of each segment, as views."""
    padded = block.numel() // ROW_BYTES
    segments, start = [], 0
    for dtype in _DTYPES:
        end = start + padded * dtype.itemsize
        segments.append(block[start:end].view(dtype)[:bs])
        start = end
    return Rows(*segments)


class StaticParams:
    """One parameter block per captured size on the device, greedy until a batch loads its own."""

    def __init__(self, device: torch.device, vocab: int) -> None:
        self.device, self.vocab = device, vocab
        self._blocks: dict[int, torch.Tensor] = {}
        self._loaded: dict[int, torch.Tensor] = {}  # the block last copied in, held so its identity stays unique

    def block(self, bs: int) -> torch.Tensor:
        if bs not in self._blocks:
            self._blocks[bs] = upload_block([], bs, self.vocab, self.device)
        return self._blocks[bs]

    def load(self, block: torch.Tensor) -> None:
        """Copy `block` in, unless it is the block copied in last (blocks are never written after their upload)."""
        bs = block.numel() // ROW_BYTES
        if self._loaded.get(bs) is not block:
            self.block(bs).copy_(block, non_blocking=True)
            self._loaded[bs] = block
