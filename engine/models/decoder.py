"""The decoder-only transformer shared by Llama, Qwen2 and Qwen3 (subclasses set the differences); every op runs on
the forward context's ``ctx.kernels`` and ``ctx.attn_backend``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..core import Context
from ..layers.attention import AttentionLayer
from ..layers.embedding import Embedding, LMHead
from ..layers.linear import MergedLinear, RowParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryAt, RotaryEmbedding
from ..moe import BaseMoeBackend
from .config import ModelConfig


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, qk_norm: bool) -> None:
        super().__init__()
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, {"q": q_size, "k": kv_size, "v": kv_size}, cfg.tp, bias=cfg.attention_bias
        )
        self.attn = AttentionLayer(layer_id, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.o_proj = RowParallelLinear(q_size, cfg.hidden_size, cfg.tp)

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm, rope: RotaryAt, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention of norm(hidden + residual), hidden + residual), the norm folded into qkv_proj."""
        qkv, residual = norm.forward_linear(hidden, residual, self.qkv_proj.weight, self.qkv_proj.bias, ctx)
        out = self.attn(qkv, rope, ctx, self.q_norm, self.k_norm)
        return self.o_proj(out, ctx), residual


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        size = cfg.intermediate_size
        self.gate_up_proj = MergedLinear(cfg.hidden_size, {"gate": size, "up": size}, cfg.tp)
        self.down_proj = RowParallelLinear(size, cfg.hidden_size, cfg.tp)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLP of norm(x + residual), x + residual), the norm folded into gate_up_proj."""
        gate_up, residual = norm.forward_linear(x, residual, self.gate_up_proj.weight, None, ctx)
        return self.down_proj(gate_up, ctx, gated=True), residual


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, qk_norm: bool, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, layer_id, qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RotaryAt,
        ctx: Context,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.self_attn(hidden, residual, self.input_layernorm, rope, ctx)
        return self.mlp(hidden, residual, self.post_attention_layernorm, ctx)


class DecoderBody(nn.Module):
    def __init__(self, cfg: ModelConfig, qk_norm: bool, make_mlp: Callable[[ModelConfig, int], nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, qk_norm, make_mlp(cfg, i)) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """The logits of each request's last token, in the model's dtype (the engine upcasts them, as HF does after its
    head, where it hands them out or samples)."""

    qk_norm = False

    def __init__(self, cfg: ModelConfig, moe_backend: BaseMoeBackend | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.moe_backend = moe_backend
        self.model = DecoderBody(cfg, self.qk_norm, self.make_mlp)
        tied = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, tied_to=tied)
        self.rotary: RotaryEmbedding | None = None

    def make_mlp(self, cfg: ModelConfig, layer_id: int) -> nn.Module:
        """The MLP of layer `layer_id`, called as mlp(hidden, residual, norm, ctx) -> (out, hidden + residual),
        norm being the layer's post-attention RMSNorm; MoE models override it."""
        return MLP(cfg)

    def init_rotary(self, max_positions: int, device: torch.device) -> None:
        self.rotary = RotaryEmbedding(self.config.head_dim, max_positions, self.config.rope, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        assert self.rotary is not None, "init_rotary() must run after the weights are materialized"
        hidden = self.model.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        rope = self.rotary.at(positions)
        for layer in self.model.layers:
            hidden, residual = layer(hidden, residual, rope, ctx)
        assert residual is not None
        if not ctx.batch.is_decode:  # a decode row is its request's last token; the norm is per row, so gather first
            metadata = ctx.batch.attn_metadata
            assert metadata is not None
            last = metadata.get_last_indices()
            hidden, residual = hidden[last], residual[last]
        logits, _ = self.model.norm.forward_linear(hidden, residual, self.lm_head.projection, None, ctx)
        return logits
