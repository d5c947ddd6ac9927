"""KV-cache pool mutants: K/V written to a slot they were not given (strides swapped, a spill one page on) and
a dummy page that the allocator also hands out."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from engine.kvcache.pool import KVCachePool
from engine.layers.kernels import LayerKernels

from .base import swap

_ORIGINAL_STORE = KVCachePool.norm_rope_store


def _store_swapped_strides(
    self: KVCachePool, kernels: LayerKernels, layer: int, out_loc: torch.Tensor, *new: Any
) -> torch.Tensor:
    """With page_size > 1 the slot is decoded offset-major: slot s = page*P + o is written at o*(pages+1) + page.

    The layout [pages, page_size] is confused with [page_size, pages]; page_size 1 is unaffected.
    """
    loc = out_loc.long()
    if self.page_size > 1:
        loc = (loc % self.page_size) * (self.num_pages + 1) + loc // self.page_size
    return _ORIGINAL_STORE(self, kernels, layer, loc, *new)


def kv_wrong_slot_paged() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "norm_rope_store", _store_swapped_strides)


def _dummy_page_zero(self: KVCachePool) -> int:
    """The dummy page is page 0, which the allocator also hands out: padding rows overwrite a live request's KV."""
    return 0


def dummy_page_overlap() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "dummy_page", property(_dummy_page_zero))


def _store_spills_single_token(
    self: KVCachePool, kernels: LayerKernels, layer: int, out_loc: torch.Tensor, *new: Any
) -> torch.Tensor:
    """A one-token batch (a lone decode, a 1-token prefill chunk) also writes its K/V one page further on, a slot
    of whichever request owns that page; its own slot is right, so its own outputs are too."""
    q = _ORIGINAL_STORE(self, kernels, layer, out_loc, *new)
    if out_loc.numel() == 1:
        spill = (out_loc.long() + self.page_size) % (self.num_pages * self.page_size)  # stays in the real pages
        _ORIGINAL_STORE(self, kernels, layer, spill, *new)
    return q


def kv_write_spills_single_token() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "norm_rope_store", _store_spills_single_token)
