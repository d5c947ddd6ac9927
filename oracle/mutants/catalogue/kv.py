"""KV-cache pool mutants: K/V written to a slot they were not given (strides swapped, a spill one page on) and
a dummy page that the allocator also hands out."""

from __future__ import annotations

import contextlib

import torch

from engine.kvcache.pool import KVCachePool
from engine.layers.kernels import LayerKernels

from .base import swap

_ORIGINAL_STORE_KV = KVCachePool.store_kv


def _store_kv_swapped_strides(
    self: KVCachePool, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int, kernels: LayerKernels
) -> None:
    """With page_size > 1 the slot is decoded offset-major: slot s = page*P + o is written at o*(pages+1) + page.

    The layout [pages, page_size] is confused with [page_size, pages]; page_size 1 is unaffected.
    """
    loc = out_loc.long()
    if self.page_size > 1:
        loc = (loc % self.page_size) * (self.num_pages + 1) + loc // self.page_size
    _ORIGINAL_STORE_KV(self, k, v, loc, layer, kernels)


def kv_wrong_slot_paged() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "store_kv", _store_kv_swapped_strides)


def _dummy_page_zero(self: KVCachePool) -> int:
    """The dummy page is page 0, which the allocator also hands out: padding rows overwrite a live request's KV."""
    return 0


def dummy_page_overlap() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "dummy_page", property(_dummy_page_zero))


def _store_kv_spills_single_token(
    self: KVCachePool, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int, kernels: LayerKernels
) -> None:
    """A one-token batch (a lone decode, a 1-token prefill chunk) also writes its K/V one page further on, a slot
    of whichever request owns that page; its own slot is right, so its own outputs are too."""
    _ORIGINAL_STORE_KV(self, k, v, out_loc, layer, kernels)
    if out_loc.numel() == 1:
        spill = (out_loc.long() + self.page_size) % (self.num_pages * self.page_size)  # stays in the real pages
        _ORIGINAL_STORE_KV(self, k, v, spill, layer, kernels)


def kv_write_spills_single_token() -> contextlib.AbstractContextManager[None]:
    return swap(KVCachePool, "store_kv", _store_kv_spills_single_token)
