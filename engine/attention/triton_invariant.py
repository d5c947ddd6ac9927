"""Batch-invariant attention on CUDA (EngineConfig.batch_invariant): every query token, in prefill, extend and decode
alike, attends alone over the first position + 1 slots of its table row in the paged decode kernel with SPLITS splits,
a constant, so each split's range is a function of the token's own length alone, its keys are reduced in fixed-size
blocks in order and the splits merged in split order (no atomics) whatever the batch, its padding or the prefill
chunking. Lengths are read on the device: a decode graph replays with no plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import Batch, Context
from ..device import upload
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata

SPLITS = 16  # enough programs at batch 1; chosen from the batch, it would change how a token's keys are summed


@dataclass
class InvariantMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor
    token_rows: torch.Tensor | None = None  # each token's page-table row (prefill and extend; decode reads table_rows)
    positions: torch.Tensor | None = None  # each token's position, on the device: it attends to position + 1 keys

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class TritonInvariantBackend(BaseAttnBackend):
    name = "triton_invariant"
    supports_cuda_graph = True

    def __init__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> None:
        from .triton_decode import paged_decode  # import triton: CUDA builds only

        self._paged_decode = paged_decode
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.scale = kv_cache.head_dim**-0.5
        self._arange = torch.arange(page_table.shape[0], dtype=torch.int64, device=device)

    def prepare_metadata(self, batch: Batch) -> None:
        if batch.is_decode:
            batch.attn_metadata = InvariantMetadata(self._arange[: batch.padded_size], positions=batch.positions)
            return
        extend = [req.extend_len for req in batch.padded_reqs]
        counts = upload(torch.tensor(extend, dtype=torch.int64), batch.table_rows.device)
        rows = batch.table_rows.repeat_interleave(counts, output_size=sum(extend))
        last = torch.cumsum(counts, 0) - 1
        batch.attn_metadata = InvariantMetadata(last, rows, batch.positions)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        batch = ctx.batch
        meta = batch.attn_metadata
        assert isinstance(meta, InvariantMetadata) and meta.positions is not None
        rows = batch.table_rows if meta.token_rows is None else meta.token_rows
        return self._paged_decode(
            q, self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id), self.page_table, rows,
            meta.positions, self.scale, SPLITS, len_offset=1,
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        """Nothing: no buffer depends on the captured size."""

    def prepare_for_capture(self, batch: Batch) -> None:
        batch.attn_metadata = InvariantMetadata(self._arange[: batch.padded_size])

    def graph_metadata(self, batch: Batch) -> None:
        meta = batch.attn_metadata
        assert isinstance(meta, InvariantMetadata)
        meta.positions = batch.positions

    def prepare_for_replay(self, batch: Batch) -> None:
        """Nothing: the graph computes the lengths itself."""
