"""The graph runner: captures whole decode steps as CUDA graphs and pads batches to a captured size.

A captured step (the engine's, StepFn) runs from one static int64 buffer, the packed inputs of
engine/step/inputs.py in the graph's fixed layout, to the logits: inputs and slot checks, the backend's device
metadata, the model. Each size is captured twice: the greedy variant goes on to argmax, the rows' last tokens and
the payload the host copies back; the sampled variant stops at the logits (the sampler draws from them). A replay
copies the batch's packed inputs into that buffer, lets the backend do its host part (FlashInfer's plan), and
replays: one upload and one launch. A batch between two captured sizes is padded up with dummy requests, which read
and write only the dummy page.

Capture runs once, at engine init, largest batch size first so the smaller graphs fit in the memory pool the
largest one reserved (all graphs share it; each keeps its outputs, and a sampled variant writes its logits into its
greedy twin's). On CPU, or with a backend that cannot be
captured, the runner is disabled: pad_batch leaves the batch as it is and every forward pass runs eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .attention.base import BaseAttnBackend
from .core import Batch, Req
from .step.inputs import BatchInputs
from .step.layout import InputLayout


@dataclass
class StepOutputs:
    """What a captured step leaves in its static buffers; the next replay of its size overwrites them."""

    logits: torch.Tensor  # float32 [bs, vocab]
    inputs: BatchInputs
    tokens: torch.Tensor | None = None  # int32 [bs]: the greedy tokens (-1: nothing to sample); greedy variant only
    # int32 [2 bs + 1]: the tokens, the slot verdict, the rows' last tokens before the step; greedy variant only
    payload: torch.Tensor | None = None


# (packed inputs on the device, their layout, the batch whose metadata the backend set, greedy) -> the step's outputs
StepFn = Callable[[torch.Tensor, InputLayout, Batch, bool], StepOutputs]
Pool = Any  # a CUDA graph memory pool's handle (torch.cuda._POOL_HANDLE)
# padded size -> the packed inputs of a batch of padding rows only (host) and their layout
PackFn = Callable[[int], tuple[torch.Tensor, InputLayout]]


def default_graph_bs(max_bs: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, 32, …] up to max_bs: dense at small sizes, where decode batches usually are."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class GraphRunner:
    def __init__(self, dummy_req: Req, bs_list: list[int], enabled: bool) -> None:
        self.dummy_req = dummy_req
        self.enabled = enabled and bool(bs_list)
        self.bs_list = sorted(set(bs_list)) if self.enabled else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # the greedy variant of each size
        self.outputs: dict[int, StepOutputs] = {}
        self.sampled_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # the variant that stops at the logits
        self.sampled_outputs: dict[int, StepOutputs] = {}
        self.layouts: dict[int, InputLayout] = {}
        self.inputs: torch.Tensor | None = None  # the static packed inputs, as long as the largest layout
        self._backend: BaseAttnBackend | None = None

    @property
    def max_bs(self) -> int:
        return self.bs_list[-1] if self.bs_list else 0

    def has_graph(self, bs: int) -> bool:
        return bs in self.graphs

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
        self, step: StepFn, pack: PackFn, backend: BaseAttnBackend, stream: torch.cuda.Stream, max_seq_len: int,
        device: torch.device,
    ) -> None:
        """Capture a decode step's two variants per size in bs_list, on `stream`, sharing one memory pool."""
        if not self.enabled:
            return
        padding = {bs: pack(bs) for bs in self.bs_list}
        self.inputs = torch.zeros(max(layout.size for _, layout in padding.values()), dtype=torch.int64,
                                  device=device)
        backend.init_capture_graph(max_seq_len, self.bs_list)
        self._backend = backend
        pool: Pool | None = None
        stream.wait_stream(torch.cuda.current_stream(device))  # the weights, KV pool and page table are set up there
        with torch.cuda.stream(stream):
            for bs in reversed(self.bs_list):
                host, layout = padding[bs]
                packed = self.inputs[: layout.size]
                packed.copy_(host)
                batch = Batch([self.dummy_req] * bs, "decode")
                backend.prepare_for_capture(batch)
                pool = self._capture_size(bs, functools.partial(step, packed, layout, batch), stream, pool)
                self.layouts[bs] = layout
        stream.synchronize()

    def _capture_size(
        self, bs: int, step: Callable[[bool], StepOutputs], stream: torch.cuda.Stream, pool: Pool | None
    ) -> Pool:
        """Both variants of one size; the sampled one writes its logits into the greedy one's."""
        self.graphs[bs], self.outputs[bs], pool = _capture(functools.partial(step, True), stream, pool)
        logits = self.outputs[bs].logits

        def sampled() -> StepOutputs:
            out = step(False)
            logits.copy_(out.logits)
            return StepOutputs(logits, out.inputs)

        self.sampled_graphs[bs], self.sampled_outputs[bs], pool = _capture(sampled, stream, pool)
        return pool

    def load_inputs(self, batch: Batch) -> None:
        """Copy the batch's packed inputs (host, the graph's layout) into the static buffer."""
        layout = self.layouts.get(batch.padded_size)
        if batch.packed_inputs is None or self.inputs is None or batch.packed_inputs[1] != layout:
            raise RuntimeError(f"batch of padded size {batch.padded_size} was not packed for a captured graph")
        host = batch.packed_inputs[0]
        self.inputs[: host.numel()].copy_(host, non_blocking=True)

    def replay(self, batch: Batch, greedy: bool) -> StepOutputs:
        """Run a padded decode batch's step through its graph, the greedy variant or the one that stops at the
        logits. The logits and tokens are fresh copies; the payload and inputs are the graph's, valid until the
        next replay of the same size."""
        bs = batch.padded_size
        graph = (self.graphs if greedy else self.sampled_graphs).get(bs)
        if graph is None or self._backend is None:
            raise RuntimeError(f"no CUDA graph was captured for batch size {bs}")
        self.load_inputs(batch)
        self._backend.prepare_for_replay(batch)
        graph.replay()
        out = (self.outputs if greedy else self.sampled_outputs)[bs]
        tokens = out.tokens.clone() if out.tokens is not None else None
        return StepOutputs(out.logits.clone(), out.inputs, tokens, out.payload)

    def destroy(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.sampled_graphs.clear()
        self.sampled_outputs.clear()
        self.layouts.clear()
        self.inputs = None
        self._backend = None


def _capture(
    run: Callable[[], StepOutputs], stream: torch.cuda.Stream, pool: Pool | None
) -> tuple[torch.cuda.CUDAGraph, StepOutputs, Pool]:
    """Warm up (lazy inits must not land in the graph), then capture run into the shared pool."""
    run()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = run()
    return graph, out, graph.pool() if pool is None else pool
