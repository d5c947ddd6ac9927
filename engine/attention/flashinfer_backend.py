"""FlashInfer attention on CUDA over the engine's token-granular page table: a page id is the slot at a page start
divided by page_size, so requests must hold whole pages (the slot rule, engine/step/slots.py). One plan per batch, on
the first layer (a graph: before replay, its page ids computed inside the graph); flashinfer is imported lazily.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from ..core import Batch, Context, Req
from ..device import host_tensor, upload
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata

# GQA group sizes the CUDA-core decode kernel serves; others decode on the tensor-core kernels.
CUDA_CORE_DECODE_GROUPS = (1, 2, 4, 8)
WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class PagedKVIndex:
    qo_indptr: torch.Tensor  # int32 [bs + 1]: new tokens of request i are qo_indptr[i]:qo_indptr[i+1]
    kv_indptr: torch.Tensor  # int32 [bs + 1]: pages of request i are kv_indices[kv_indptr[i]:kv_indptr[i+1]]
    kv_last_page_len: torch.Tensor  # int32 [bs]
    pages: torch.Tensor  # int64 [bs]


def build_paged_kv_index(reqs: Sequence[Req], page_size: int) -> PagedKVIndex:
    kv_lens = [r.device_len for r in reqs]
    pages = [-(-n // page_size) for n in kv_lens]
    return PagedKVIndex(
        host_tensor(list(accumulate((r.device_len - r.cached_len for r in reqs), initial=0)), torch.int32),
        host_tensor(list(accumulate(pages, initial=0)), torch.int32),
        host_tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)], torch.int32),
        host_tensor(pages),
    )


def kv_page_ids(
    page_table: torch.Tensor, table_rows: torch.Tensor, index: PagedKVIndex, page_size: int
) -> torch.Tensor:
    """int32 page ids in kv_indices order, on the device, in a fixed number of ops whatever the batch size."""
    device = page_table.device
    total = int(index.kv_indptr[-1])
    n = len(index.pages)
    packed = upload(torch.cat([-index.kv_indptr[:-1].to(torch.int64) * page_size, index.pages]), device)
    base = table_rows * page_table.shape[1] + packed[:n]
    starts = torch.repeat_interleave(base, packed[n:], output_size=total)
    starts += torch.arange(0, total * page_size, page_size, device=device)
    slots = page_table.view(-1)[starts]
    if page_size == 1:
        return slots
    return torch.div(slots, page_size, rounding_mode="floor").to(torch.int32)


def graph_page_ids(
    page_table: torch.Tensor, table_rows: torch.Tensor, kv_indptr: torch.Tensor, cols: torch.Tensor,
    page_size: int, out: torch.Tensor,
) -> None:
    """kv_page_ids with graph-fixed shapes (cols: every page a row can hold; the rest land in out's last entry): the
    torch reference of engine/attention/page_ids.py."""
    indptr = kv_indptr.long()
    valid = cols < (indptr[1:] - indptr[:-1]).unsqueeze(1)
    dest = torch.where(valid, indptr[:-1].unsqueeze(1) + cols, out.shape[0] - 1)
    slots = page_table.view(-1)[(table_rows * page_table.shape[1]).unsqueeze(1) + cols * page_size]
    ids = slots if page_size == 1 else torch.div(slots, page_size, rounding_mode="floor")
    out.index_copy_(0, dest.flatten(), ids.flatten().to(torch.int32))


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    index: PagedKVIndex
    kv_indices: torch.Tensor
    last_indices: torch.Tensor
    wrapper: Any = None  # None until planned

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class FlashInferAttnBackend(BaseAttnBackend):
    name = "flashinfer"
    supports_cuda_graph = True

    def __init__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> None:
        import flashinfer

        self._fi = flashinfer
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.device = device
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = kv_cache.num_kv_heads
        self.head_dim = kv_cache.head_dim
        self.page_size = kv_cache.page_size
        self.dtype = kv_cache.buffer.dtype
        self.use_tensor_cores = num_qo_heads // self.num_kv_heads not in CUDA_CORE_DECODE_GROUPS
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2")
        self.decode_wrapper = self._decode_wrapper()
        self.graph_wrappers: dict[int, Any] = {}
        self._plan_events: dict[int, torch.cuda.Event] = {}

    def _decode_wrapper(self, **graph_buffers: torch.Tensor) -> Any:
        return self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=bool(graph_buffers),
            use_tensor_cores=self.use_tensor_cores,
            backend="fa2",
            **graph_buffers,
        )

    def prepare_metadata(self, batch: Batch) -> None:
        index = build_paged_kv_index(batch.padded_reqs, self.page_size)
        kv_indices = kv_page_ids(self.page_table, batch.table_rows, index, self.page_size)
        if batch.is_decode:
            last = torch.arange(batch.padded_size, device=self.device)
        else:
            last = upload((index.qo_indptr[1:] - 1).to(torch.int64), self.device)
        batch.attn_metadata = FlashInferMetadata(index, kv_indices, last)

    def _plan(self, wrapper: Any, meta: FlashInferMetadata, is_decode: bool) -> None:
        key = id(wrapper)
        pending = self._plan_events.get(key)
        if pending is not None:
            pending.synchronize()  # re-planning before the last plan's async copy would corrupt its schedule
        index = meta.index
        common = {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        heads = (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size)
        if is_decode:
            wrapper.plan(index.kv_indptr, meta.kv_indices, index.kv_last_page_len, *heads, **common)
        else:
            wrapper.plan(
                index.qo_indptr, index.kv_indptr, meta.kv_indices, index.kv_last_page_len, *heads,
                causal=True, **common,
            )
        event = torch.cuda.Event()
        event.record()
        self._plan_events[key] = event
        meta.wrapper = wrapper

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        batch = ctx.batch
        meta = batch.attn_metadata
        assert isinstance(meta, FlashInferMetadata)
        if meta.wrapper is None:
            self._plan(self.decode_wrapper if batch.is_decode else self.prefill_wrapper, meta, batch.is_decode)
        kv = (self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id))
        return meta.wrapper.run(q.contiguous(), kv)

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        max_bs = max(bs_list)
        pages_per_req = math.ceil(max_seq_len / self.page_size)
        self._graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self._graph_kv_indices = torch.zeros(max_bs * pages_per_req + 1, dtype=torch.int32, device=self.device)
        self._graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self._graph_last_indices = torch.arange(max_bs, dtype=torch.int64, device=self.device)
        self._graph_max_pages = pages_per_req
        for bs in bs_list:
            self.graph_wrappers[bs] = self._decode_wrapper(
                paged_kv_indptr_buffer=self._graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self._graph_kv_indices,
                paged_kv_last_page_len_buffer=self._graph_last_page_len[:bs],
            )

    def prepare_for_capture(self, batch: Batch) -> None:
        self.prepare_for_replay(batch)

    def graph_metadata(self, batch: Batch) -> None:
        from .page_ids import page_ids

        page_ids(self.page_table, batch.table_rows, self._graph_kv_indptr[: batch.padded_size + 1],
                 self._graph_max_pages, self.page_size, self._graph_kv_indices)

    def prepare_for_replay(self, batch: Batch) -> None:
        bs = batch.padded_size
        index = build_paged_kv_index(batch.padded_reqs, self.page_size)
        meta = FlashInferMetadata(index, self._graph_kv_indices[:0], self._graph_last_indices[:bs])
        self._plan(self.graph_wrappers[bs], meta, is_decode=True)
        batch.attn_metadata = meta
