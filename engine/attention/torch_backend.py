"""Reference attention in plain torch: per request, SDPA over its gathered K/V slots with a bottom-right causal mask;
a decode batch as one SDPA call over keys padded to the longest request and masked. Batch-invariant
(ctx.batch_invariant): each query token alone over exactly its keys, the same call whatever the batch, padding or
prefill chunking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core import Batch, Context
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    q_ranges: list[tuple[int, int]]
    kv_slots: list[torch.Tensor]
    cached_lens: list[int]
    last_indices: torch.Tensor
    # Decode only, built at the first layer: the slots padded [bs, len] and a key mask (None when lengths are equal).
    decode_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None

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
        longest = max(req.device_len for req in batch.padded_reqs)
        table = self.page_table[:, :longest].index_select(0, batch.table_rows).long()
        for i, req in enumerate(batch.padded_reqs):
            end = start + req.extend_len
            q_ranges.append((start, end))
            kv_slots.append(table[i, : req.device_len])
            cached_lens.append(req.cached_len)
            start = end
        last = torch.tensor([e - 1 for _, e in q_ranges], dtype=torch.long)
        batch.attn_metadata = TorchAttnMetadata(
            q_ranges, kv_slots, cached_lens, last.to(self.page_table.device)
        )

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        batch = ctx.batch
        meta = batch.attn_metadata
        assert isinstance(meta, TorchAttnMetadata)
        k_slots = self.kv_cache.k_slots(layer_id)
        v_slots = self.kv_cache.v_slots(layer_id)
        group = self.num_qo_heads // k_slots.shape[1]
        if ctx.batch_invariant:
            return self._per_token(q, meta, k_slots, v_slots, group > 1)
        if batch.is_decode:
            return self._decode(q, meta, k_slots, v_slots, group > 1)
        out = torch.empty_like(q)
        for (qs, qe), slots, cached in zip(meta.q_ranges, meta.kv_slots, meta.cached_lens):
            # 4-D: 3-D inputs fall back to SDPA's math kernel on CPU.
            qi = q[qs:qe].transpose(0, 1)[None]
            ki = k_slots.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)
            vi = v_slots.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)
            q_len, kv_len = qe - qs, len(slots)
            mask = None
            if q_len > 1 and cached > 0:
                # Bottom-right causal: query j sits at absolute position cached + j.
                rows = torch.arange(q_len, device=q.device)[:, None] + cached
                mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
            # A fresh prefill is plain causal: is_causal skips a q x kv mask.
            causal = q_len > 1 and cached == 0
            attn = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=causal, enable_gqa=group > 1)
            out[qs:qe] = attn[0].transpose(0, 1)
        return out

    @staticmethod
    def _per_token(
        q: torch.Tensor, meta: TorchAttnMetadata, k_slots: torch.Tensor, v_slots: torch.Tensor, gqa: bool
    ) -> torch.Tensor:
        """Each query token in its own unmasked SDPA call over its causal keys: no padding, mask or q block to vary."""
        out = torch.empty_like(q)
        for (qs, qe), slots, cached in zip(meta.q_ranges, meta.kv_slots, meta.cached_lens):
            ki = k_slots.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)
            vi = v_slots.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)
            for j in range(qe - qs):
                keys = cached + j + 1
                qi = q[qs + j : qs + j + 1].transpose(0, 1)[None]
                attn = F.scaled_dot_product_attention(qi, ki[:, :, :keys], vi[:, :, :keys], enable_gqa=gqa)
                out[qs + j] = attn[0, :, 0]
        return out

    @staticmethod
    def _decode(
        q: torch.Tensor, meta: TorchAttnMetadata, k_slots: torch.Tensor, v_slots: torch.Tensor, gqa: bool
    ) -> torch.Tensor:
        """One query per request, all requests in one SDPA call."""
        if meta.decode_slots is None:
            lens = [len(slots) for slots in meta.kv_slots]
            meta.decode_slots = torch.nn.utils.rnn.pad_sequence(meta.kv_slots, batch_first=True)
            if min(lens) != max(lens):
                real = torch.arange(max(lens), device=q.device) < torch.tensor(lens, device=q.device)[:, None]
                meta.decode_mask = real[:, None, None, :]
        bs, longest = meta.decode_slots.shape
        flat = meta.decode_slots.view(-1)
        # index_select, not k_slots[slots]: advanced indexing of whole rows is slower on CPU.
        ki = k_slots.index_select(0, flat).view(bs, longest, *k_slots.shape[1:]).transpose(1, 2).to(q.dtype)
        vi = v_slots.index_select(0, flat).view(bs, longest, *v_slots.shape[1:]).transpose(1, 2).to(q.dtype)
        qi = q.view(bs, 1, *q.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=meta.decode_mask, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(q.shape)
