"""Reference attention in plain torch, on CPU or CUDA.

For each request it gathers the request's K/V slots from the page table and runs SDPA with a bottom-right
causal mask: query i of an extend (cached_len > 0) sees every cached token and the new tokens up to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core import Batch
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    # Per request: (query start, query end) in the flattened batch, its slots [0, device_len), cached_len.
    q_ranges: list[tuple[int, int]]
    kv_slots: list[torch.Tensor]
    cached_lens: list[int]
    last_indices: torch.Tensor

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class TorchAttnBackend(BaseAttnBackend):
    name = "torch"

    def __init__(self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.num_qo_heads = num_qo_heads

    def prepare_metadata(self, batch: Batch) -> None:
        q_ranges, kv_slots, cached_lens = [], [], []
        start = 0
        for req in batch.padded_reqs:
            end = start + req.extend_len
            q_ranges.append((start, end))
            kv_slots.append(self.page_table[req.table_idx, : req.device_len].long())
            cached_lens.append(req.cached_len)
            start = end
        last = torch.tensor([e - 1 for _, e in q_ranges], dtype=torch.long)
        batch.attn_metadata = TorchAttnMetadata(
            q_ranges, kv_slots, cached_lens, last.to(self.page_table.device)
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta = batch.attn_metadata
        assert isinstance(meta, TorchAttnMetadata)
        k_slots = self.kv_cache.k_slots(layer_id)
        v_slots = self.kv_cache.v_slots(layer_id)
        group = self.num_qo_heads // k_slots.shape[1]
        out = torch.empty_like(q)
        for (qs, qe), slots, cached in zip(meta.q_ranges, meta.kv_slots, meta.cached_lens):
            qi = q[qs:qe].transpose(0, 1)  # [heads, q_len, dim]
            ki = k_slots[slots].transpose(0, 1).to(q.dtype)
            vi = v_slots[slots].transpose(0, 1).to(q.dtype)
            if group > 1:
                ki = ki.repeat_interleave(group, dim=0)
                vi = vi.repeat_interleave(group, dim=0)
            q_len, kv_len = qe - qs, len(slots)
            mask = None
            if q_len > 1:
                # Bottom-right causal: query j sits at absolute position cached + j.
                rows = torch.arange(q_len, device=q.device)[:, None] + cached
                mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
            out[qs:qe] = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask).transpose(0, 1)
        return out
