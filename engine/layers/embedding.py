"""Token embedding and the LM head's weight (optionally tied to the embedding)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, tied_to: Embedding | None = None) -> None:
        super().__init__()
        self.tied_to = tied_to
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    @property
    def projection(self) -> torch.Tensor:
        """[vocab, hidden]: the model's last norm projects through it (RMSNorm.forward_linear)."""
        return self.tied_to.weight if self.tied_to is not None else self.weight
