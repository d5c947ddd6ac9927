"""The layout of a batch's packed inputs (engine/step/inputs.py): which block of the one int64 tensor holds what."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

# The packed tensor's blocks in order, each with what it has one entry per.
BLOCKS = (
    ("rows", "requests"), ("cached", "requests"), ("device_len", "requests"), ("starts", "requests"),
    ("others", "others"), ("other_lens", "others"),
    ("token_req", "tokens"), ("positions", "tokens"), ("ids", "tokens"), ("pending", "tokens"),
)


@dataclass(frozen=True)
class InputLayout:
    """The shape of a packed input tensor (BLOCKS; span() finds each)."""

    requests: int
    tokens: int
    others: int
    max_len: int  # a graph's: max_seq_len
    max_other_len: int  # a graph's: max_seq_len
    pending: Literal["none", "all", "some"]  # which ids come from the rows' last sampled tokens
    decode: bool
    padded: bool  # a graph's: requests with device_len 0 pad the batch and write the dummy page
    one_each: bool  # token k is request k's, at position cached[k] (SlotQuery.one_each)

    @cached_property
    def _spans(self) -> dict[str, slice]:
        spans, start = {}, 0
        for name, count in BLOCKS:
            length = 0 if name == "pending" and self.pending != "some" else getattr(self, count)
            spans[name], start = slice(start, start + length), start + length
        return spans

    def span(self, name: str) -> slice:
        return self._spans[name]

    @property
    def size(self) -> int:
        return self._spans["pending"].stop
