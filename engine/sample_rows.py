"""The sampler's full-vocabulary row passes, behind one interface: in torch (the reference, HF's op sequence) and, on
CUDA, the Triton ones of engine/sample_rows_triton.py, which give a row the same bits whatever its batch and keep many
programs busy on a single row; and the torch sampler's top-k and top-p filters built on them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from .device import triton_kernels_run_on


def softmax(x: torch.Tensor) -> torch.Tensor:
    return x.softmax(dim=-1)


def tempered_softmax(
    logits: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(softmax(logits / temperature), each row's first argmax of logits / temperature (int32, as sampled tokens
    are, so picking between them costs no cast), whether a row has a token to sample: a finite max and no NaN); a
    row without one gets a one-hot at token 0, so no later kernel sees NaN. Greedy rows have temperature 1, so
    theirs is the logits' own argmax."""
    scores = logits / temperature.unsqueeze(1)
    top, argmax = scores.max(dim=-1)  # max(dim) propagates NaN and gives the first index of the max
    finite = top.abs() < float("inf")
    one_hot = torch.zeros_like(scores[:1])
    one_hot[:, 0].fill_(1.0)  # a fill, not an item assignment: that would copy from the host and wait
    return torch.where(finite.unsqueeze(1), scores.softmax(dim=-1), one_hot), argmax.to(torch.int32), finite


def min_p_renorm(probs: torch.Tensor, min_p: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs without the tokens under min_p x the row's top probability, renormalized; the mass they kept)."""
    kept = probs * (probs >= (min_p * top).unsqueeze(1))
    mass = kept.sum(dim=-1)
    return kept / mass.unsqueeze(1), mass


def min_p_mask(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """HF's min-p: scores with -inf where softmax(scores) < min_p x the row's top probability."""
    probs = scores.softmax(dim=-1)
    return scores.masked_fill(probs < min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True), float("-inf"))


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


class ProbsByKeys(Protocol):
    """(logits holding 16-bit values, temperature, top_k, top_p, min_p, their dtype) → the filtered probabilities,
    from the logits' 16-bit keys (docs/sampling.md, keys)."""

    def __call__(self, logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                 top_p: torch.Tensor, min_p: torch.Tensor | None, key_dtype: torch.dtype, /) -> torch.Tensor: ...


@dataclass(frozen=True)
class RowPasses:
    # Top-k, top-p, min-p and the softmax from counts of the logits' 16-bit keys (CUDA's): no sort; None elsewhere.
    probs_by_keys: ProbsByKeys | None
    softmax: Callable[[torch.Tensor], torch.Tensor]
    top_p_removed: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], torch.Tensor]
    keep_from: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    tempered_softmax: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    min_p_renorm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    min_p_mask: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


TORCH_ROW_PASSES = RowPasses(None, softmax, top_p_removed, keep_from, tempered_softmax, min_p_renorm, min_p_mask)


def top_k_filter(scores: torch.Tensor, top_k: torch.Tensor, width: int) -> torch.Tensor:
    """HF's top-k alone: only the k-th largest value matters, so a topk as wide as the largest k, never a sort."""
    kth = scores.topk(width, dim=-1).values.gather(1, (top_k.clamp(max=width) - 1).unsqueeze(1))
    kth = kth.masked_fill((top_k >= scores.shape[-1]).unsqueeze(1), float("-inf"))
    return scores.masked_fill(scores < kth, float("-inf"))


KEYS_EXACT_BELOW = 2.0**16  # from here on, a temperature can round adjacent tiny 16-bit logits' quotients together


def top_k_top_p_filter(
    scores: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor, rows: RowPasses
) -> torch.Tensor:
    """HF's top-k (if any) then top-p from one stable ascending sort: the k-th largest score is read off the sorted
    row, and top-k's cut (a prefix of it) leaves the order top-p would sort the filtered row into. Both remove a prefix
    of that order, so the kept tokens are those at or after its first kept (score, index)."""
    values, order = scores.sort(dim=-1, stable=True)
    kth = None if top_k is None else values.gather(1, (scores.shape[-1] - top_k).unsqueeze(1)).squeeze(1)
    first = rows.top_p_removed(values, kth, (1.0 - top_p).float()).unsqueeze(1)
    return rows.keep_from(scores, values.gather(1, first).squeeze(1), order.gather(1, first).squeeze(1))


def row_passes_for(device: torch.device) -> RowPasses:
    if triton_kernels_run_on(device):
        from . import sample_keys_triton
        from . import sample_rows_triton as kernels

        return RowPasses(sample_keys_triton.filtered_probs_by_keys, kernels.softmax, kernels.top_p_removed,
                         kernels.keep_from, kernels.tempered_softmax, kernels.min_p_renorm, kernels.min_p_mask)
    return TORCH_ROW_PASSES
