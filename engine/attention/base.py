"""The attention backend interface.

A backend turns a Batch into its own metadata once per forward pass (``prepare_metadata``, CPU side, before
the model runs), then serves every layer (``forward``, given the forward context: its batch, and the layer
kernels that write the KV). The graph hooks let the GraphRunner capture a whole decode step: metadata in static
buffers (prepare_for_capture), the part of it computed on the device inside the graph (graph_metadata), and the
host's part refilled before each replay (prepare_for_replay), which reads only the batch's requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..core import Batch, Context


class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self) -> torch.Tensor:
        """Index of each request's last token in the flattened batch (where its logits come from)."""


class BaseAttnBackend(ABC):
    name: str
    supports_cuda_graph = False  # True where the graph hooks below are implemented

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

    def describe(self) -> str:
        """Which backend serves which batches (a hybrid's routes), for reports."""
        return self.name

    def delegate(self, batch: Batch) -> str | None:
        """The name of the backend this one hands `batch` to, or None where it runs the batch itself (the op-level
        harness fails a hand-over that is not declared here)."""
        return None

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        """Allocate static metadata buffers for every batch size that will be captured."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        """Point batch.attn_metadata at the static buffers of batch.padded_size before capture."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def graph_metadata(self, batch: Batch) -> None:
        """Inside the captured step, before the model: the metadata computed on the device from batch.positions
        and batch.table_rows, which the graph computes itself. Nothing by default."""
        return None

    def prepare_for_replay(self, batch: Batch) -> None:
        """Before each replay: the host's part of this batch's metadata (from its padded requests alone) into the
        static buffers of its padded size."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")
