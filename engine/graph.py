"""The graph runner: captures whole decode steps as CUDA graphs in several modes per size (greedy: the tokens too;
logits: the logits alone, the draw made after; and the sampler's graph_modes(), which draw a sampled batch inside),
largest size first so all share one memory pool, and pads a batch with dummy requests to a captured size. A replay
is one upload and one launch; disabled on CPU.
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

Mode = str  # "greedy", "logits", or one of the sampler's graph_modes()


@dataclass
class StepOutputs:
    logits: torch.Tensor  # [bs, vocab]: the model's dtype in a captured step, float32 from replay()
    inputs: BatchInputs
    tokens: torch.Tensor | None = None  # int32 [bs], -1: nothing to sample; not in logits mode
    # int32 [2 bs + 1]: tokens, slot verdict, the rows' last tokens before the step; not in logits mode
    payload: torch.Tensor | None = None


StepFn = Callable[[torch.Tensor, InputLayout, Batch, Mode], StepOutputs]
HandOut = Callable[[torch.Tensor, torch.Tensor | None, int], tuple[torch.Tensor, torch.Tensor | None]]
Pool = Any  # torch.cuda._POOL_HANDLE
PackFn = Callable[[int], tuple[torch.Tensor, InputLayout]]


def default_graph_bs(max_bs: int) -> list[int]:
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class GraphRunner:
    def __init__(self, dummy_req: Req, bs_list: list[int], enabled: bool, hand_out: HandOut) -> None:
        """hand_out: StepKernels.hand_out, which copies a replay's outputs for its caller."""
        self.dummy_req = dummy_req
        self.hand_out = hand_out
        self.enabled = enabled and bool(bs_list)
        self.bs_list = sorted(set(bs_list)) if self.enabled else []
        self.graphs: dict[Mode, dict[int, torch.cuda.CUDAGraph]] = {}
        self.outputs: dict[Mode, dict[int, StepOutputs]] = {}
        self.layouts: dict[int, InputLayout] = {}
        self.inputs: torch.Tensor | None = None
        self._backend: BaseAttnBackend | None = None

    @property
    def max_bs(self) -> int:
        return self.bs_list[-1] if self.bs_list else 0

    def has_graph(self, bs: int, mode: Mode = "greedy") -> bool:
        return bs in self.graphs.get(mode, {})

    def can_use_graph(self, batch: Batch) -> bool:
        return self.enabled and batch.is_decode and batch.size <= self.max_bs

    def padded_size(self, bs: int) -> int:
        return next(size for size in self.bs_list if size >= bs)

    def pad_batch(self, batch: Batch) -> None:
        if not self.can_use_graph(batch):
            batch.padded_reqs = list(batch.reqs)
            return
        extra = self.padded_size(batch.size) - batch.size
        batch.padded_reqs = list(batch.reqs) + [self.dummy_req] * extra

    @torch.inference_mode()
    def capture(
        self, step: StepFn, pack: PackFn, backend: BaseAttnBackend, stream: torch.cuda.Stream, max_seq_len: int,
        device: torch.device, modes: tuple[Mode, ...] = ("greedy", "logits"),
    ) -> None:
        """Capture each size in each mode; the first mode's logits buffer is every mode's."""
        if not self.enabled:
            return
        for mode in modes:
            self.graphs[mode], self.outputs[mode] = {}, {}
        padding = {bs: pack(bs) for bs in self.bs_list}
        self.inputs = torch.zeros(max(layout.size for _, layout in padding.values()), dtype=torch.int64,
                                  device=device)
        backend.init_capture_graph(max_seq_len, self.bs_list)
        self._backend = backend
        pool: Pool | None = None
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for bs in reversed(self.bs_list):
                host, layout = padding[bs]
                packed = self.inputs[: layout.size]
                packed.copy_(host)
                batch = Batch([self.dummy_req] * bs, "decode")
                backend.prepare_for_capture(batch)
                pool = self._capture_size(bs, functools.partial(step, packed, layout, batch), modes, stream, pool)
                self.layouts[bs] = layout
        stream.synchronize()

    def _capture_size(
        self, bs: int, step: Callable[[Mode], StepOutputs], modes: tuple[Mode, ...], stream: torch.cuda.Stream,
        pool: Pool | None,
    ) -> Pool:
        first, *rest = modes
        self.graphs[first][bs], self.outputs[first][bs], pool = _capture(functools.partial(step, first), stream, pool)
        logits = self.outputs[first][bs].logits
        for mode in rest:  # one logits buffer per size, whatever the mode
            run = functools.partial(_into, logits, functools.partial(step, mode))
            self.graphs[mode][bs], self.outputs[mode][bs], pool = _capture(run, stream, pool)
        return pool

    def load_inputs(self, batch: Batch) -> None:
        layout = self.layouts.get(batch.padded_size)
        if batch.packed_inputs is None or self.inputs is None or batch.packed_inputs[1] != layout:
            raise RuntimeError(f"batch of padded size {batch.padded_size} was not packed for a captured graph")
        host = batch.packed_inputs[0]
        self.inputs[: host.numel()].copy_(host, non_blocking=True)

    def replay(self, batch: Batch, mode: Mode) -> StepOutputs:
        """The batch's rows of logits (upcast to float32) and tokens come back as copies (the caller may hold them for
        any number of later steps; padding rows are left out); payload and inputs are valid until the next replay of
        this size."""
        bs = batch.padded_size
        graph = self.graphs.get(mode, {}).get(bs)
        if graph is None or self._backend is None:
            raise RuntimeError(f"no CUDA graph was captured for batch size {bs} in mode {mode!r}")
        self.load_inputs(batch)
        self._backend.prepare_for_replay(batch)
        graph.replay()
        out = self.outputs[mode][bs]
        logits, tokens = self.hand_out(out.logits, out.tokens, batch.size)
        return StepOutputs(logits, out.inputs, tokens, out.payload)

    def destroy(self) -> None:
        self.graphs.clear()
        self.outputs.clear()
        self.layouts.clear()
        self.inputs = None
        self._backend = None


def _into(logits: torch.Tensor, step: Callable[[], StepOutputs]) -> StepOutputs:
    out = step()
    logits.copy_(out.logits)
    return StepOutputs(logits, out.inputs, out.tokens, out.payload)


def _capture(
    run: Callable[[], StepOutputs], stream: torch.cuda.Stream, pool: Pool | None
) -> tuple[torch.cuda.CUDAGraph, StepOutputs, Pool]:
    """Warm up (lazy inits must not land in the graph), then capture."""
    run()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = run()
    return graph, out, graph.pool() if pool is None else pool
