"""The graph runner: captures decode steps as CUDA graphs and pads batches to a captured size.

Capture runs once, at engine init, largest batch size first so the smaller graphs fit in the memory pool the
largest one reserved (all graphs share it). A captured graph reads its inputs from static buffers (token ids,
positions, KV write slots, and the page-table rows where the backend reads them in the graph) and its attention
metadata from buffers the backend refills when it plans; a replay copies every input of the batch into those
buffers first. A batch between two captured sizes is padded up with dummy requests, which read and write only the
dummy page.

On CPU, or with a backend that cannot be captured, the runner is disabled: pad_batch leaves the batch as it
is and every forward pass runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .attention.base import BaseAttnBackend
from .core import Batch, Context, Req

# (ids, positions, ctx) -> float32 logits [bs, vocab]
ModelFn = Callable[[torch.Tensor, torch.Tensor, Context], torch.Tensor]


def default_graph_bs(max_bs: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, 32, …] up to max_bs: dense at small sizes, where decode batches usually are."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class GraphRunner:
    # The Batch fields a replay copies into static buffers of the same name (plus the backend's graph_inputs). A
    # field missing here would make every replay reuse whatever the buffer last held (tests/gpu proves the mutant
    # is caught).
    static_inputs: tuple[str, ...] = ("input_ids", "positions", "out_loc")

    def __init__(self, dummy_req: Req, bs_list: list[int], enabled: bool) -> None:
        self.dummy_req = dummy_req
        self.enabled = enabled and bool(bs_list)
        self.bs_list = sorted(set(bs_list)) if self.enabled else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}
        self._backend: BaseAttnBackend | None = None

    @property
    def max_bs(self) -> int:
        return self.bs_list[-1] if self.bs_list else 0

    def can_use_graph(self, batch: Batch) -> bool:
        return self.enabled and batch.is_decode and batch.size <= self.max_bs

    def padded_size(self, bs: int) -> int:
        return next(size for size in self.bs_list if size >= bs)

    def pad_batch(self, batch: Batch) -> None:
        """Pad a graph-eligible decode batch with dummy requests, which only touch the dummy page."""
        if not self.can_use_graph(batch):
            batch.padded_reqs = list(batch.reqs)
            return
        extra = self.padded_size(batch.size) - batch.size
        batch.padded_reqs = list(batch.reqs) + [self.dummy_req] * extra

    @torch.inference_mode()
    def capture(
        self, model: ModelFn, ctx: Context, backend: BaseAttnBackend, stream: torch.cuda.Stream, max_seq_len: int
    ) -> None:
        """Capture one decode graph per size in bs_list, on `stream`, sharing one memory pool."""
        if not self.enabled:
            return
        device = ctx.page_table.device
        dummy_slot = int(ctx.page_table[self.dummy_req.table_idx, 0])
        self.buffers = {
            "input_ids": torch.zeros(self.max_bs, dtype=torch.int32, device=device),
            "positions": torch.zeros(self.max_bs, dtype=torch.int64, device=device),
            "out_loc": torch.full((self.max_bs,), dummy_slot, dtype=torch.int32, device=device),
            "table_rows": torch.full((self.max_bs,), self.dummy_req.table_idx, dtype=torch.int64, device=device),
        }
        backend.init_capture_graph(max_seq_len, self.bs_list)
        self._backend = backend
        pool = None
        stream.wait_stream(torch.cuda.current_stream(device))  # the weights, KV pool and page table are set up there
        with torch.cuda.stream(stream):
            for bs in reversed(self.bs_list):
                batch = Batch([self.dummy_req] * bs, "decode")
                for name in self.static_inputs + ("table_rows",):
                    setattr(batch, name, self.buffers[name][:bs])
                backend.prepare_for_capture(batch)
                with ctx.forward_batch(batch):
                    model(batch.input_ids, batch.positions, ctx)  # warm-up: lazy inits must not land in the graph
                    stream.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self.outputs[bs] = model(batch.input_ids, batch.positions, ctx)
                pool = graph.pool() if pool is None else pool
                self.graphs[bs] = graph
        stream.synchronize()

    def replay(self, batch: Batch) -> torch.Tensor:
        """Run a padded decode batch through its graph; returns logits [padded_size, vocab] (a fresh tensor)."""
        bs = batch.padded_size
        graph = self.graphs.get(bs)
        if graph is None or self._backend is None:
            raise RuntimeError(f"no CUDA graph was captured for batch size {bs}")
        for name in self.static_inputs + self._backend.graph_inputs:
            self.buffers[name][:bs].copy_(getattr(batch, name))
        self._backend.prepare_for_replay(batch)
        graph.replay()
        # The output lives in the shared pool, which the next replay overwrites: hand out a copy.
        return self.outputs[bs].clone()

    def destroy(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.buffers.clear()
        self._backend = None
