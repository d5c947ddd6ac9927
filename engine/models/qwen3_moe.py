"""Qwen3MoeForCausalLM: Qwen3 whose MLPs are sparse mixture-of-experts blocks (HF's layer rule picks which)."""

from __future__ import annotations

import torch
from torch import nn

from ..core import Context
from ..layers.linear import Linear
from ..layers.norm import RMSNorm
from ..moe import MOE_BACKENDS, BaseMoeBackend, FusedMoE
from .config import ModelConfig
from .decoder import MLP, DecoderForCausalLM
from .registry import register_model


class SparseMoeBlock(nn.Module):
    """A linear router (`gate`) over num_experts SiLU-gated MLPs; each token uses its top-k."""

    def __init__(self, cfg: ModelConfig, backend: BaseMoeBackend) -> None:
        super().__init__()
        self.gate = Linear(cfg.hidden_size, cfg.num_experts)
        self.experts = FusedMoE(
            cfg.num_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
            cfg.num_experts_per_tok,
            cfg.norm_topk_prob,
            backend,
        )

    def forward(
        self, hidden: torch.Tensor, residual: torch.Tensor, norm: RMSNorm, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts read the normed rows beside the router: the norm stays a launch of its own."""
        hidden, residual = norm.forward_residual(hidden, residual, ctx)
        return self.experts(hidden, self.gate(hidden, ctx), ctx.batch_invariant), residual


@register_model("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(DecoderForCausalLM):
    qk_norm = True

    def make_mlp(self, cfg: ModelConfig, layer_id: int) -> nn.Module:
        if not cfg.is_sparse_layer(layer_id):
            return MLP(cfg)
        if self.moe_backend is None:
            self.moe_backend = MOE_BACKENDS.factory("torch")()
        return SparseMoeBlock(cfg, self.moe_backend)
