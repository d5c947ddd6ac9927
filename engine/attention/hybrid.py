"""HybridAttnBackend: one backend for decode batches up to a size, another for the rest, so what runs where is stated
where the hybrid is registered (a Route per possible `rest`) rather than inside a backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..core import Batch, Context
from .base import BaseAttnBackend

if TYPE_CHECKING:  # the layers import the models package, which imports the attention backends
    from ..layers.kernels import HeadNorm
    from ..layers.rotary import RotaryAt


@dataclass(frozen=True)
class Route:
    """Decode batches up to decode_max_bs padded rows (None: all) run on the decode backend, the rest on `rest`."""

    rest: str
    decode_max_bs: int | None


class HybridAttnBackend(BaseAttnBackend):
    def __init__(self, name: str, decode: BaseAttnBackend, rest: BaseAttnBackend, decode_max_bs: int | None) -> None:
        self.name = name
        self.decode = decode
        self.rest = rest
        self.decode_max_bs = decode_max_bs
        # The rest must capture too unless the decode backend takes every decode batch.
        self.supports_cuda_graph = decode.supports_cuda_graph and (decode_max_bs is None or rest.supports_cuda_graph)

    def describe(self) -> str:
        sizes = "every decode batch" if self.decode_max_bs is None else (
            f"decode batches of up to {self.decode_max_bs} padded rows"
        )
        return f"{self.name}: {sizes} on {self.decode.describe()}, every other batch on {self.rest.describe()}"

    def decodes(self, bs: int) -> bool:
        return self.decode_max_bs is None or bs <= self.decode_max_bs

    def backend_for(self, batch: Batch) -> BaseAttnBackend:
        return self.decode if batch.is_decode and self.decodes(batch.padded_size) else self.rest

    def delegate(self, batch: Batch) -> str | None:
        return None if self.backend_for(batch) is self.decode else self.rest.name

    def prepare_metadata(self, batch: Batch) -> None:
        self.backend_for(batch).prepare_metadata(batch)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        return self.backend_for(ctx.batch).forward(q, layer_id, ctx)

    def forward_new_tokens(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None,
        k_norm: HeadNorm | None, layer_id: int, ctx: Context,
    ) -> torch.Tensor | None:
        return self.backend_for(ctx.batch).forward_new_tokens(q, k, v, rope, q_norm, k_norm, layer_id, ctx)

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        for backend, sizes in ((self.decode, [bs for bs in bs_list if self.decodes(bs)]),
                               (self.rest, [bs for bs in bs_list if not self.decodes(bs)])):
            if sizes:
                backend.init_capture_graph(max_seq_len, sizes)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.backend_for(batch).prepare_for_capture(batch)

    def graph_metadata(self, batch: Batch) -> None:
        self.backend_for(batch).graph_metadata(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.backend_for(batch).prepare_for_replay(batch)
