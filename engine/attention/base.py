"""The attention backend interface: metadata once per pass (prepare_metadata), then every layer (forward); the graph
hooks split a captured step's metadata into static buffers, a device part inside the graph and a host part per replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

from ..core import Batch, Context

if TYPE_CHECKING:  # the layers import the models package, which imports the attention backends
    from ..layers.kernels import HeadNorm
    from ..layers.rotary import RotaryAt


class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self) -> torch.Tensor:
        """Index of each request's last token in the flattened batch."""


class BaseAttnBackend(ABC):
    name: str
    supports_cuda_graph = False

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Build batch.attn_metadata from its requests and batch.table_rows (one per padded request)."""

    @abstractmethod
    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        """Attend q over each request's cached + new tokens, all already in the KV pool (the layer stored the new ones
        at ctx.batch.out_loc). q: [tokens, qo_heads, head_dim] → [tokens, qo_heads, head_dim]."""

    def forward_new_tokens(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None,
        k_norm: HeadNorm | None, layer_id: int, ctx: Context,
    ) -> torch.Tensor | None:
        """forward on q, k, v as the layer splits them, before the q/k norm and RoPE: a backend that norms, rotates
        and stores the new tokens inside its own kernel does it all here; None: the layer's kernels do
        (norm_rope_store), then forward. q: [tokens, qo_heads, head_dim], k and v: [tokens, kv_heads, head_dim]."""
        return None

    def describe(self) -> str:
        """Which backend serves which batches, for reports."""
        return self.name

    def delegate(self, batch: Batch) -> str | None:
        """The backend this one hands `batch` to, or None; the op-level harness fails an undeclared hand-over."""
        return None

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        """Static metadata buffers for every size to be captured."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch) -> None:
        """Point batch.attn_metadata at the static buffers of batch.padded_size before capture."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")

    def graph_metadata(self, batch: Batch) -> None:
        """Inside the captured step: the metadata computed on the device from batch.table_rows and positions."""
        return None

    def prepare_for_replay(self, batch: Batch) -> None:
        """Before each replay: the host's part of the metadata, from the padded requests alone."""
        raise NotImplementedError(f"the {self.name} backend does not support CUDA graphs")
