"""The decode step's kernels behind StepKernels, picked by name (EngineConfig.step_kernels): the input ids, the slot
check with its redirect, a step's end (greedy, or keeping sampled tokens) and what a replay hands its caller. 'torch' is
the reference (StepKernels' methods, step/slots.py, sample.greedy_tokens); 'triton' (CUDA) runs each in a few launches
(engine/step/triton.py)."""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import Literal

import torch

from ..registry import Registry, Requires
from ..sample import greedy_tokens
from ..validate import Limits
from .slots import SlotQuery, redirected_slots


def keep_tokens(
    tokens: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
) -> torch.Tensor:
    """Keep the tokens as the rows' last tokens (-1 as 0, never an input id); returns ForwardOutput.host's payload."""
    before = last_tokens.index_select(0, rows)
    last_tokens.index_copy_(0, rows, tokens.clamp(min=0))
    return torch.cat([tokens, flags.to(torch.int32), before])


class StepKernels(ABC):
    """The torch reference is the default of each method."""

    name: str

    def input_ids(
        self, ids: torch.Tensor, pending: torch.Tensor, rows: torch.Tensor, token_req: torch.Tensor,
        last_tokens: torch.Tensor, kind: Literal["none", "all", "some"],
    ) -> torch.Tensor:
        """int32 [tokens]: the packed int64 ids, where a token is pending (kind 'all': every token, one per request;
        'some': where `pending` is nonzero) its request's row of last_tokens instead."""
        if kind == "all":
            return last_tokens.index_select(0, rows)
        ids = ids.to(torch.int32)
        if kind == "some":
            ids = torch.where(pending.bool(), last_tokens.index_select(0, rows.index_select(0, token_req)), ids)
        return ids

    def slot_check(
        self, page_table: torch.Tensor, query: SlotQuery, limits: Limits, padded: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(out_loc, table_rows, refused) after the slot verdict, not waited for (slots.redirected_slots)."""
        return redirected_slots(page_table, query, limits, padded)

    def greedy_step(
        self, logits: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A captured step's end: (greedy tokens, keep_tokens' payload)."""
        tokens = greedy_tokens(logits)
        return tokens, keep_tokens(tokens, last_tokens, rows, flags)

    def keep_tokens(
        self, tokens: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
    ) -> torch.Tensor:
        """A sampled step's end: the module's keep_tokens (the rows' last tokens, the host payload)."""
        return keep_tokens(tokens, last_tokens, rows, flags)

    def hand_out(
        self, logits: torch.Tensor, tokens: torch.Tensor | None, n: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A replay's outputs for its caller, fresh tensors that later replays leave alone: the first n rows of the
        logits upcast to float32, and of the tokens (None: none)."""
        return logits[:n].to(torch.float32, copy=True), None if tokens is None else tokens[:n].clone()

    def declines(self, op: str, *args: object) -> str | None:
        """Why op(*args) goes to the torch reference, or None."""
        return None


class TorchStepKernels(StepKernels):
    name = "torch"


TORCH_STEP_KERNELS = TorchStepKernels()


class TritonStepKernels(StepKernels):
    name = "triton"

    def __init__(self) -> None:
        from .triton import greedy_step, hand_out, input_ids, keep_tokens, slot_check

        self._input_ids, self._slot_check, self._greedy_step = input_ids, slot_check, greedy_step
        self._keep_tokens, self._hand_out = keep_tokens, hand_out
        self._slot_flags: dict[torch.device, torch.Tensor] = {}  # each device's, zero between checks

    def input_ids(
        self, ids: torch.Tensor, pending: torch.Tensor, rows: torch.Tensor, token_req: torch.Tensor,
        last_tokens: torch.Tensor, kind: Literal["none", "all", "some"],
    ) -> torch.Tensor:
        return self._input_ids(ids, pending, rows, token_req, last_tokens, kind)

    def slot_check(
        self, page_table: torch.Tensor, query: SlotQuery, limits: Limits, padded: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        device = page_table.device
        flag = self._slot_flags.get(device)
        if flag is None:
            flag = self._slot_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return self._slot_check(page_table, query, limits.num_slots, limits.page_size, limits.max_rows, padded, flag)

    def greedy_step(
        self, logits: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.declines("greedy_step", logits, last_tokens, rows, flags) is not None:
            return super().greedy_step(logits, last_tokens, rows, flags)
        return self._greedy_step(logits, last_tokens, rows, flags)

    def keep_tokens(
        self, tokens: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
    ) -> torch.Tensor:
        if self.declines("keep_tokens", tokens, last_tokens, rows, flags) is not None:
            return super().keep_tokens(tokens, last_tokens, rows, flags)
        return self._keep_tokens(tokens, last_tokens, rows, flags)

    def hand_out(
        self, logits: torch.Tensor, tokens: torch.Tensor | None, n: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.declines("hand_out", logits, tokens, n) is not None:
            return super().hand_out(logits, tokens, n)
        return self._hand_out(logits, tokens, n)

    def declines(self, op: str, *args: object) -> str | None:
        if op in ("greedy_step", "hand_out"):
            logits = args[0]
            assert isinstance(logits, torch.Tensor)
            if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16) or logits.stride(1) != 1:
                return "the kernel reads float32 or 16-bit logits with unit column stride"
        if op == "keep_tokens":
            tokens, last_tokens = args[0], args[1]
            assert isinstance(tokens, torch.Tensor) and isinstance(last_tokens, torch.Tensor)
            if tokens.dtype != torch.int32 or last_tokens.dtype != torch.int32 or tokens.numel() == 0:
                return "the keep kernel takes int32 tokens and last tokens, one row at least"
        if op == "hand_out":
            tokens = args[1]
            if isinstance(tokens, torch.Tensor) and tokens.stride(0) != 1:
                return "the hand-out kernel reads contiguous tokens"
        return None


STEP_KERNELS: Registry[Callable[[], StepKernels]] = Registry("step_kernels", preferred=("triton",))
"""Step kernel implementations by name (EngineConfig.step_kernels); a factory returns a StepKernels."""
STEP_KERNELS.register("torch", lambda: TORCH_STEP_KERNELS)
STEP_KERNELS.register("triton", TritonStepKernels, Requires(devices=("cuda",), package="triton"))
