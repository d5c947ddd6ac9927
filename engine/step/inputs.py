"""A batch's device inputs: the new tokens' ids, their positions and the KV slots they write, with the slot checks
(StepKernels.slot_check; engine/step/slots.py states them) launched on the same tensors.

Two halves: pack_inputs builds, on the host, one int64 tensor with everything the device needs (a fixed number of
ops whatever the batch size), and unpack_inputs turns its device copy into the inputs, waiting for nothing: the slot
verdict is read with the step's tokens (Engine.forward_batch). An eager pass runs both in prepare_batch; a
captured decode step runs unpack_inputs inside the graph, so its layout is fixed per graph size (padding rows,
every live row's place, max_seq_len long) and a replay only copies the packed tensor in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

import torch

from ..core import Req
from ..validate import Limits, check_token_ids
from .kernels import StepKernels
from .layout import BLOCKS, InputLayout
from .slots import SlotQuery

_PLACEHOLDER = [0]


@dataclass
class BatchInputs:
    ids: torch.Tensor  # int32 [tokens], device: the new tokens, request by request
    positions: torch.Tensor  # int64 [tokens], device: their positions, which are also their page-table columns
    out_loc: torch.Tensor  # int32 [tokens], device: the KV slots they write (the dummy page's if flags say so)
    rows: torch.Tensor  # int64 [requests], device: each request's page-table row
    table_rows: torch.Tensor  # int64 [requests], device: the rows to read (the dummy row's if flags say so)
    flags: torch.Tensor  # bool [1], device: the slot verdict (True: refused), read with the step's tokens


def pack_inputs(
    reqs: Sequence[Req],
    limits: Limits,
    live_rows: Mapping[int, tuple[int, int]],
    decode: bool,
    pad_to: int | None = None,
) -> tuple[torch.Tensor, InputLayout]:
    """The host half: token ids range-checked, everything else laid out as InputLayout says. A pending token (its
    request's only new one) gets its id on the device. pad_to: a graph's layout for pad_to requests, decode only
    (the dummy row pads the batch and the live rows outside it, to max_rows)."""
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
    if all(e <= 1 for e in extend):  # one token per request (a padding row's too)
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
    host = torch.tensor(rows + cached + device_lens + starts + others + other_lens + token_req + positions + flat
                        + mask)  # only now: an id past int64 would fail here, after check_token_ids's message
    layout = InputLayout(n, len(token_req), len(others), max_len, max_other_len, kind, decode, pad_to is not None)
    return host, layout


def unpack_inputs(
    packed: torch.Tensor,
    layout: InputLayout,
    page_table: torch.Tensor,
    last_tokens: torch.Tensor,
    kernels: StepKernels,
    limits: Limits,
) -> BatchInputs:
    """The device half, from the packed tensor on the device: pending ids read from last_tokens (the engine's
    per-row last sampled token), the slot checks launched by kernels.slot_check and not waited for. If they fail,
    every write goes to the dummy page and every read to the dummy row; padding rows write the dummy page too."""
    rows, cached, device_lens, starts, others, other_lens, token_req, positions, ids, mask = (
        packed[layout.span(name)] for name, _ in BLOCKS
    )
    ids = ids.to(torch.int32)
    if layout.pending == "all":  # a decode step of pending tokens only
        ids = last_tokens.index_select(0, rows)
    elif layout.pending == "some":
        ids = torch.where(mask.bool(), last_tokens.index_select(0, rows.index_select(0, token_req)), ids)
    query = SlotQuery(rows, cached, device_lens, starts, token_req, positions, others, other_lens,
                      layout.max_len, layout.max_other_len)
    out_loc, table_rows, refused = kernels.slot_check(page_table, query, limits, layout.padded)
    return BatchInputs(ids, positions, out_loc, rows, table_rows, refused.view(1))
