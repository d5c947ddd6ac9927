"""Triton decode attention on CUDA, the decode half of the `triton` hybrid: lengths (the newest positions + 1, added in
the kernel) and rows are read on the device, so the host builds no page metadata and a graph replays with no plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..core import Batch, Context
from ..kvcache.pool import KVCachePool
from ..layers.kernels import weight_eps
from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:  # the layers import the models package, which imports the attention backends
    from ..layers.kernels import HeadNorm
    from ..layers.rotary import RotaryAt


@dataclass
class TritonDecodeMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor
    num_splits: int  # split-KV chunks per request
    positions: torch.Tensor | None = None  # each request's newest token's: its length less one, on the device

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class TritonDecodeBackend(BaseAttnBackend):
    name = "triton_decode"
    supports_cuda_graph = True

    def __init__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> None:
        from . import triton_decode  # import triton: CUDA builds only

        self._decode = triton_decode
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.scale = kv_cache.head_dim**-0.5
        self._arange = torch.arange(page_table.shape[0], dtype=torch.int64, device=device)
        self._arrivals = torch.zeros(page_table.shape[0] * kv_cache.num_kv_heads, dtype=torch.int32, device=device)
        self._num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._max_seq_len = page_table.shape[1]

    def _splits(self, bs: int, max_len: int) -> int:
        return int(self._decode.choose_splits(bs, self.kv_cache.num_kv_heads, max_len, self._num_sms))

    def prepare_metadata(self, batch: Batch) -> None:
        longest = max(r.device_len for r in batch.padded_reqs)
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, longest), batch.positions)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        """Decode batches only, so a request's tokens but its newest come from earlier steps: read early."""
        batch = ctx.batch
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata) and meta.positions is not None
        return self._decode.paged_decode(
            q, self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id), self.page_table, batch.table_rows,
            meta.positions, self.scale, meta.num_splits, self._arrivals, early=True, len_offset=1,
        )

    def forward_new_tokens(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None,
        k_norm: HeadNorm | None, layer_id: int, ctx: Context,
    ) -> torch.Tensor | None:
        """The layer's norm_rope_store inside the decode kernel, where the layer kernels' own is the Triton one whose
        arithmetic that kernel repeats (LayerKernels.rope_store_fusable): one launch fewer per layer."""
        if not ctx.kernels.rope_store_fusable():
            return None
        batch, meta = ctx.batch, ctx.batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata) and meta.positions is not None
        cos, sin = rope.table.tables_in(q.dtype)
        (qw, q_eps), (kw, k_eps) = weight_eps(q_norm), weight_eps(k_norm)
        new = self._decode.NewTokens(k, v, batch.out_loc, cos, sin, qw, q_eps, kw, k_eps)
        k_slots, v_slots = self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id)
        if not self._decode.fuses_new_tokens(q, new, k_slots, v_slots):
            return None
        return self._decode.paged_decode(
            q, k_slots, v_slots, self.page_table, batch.table_rows, meta.positions, self.scale, meta.num_splits,
            self._arrivals, new, early=True, len_offset=1,
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        self._max_seq_len = max_seq_len

    def prepare_for_capture(self, batch: Batch) -> None:
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, self._max_seq_len))

    def graph_metadata(self, batch: Batch) -> None:
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata)
        meta.positions = batch.positions

    def prepare_for_replay(self, batch: Batch) -> None:
        """Nothing: the graph computes the rows and lengths itself."""
