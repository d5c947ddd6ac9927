"""The MoE forward in plain torch with HF's Qwen3MoeSparseMoeBlock numerics: float32 routing, then each expert once
on its group of tokens, accumulated in ascending expert order as HF does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers.activation import silu_and_mul
from .base import BaseMoeBackend


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """→ (weights [T, k] in the logits' dtype, expert ids [T, k] int64), the most probable expert first."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


class TorchMoeBackend(BaseMoeBackend):
    # The per-expert group sizes are read on the host, which a CUDA graph cannot capture.
    supports_cuda_graph = False

    def forward(
        self,
        hidden: torch.Tensor,
        router_logits: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
        renormalize: bool,
    ) -> torch.Tensor:
        weights, ids = select_experts(router_logits, top_k, renormalize)
        flat_ids = ids.flatten()
        flat_weights = weights.flatten()
        # A stable sort of the flat (token, slot) pairs groups them by expert.
        pairs_by_expert = flat_ids.argsort(stable=True)
        counts = torch.bincount(flat_ids, minlength=gate_up.shape[0]).tolist()
        out = torch.zeros_like(hidden)
        for expert, pairs in enumerate(pairs_by_expert.split(counts)):
            if pairs.numel() == 0:
                continue
            tokens = pairs // top_k
            h = silu_and_mul(F.linear(hidden[tokens], gate_up[expert]))
            out.index_add_(0, tokens, F.linear(h, down[expert]) * flat_weights[pairs, None])
        return out
