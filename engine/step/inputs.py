"""A batch's device inputs (ids, positions, written slots, with the slot checks launched on them): pack_inputs builds
one int64 host tensor, unpack_inputs turns its device copy into the inputs without waiting. A captured step runs
unpack_inputs inside the graph, so its layout is fixed per graph size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import torch

from ..core import Req
from ..device import host_tensor
from ..validate import Limits, check_token_ids
from .kernels import StepKernels
from .layout import BLOCKS, InputLayout
from .slots import SlotQuery

_PLACEHOLDER = [0]


@dataclass
class BatchInputs:
    ids: torch.Tensor  # int32 [tokens]
    positions: torch.Tensor  # int64 [tokens]
    device_lens: torch.Tensor  # int64 [requests]: each request's length after the pass
    out_loc: torch.Tensor  # int32 [tokens]
    rows: torch.Tensor  # int64 [requests]
    table_rows: torch.Tensor  # int64 [requests]: the dummy row when refused
    flags: torch.Tensor  # bool [1]: the slot verdict


def pack_inputs(
    reqs: Sequence[Req],
    limits: Limits,
    live_rows: Mapping[int, tuple[int, int]],
    decode: bool,
    pad_to: int | None = None,
) -> tuple[torch.Tensor, InputLayout]:
    """The host half, token ids range-checked; pad_to: a graph's layout for pad_to requests (decode only)."""
    parts = [r.new_token_ids() for r in reqs]
    flat = [t for p in parts for t in (p or _PLACEHOLDER)]
    if flat:
        check_token_ids(reqs, parts, min(flat), max(flat), limits.vocab)
    pending = [r.token_pending for r in reqs]
    cached = [r.cached_len for r in reqs]
    device_lens = [r.device_len for r in reqs]
    rows = [r.table_idx for r in reqs]
    in_batch = set(rows)
    others = [row for row in live_rows if row not in in_batch]
    other_lens = [live_rows[row][0] for row in others]
    n = len(reqs)
    if pad_to is not None:
        pad, dummy = pad_to - n, limits.max_rows
        rows += [dummy] * pad
        cached += [0] * pad
        device_lens += [0] * pad
        others += [dummy] * (limits.max_rows - len(others))
        other_lens += [0] * (limits.max_rows - len(other_lens))
        flat += [0] * pad
        pending += [False] * pad
        n = pad_to
    extend = [d - c for c, d in zip(cached, device_lens)]
    one_each = all(e <= 1 for e in extend)
    if one_each:
        token_req, positions = list(range(n)), cached
        starts = token_req
    else:
        starts = [0, *accumulate(extend)][:-1]
        token_req = [i for i, e in enumerate(extend) for _ in range(e)]
        positions = [c + j for c, e in zip(cached, extend) for j in range(e)]
    if pad_to is not None:
        kind: Literal["none", "all", "some"] = "some"
        max_len = max_other_len = limits.max_seq_len
    else:
        kind = "all" if all(pending) else "some" if any(pending) else "none"
        max_len, max_other_len = max(device_lens), max(other_lens, default=0)
    mask = [int(pending[i]) for i in token_req] if kind == "some" else []
    host = host_tensor(rows + cached + device_lens + starts + others + other_lens + token_req + positions + flat
                       + mask)  # after check_token_ids: an id past int64 would fail here
    layout = InputLayout(n, len(token_req), len(others), max_len, max_other_len, kind, decode, pad_to is not None,
                         one_each)
    return host, layout


def unpack_inputs(
    packed: torch.Tensor,
    layout: InputLayout,
    page_table: torch.Tensor,
    last_tokens: torch.Tensor,
    kernels: StepKernels,
    limits: Limits,
) -> BatchInputs:
    """The device half: pending ids from last_tokens, the slot checks launched and not waited for."""
    rows, cached, device_lens, starts, others, other_lens, token_req, positions, ids, mask = (
        packed[layout.span(name)] for name, _ in BLOCKS
    )
    ids = kernels.input_ids(ids, mask, rows, token_req, last_tokens, layout.pending)
    query = SlotQuery(rows, cached, device_lens, starts, token_req, positions, others, other_lens,
                      layout.max_len, layout.max_other_len, layout.one_each)
    out_loc, table_rows, refused = kernels.slot_check(page_table, query, limits, layout.padded)
    return BatchInputs(ids, positions, device_lens, out_loc, rows, table_rows, refused.view(1))
