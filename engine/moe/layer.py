"""FusedMoE: the experts of one sparse MLP, stored in HF's fused 3-D layout and run by a MoE backend."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelLoadError
from .base import BaseMoeBackend

# Per-expert checkpoint projection → (our fused parameter, which block of an expert's rows it fills).
EXPERT_PROJECTIONS = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", 0)}


class FusedMoE(nn.Module):
    """gate_up_proj [E, 2I, H] (gate rows first) and down_proj [E, H, I], as transformers 5 holds them; per-expert
    checkpoints fill them by shard ``"<e>.<proj>"``."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        top_k: int,
        renormalize: bool,
        backend: BaseMoeBackend,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.top_k = top_k
        self.renormalize = renormalize
        self.backend = backend
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor, per_token: bool = False) -> torch.Tensor:
        """per_token (batch-invariant mode): each token alone, so no expert's product spans a batch-dependent group."""
        if per_token:
            return torch.cat([self.forward(hidden[t : t + 1], router_logits[t : t + 1]) for t in range(len(hidden))])
        return self.backend.forward(
            hidden, router_logits, self.gate_up_proj, self.down_proj, self.top_k, self.renormalize
        )

    def shard_names(self, param: str) -> list[str]:
        projs = [p for p, (target, _) in EXPERT_PROJECTIONS.items() if target == param]
        return [f"{e}.{p}" for e in range(self.num_experts) for p in projs]

    def shard_view(self, param: str, shard: str) -> torch.Tensor:
        expert_str, proj = shard.split(".")
        expert = int(expert_str)
        if expert >= self.num_experts:
            raise ModelLoadError(
                f"checkpoint has expert {expert}, but the model config says num_experts={self.num_experts}"
            )
        matrix: torch.Tensor = getattr(self, param).data[expert]
        if param == "down_proj":
            return matrix
        block = EXPERT_PROJECTIONS[proj][1]
        return matrix.narrow(0, block * self.intermediate_size, self.intermediate_size)
