"""The interface every MoE backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BaseMoeBackend(ABC):
    """Routes each token to its top-k experts and sums their SiLU-gated MLP outputs, weighted by the router."""

    supports_cuda_graph: bool = False

    @abstractmethod
    def forward(
        self,
        hidden: torch.Tensor,
        router_logits: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        top_k: int,
        renormalize: bool,
    ) -> torch.Tensor:
        """hidden [T, H], router_logits [T, E], gate_up [E, 2I, H] (gate rows first), down [E, H, I] → [T, H];
        renormalize: HF's norm_topk_prob."""
