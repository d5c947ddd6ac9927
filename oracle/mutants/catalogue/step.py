"""Step mutants (engine.engine and the CUDA graph runner): a batch's positions, row order, padding slots,
live-row checks and logits buffer, and what a graph replay copies in and hands out."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Sequence
from typing import Any

import torch

import engine.engine as engine_module
from engine.core import Batch, Phase, Req
from engine.engine import Engine
from engine.graph import GraphRunner, Mode, StepOutputs
from engine.sample import BatchSamplingArgs
from engine.step import ForwardOutput
from engine.step.inputs import BatchInputs
from engine.step.layout import InputLayout

from .base import swap

_ORIGINAL_PREPARE_BATCH = Engine.prepare_batch
_ORIGINAL_PACK_INPUTS = engine_module.pack_inputs
_ORIGINAL_UNPACK_INPUTS = engine_module.unpack_inputs
_ORIGINAL_FORWARD_BATCH = Engine.forward_batch
_ORIGINAL_REPLAY = GraphRunner.replay
_ORIGINAL_LOAD_INPUTS = GraphRunner.load_inputs


def _unpack_inputs_decode_position(packed: torch.Tensor, layout: InputLayout, *rest: Any) -> BatchInputs:
    """A decode token's RoPE position is device_len (counted after the step's increment) instead of device_len - 1;
    its KV slot stays right. Inputs are unpacked inside a captured step too, so graph replays carry the bug.

    Shifting *every* position by one would be invisible (RoPE only sees differences); this shift is not, because
    the prefill positions stay right.
    """
    inputs = _ORIGINAL_UNPACK_INPUTS(packed, layout, *rest)
    if layout.decode:
        inputs.positions = inputs.positions + 1
    return inputs


def rope_off_by_one() -> contextlib.AbstractContextManager[None]:
    # The engine reaches unpack_inputs through engine.engine's module-level name, eagerly and in graph capture.
    return swap(engine_module, "unpack_inputs", _unpack_inputs_decode_position)


def _prepare_batch_extend_positions_from_zero(self: Engine, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, Any]:
    """A prefill chunk's RoPE positions restart at 0 instead of continuing at cached_len; its KV slots stay right."""
    batch, args = _ORIGINAL_PREPARE_BATCH(self, reqs, phase)
    if phase == "prefill":
        cached = torch.tensor([r.cached_len for r in reqs])
        lengths = torch.tensor([r.extend_len for r in reqs])
        batch.positions = batch.positions - torch.repeat_interleave(cached, lengths).to(batch.positions.device)
    return batch, args


def extend_positions_restart() -> contextlib.AbstractContextManager[None]:
    return swap(Engine, "prepare_batch", _prepare_batch_extend_positions_from_zero)


def _prepare_batch_sorted_by_length(self: Engine, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, Any]:
    """A prefill batch is sorted longest first, and its rows come back in that order, not in the caller's."""
    ordered = sorted(reqs, key=lambda r: -r.extend_len) if phase == "prefill" else reqs
    return _ORIGINAL_PREPARE_BATCH(self, ordered, phase)


def batch_rows_sorted_by_length() -> contextlib.AbstractContextManager[None]:
    return swap(Engine, "prepare_batch", _prepare_batch_sorted_by_length)


def _unpack_inputs_pad_slot_zero(packed: torch.Tensor, layout: InputLayout, *rest: Any) -> BatchInputs:
    """The dummy rows that pad a decode batch write their K/V to slot 0 (a convention of engines that reserve slot 0
    for padding) instead of the dummy page; here slot 0 is a real request's."""
    inputs = _ORIGINAL_UNPACK_INPUTS(packed, layout, *rest)
    if layout.padded:
        padding = packed[layout.span("device_len")] == 0
        inputs.out_loc = torch.where(padding, 0, inputs.out_loc)
    return inputs


def pad_slot_zero() -> contextlib.AbstractContextManager[None]:
    return swap(engine_module, "unpack_inputs", _unpack_inputs_pad_slot_zero)


def _pack_inputs_without_live_rows(
    reqs: Sequence[Req], limits: Any, live_rows: Any, decode: bool, pad_to: int | None = None
) -> tuple[torch.Tensor, InputLayout]:
    """The slot checks leave out the live rows outside the batch (its `others` are empty): a new token may overwrite
    the cached KV of a running request that is not in this batch; the checks within the batch are unchanged."""
    return _ORIGINAL_PACK_INPUTS(reqs, limits, {}, decode, pad_to)


def live_rows_unchecked() -> contextlib.AbstractContextManager[None]:
    # Engine.prepare_batch reaches pack_inputs through engine.engine's module-level name; only that name is rebound.
    return swap(engine_module, "pack_inputs", _pack_inputs_without_live_rows)


_SHARED_LOGITS: weakref.WeakKeyDictionary[Engine, torch.Tensor] = weakref.WeakKeyDictionary()


@torch.inference_mode()
def _forward_batch_into_shared_logits(self: Engine, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
    """The logits come back as a view of one buffer per engine, which every later step overwrites."""
    out = _ORIGINAL_FORWARD_BATCH(self, batch, args)
    rows = self.config.max_running_req
    if self not in _SHARED_LOGITS:
        _SHARED_LOGITS[self] = out.logits.new_empty(rows, out.logits.shape[1])
    shared = _SHARED_LOGITS[self][: out.logits.shape[0]]
    shared.copy_(out.logits)
    return dataclasses.replace(out, logits=shared)


def logits_alias_buffer() -> contextlib.AbstractContextManager[None]:
    return swap(Engine, "forward_batch", _forward_batch_into_shared_logits)


# ---- CUDA graphs: replay outputs and inputs --------------------------------------------------------------------------


def _replay_hands_out_static_output(self: GraphRunner, batch: Batch, mode: Mode) -> StepOutputs:
    """A replay returns the graph's static logits and tokens themselves, not copies: the next replay overwrites
    them."""
    _ORIGINAL_REPLAY(self, batch, mode)
    return self.outputs[mode][batch.padded_size]


def graph_logits_alias() -> contextlib.AbstractContextManager[None]:
    return swap(GraphRunner, "replay", _replay_hands_out_static_output)


def _load_inputs_keeping_positions(self: GraphRunner, batch: Batch) -> None:
    """A replay copies the step's packed inputs except its positions block: every replay runs on the positions
    the static buffer held before (the capture's, 0)."""
    positions = self.layouts[batch.padded_size].span("positions")
    assert self.inputs is not None
    kept = self.inputs[positions].clone()
    _ORIGINAL_LOAD_INPUTS(self, batch)
    self.inputs[positions].copy_(kept)


def graph_positions_stale() -> contextlib.AbstractContextManager[None]:
    return swap(GraphRunner, "load_inputs", _load_inputs_keeping_positions)
