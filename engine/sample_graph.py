"""The parameter block of a sampled batch drawn inside a captured decode step: one int64 [6, padded bs] tensor
(greedy, temperature, top-k, top-p and min-p as float64 bits, then the row seeds) packed on the host at prepare,
copied into the static buffer of its size before the replay, and read there as tensors, padding rows greedy."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .core import SamplingParams
from .device import upload


def _floats(rows: list[tuple[float, ...]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64).T.contiguous().view(torch.int64)


def _greedy_row(vocab: int) -> tuple[float, ...]:
    return (1.0, 1.0, float(vocab), 1.0, 0.0)  # every filter off


def pack(params: Sequence[SamplingParams], row_seeds: Sequence[int | None], pad: int, vocab: int) -> torch.Tensor:
    rows = [(float(p.is_greedy), 1.0 if p.is_greedy else p.temperature, p.top_k if 0 < p.top_k < vocab else vocab,
             p.top_p, p.min_p) for p in params]
    seeds = torch.tensor([[seed or 0 for seed in row_seeds] + [0] * pad])
    return torch.cat([_floats(rows + [_greedy_row(vocab)] * pad), seeds])


def unpack(block: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(greedy bool, temperature float32, top_k int64, top_p float64, min_p float32, seeds int64), each [bs]."""
    p = block[:5].view(torch.float64)
    return p[0] > 0.5, p[1].float(), p[2].long(), p[3], p[4].float(), block[5]


class StaticParams:
    """One parameter block per captured size on the device, greedy until a batch loads its own."""

    def __init__(self, device: torch.device, vocab: int) -> None:
        self.device, self.vocab = device, vocab
        self._blocks: dict[int, torch.Tensor] = {}

    def block(self, bs: int) -> torch.Tensor:
        if bs not in self._blocks:
            greedy = torch.cat([_floats([_greedy_row(self.vocab)] * bs), torch.zeros(1, bs, dtype=torch.int64)])
            self._blocks[bs] = upload(greedy, self.device)
        return self._blocks[bs]

    def load(self, block: torch.Tensor) -> None:
        self.block(block.shape[1]).copy_(block, non_blocking=True)
