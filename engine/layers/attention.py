"""The attention layer: split qkv; optional q/k norm (the caller's, as HF keeps them on self_attn) and RoPE, fused with
the KV store into the layer's slots; then the backend attends (a backend may do all of it in one kernel)."""

from __future__ import annotations

import torch
from torch import nn

from ..core import Context
from .norm import RMSNorm
from .rotary import RotaryAt


class AttentionLayer(nn.Module):
    def __init__(
        self,
        layer_id: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_size = num_qo_heads * head_dim
        self.kv_size = num_kv_heads * head_dim

    def forward(
        self,
        qkv: torch.Tensor,
        rope: RotaryAt,
        ctx: Context,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_qo_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        out = ctx.attn_backend.forward_new_tokens(q, k, v, rope, q_norm, k_norm, self.layer_id, ctx)
        if out is None:
            q = ctx.kv_cache.norm_rope_store(ctx.kernels, self.layer_id, ctx.batch.out_loc, q, k, v, rope, q_norm,
                                             k_norm)
            out = ctx.attn_backend.forward(q, self.layer_id, ctx)
        return out.reshape(-1, self.q_size)
