"""The attention backend interface.

A backend turns a Batch into its own metadata once per forward pass (``prepare_metadata``, CPU side, before
the model runs), then serves every layer (``forward``, given the forward context: its batch, and the layer
kernels that write the KV). The graph hooks let the GraphRunner capture decode with static metadata buffers and
refill them before each replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..core import Batch, Context
from ..errors import ConfigError


def require_supported(name: str, reason: str | None) -> None:
    """Raise ConfigError naming backend `name` when `reason` says why it cannot serve this engine."""
    if reason is not None:
        raise ConfigError(f"attention_backend={name!r} cannot be used: {reason}")


class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self) -> torch.Tensor:
        """Index of each request's last token in the flattened batch (where its logits come from)."""


class BaseAttnBackend(ABC):
    name: str
    supports_cuda_graph = False  # True where the graph hooks below are implemented
    # Batch fields the backend reads inside a captured graph, besides the model's input_ids, positions and out_loc;
    # the graph runner copies them into its static buffers at each replay. It has one more: table_rows.
    graph_inputs: tuple[str, ...] = ()

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Build batch.attn_metadata from the batch's requests and the page-table rows batch.table_rows (one per
        padded request: the dummy row for all of them when the step's slot checks failed, so never a bad slot)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, ctx: Context
    ) -> torch.Tensor:
        """Store k, v at ctx.batch.out_loc with ctx.kernels, then attend q over each request's cached + new tokens.

        q: [tokens, qo_heads, head_dim]; k, v: [tokens, kv_heads, head_dim]. Returns [tokens, qo_heads, head_dim].
        """

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        """Allocate static metadata buffers for every batch size that will be captured."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        """Point batch.attn_metadata at the static buffers of batch.padded_size before capture."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def prepare_for_replay(self, batch: Batch) -> None:
        """Copy this batch's metadata into the static buffers of its padded size before replay."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")
