"""Triton decode attention on CUDA, the decode half of the `triton` hybrid: lengths (positions + 1) and rows are read
on the device, so the host builds no page metadata and a graph replays with no plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import Batch, Context
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata


@dataclass
class TritonDecodeMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor
    num_splits: int  # split-KV chunks per request
    seq_lens: torch.Tensor | None = None  # positions + 1, on the device

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class TritonDecodeBackend(BaseAttnBackend):
    name = "triton_decode"
    supports_cuda_graph = True

    def __init__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> None:
        from .triton_decode import choose_splits, paged_decode  # import triton: CUDA builds only

        self._choose_splits, self._paged_decode = choose_splits, paged_decode
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.scale = kv_cache.head_dim**-0.5
        self._arange = torch.arange(page_table.shape[0], dtype=torch.int64, device=device)
        self._arrivals = torch.zeros(page_table.shape[0] * kv_cache.num_kv_heads, dtype=torch.int32, device=device)
        self._num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._max_seq_len = page_table.shape[1]

    def _splits(self, bs: int, max_len: int) -> int:
        return int(self._choose_splits(bs, self.kv_cache.num_kv_heads, max_len, self._num_sms))

    def prepare_metadata(self, batch: Batch) -> None:
        longest = max(r.device_len for r in batch.padded_reqs)
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, longest), batch.positions + 1)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        batch = ctx.batch
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata) and meta.seq_lens is not None
        return self._paged_decode(
            q, self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id), self.page_table, batch.table_rows,
            meta.seq_lens, self.scale, meta.num_splits, self._arrivals,
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        self._max_seq_len = max_seq_len

    def prepare_for_capture(self, batch: Batch) -> None:
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, self._max_seq_len))

    def graph_metadata(self, batch: Batch) -> None:
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata)
        meta.seq_lens = batch.positions + 1

    def prepare_for_replay(self, batch: Batch) -> None:
        """Nothing: the graph computes the rows and lengths itself."""
