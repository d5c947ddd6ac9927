"""HybridAttnBackend: one backend for decode batches up to a size, another for every other batch, so that what runs
where is stated where the hybrid is registered (a Route per possible `rest`, the first usable one taken) rather than
inside a backend. The `triton` backend is one: Triton decode for small decode batches, FlashInfer or torch for the
rest."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import Batch, Context
from .base import BaseAttnBackend


@dataclass(frozen=True)
class Route:
    """Decode batches of up to decode_max_bs padded rows (every one where None) run on the hybrid's decode backend,
    all other batches on `rest`, a registered attention backend."""

    rest: str
    decode_max_bs: int | None


class HybridAttnBackend(BaseAttnBackend):
    def __init__(self, name: str, decode: BaseAttnBackend, rest: BaseAttnBackend, decode_max_bs: int | None) -> None:
        self.name = name
        self.decode = decode
        self.rest = rest
        self.decode_max_bs = decode_max_bs
        # Graphs capture decode batches, so the rest must capture too unless the decode backend takes them all.
        self.supports_cuda_graph = decode.supports_cuda_graph and (decode_max_bs is None or rest.supports_cuda_graph)

    def describe(self) -> str:
        sizes = "every decode batch" if self.decode_max_bs is None else (
            f"decode batches of up to {self.decode_max_bs} padded rows"
        )
        return f"{self.name}: {sizes} on {self.decode.describe()}, every other batch on {self.rest.describe()}"

    def decodes(self, bs: int) -> bool:
        """Whether a decode batch of bs padded rows runs on the decode backend."""
        return self.decode_max_bs is None or bs <= self.decode_max_bs

    def backend_for(self, batch: Batch) -> BaseAttnBackend:
        return self.decode if batch.is_decode and self.decodes(batch.padded_size) else self.rest

    def delegate(self, batch: Batch) -> str | None:
        return None if self.backend_for(batch) is self.decode else self.rest.name

    def prepare_metadata(self, batch: Batch) -> None:
        self.backend_for(batch).prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, ctx: Context
    ) -> torch.Tensor:
        return self.backend_for(ctx.batch).forward(q, k, v, layer_id, ctx)

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
