"""A batch's device inputs: the new tokens' ids, their positions and the KV slots they write, built from validated
requests in one host-to-device upload, with the slot checks (LayerKernels.slot_check; engine/validate.py states
them) launched on the same tensors.

Host tensors are built with a fixed number of ops whatever the batch size, and nothing waits for the device: the
slot verdict is read with the step's tokens (Engine.forward_batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch

from .core import Req
from .device import upload
from .layers.kernels import LayerKernels
from .validate import Limits, SlotQuery, check_token_ids

_PLACEHOLDER = [0]


@dataclass
class BatchInputs:
    ids: torch.Tensor  # int32 [tokens], device: the new tokens, request by request
    positions: torch.Tensor  # int64 [tokens], device: their positions, which are also their page-table columns
    out_loc: torch.Tensor  # int32 [tokens], device: the KV slots they write (the dummy page's if flags say so)
    rows: torch.Tensor  # int64 [requests], device: each request's page-table row
    table_rows: torch.Tensor  # int64 [requests], device: the rows to read (the dummy row's if flags say so)
    flags: torch.Tensor  # bool [1], device: the slot verdict (True: refused), read with the step's tokens


def build_inputs(
    reqs: Sequence[Req],
    limits: Limits,
    page_table: torch.Tensor,
    live_rows: Mapping[int, tuple[int, int]],
    last_tokens: torch.Tensor,
    kernels: LayerKernels,
) -> BatchInputs:
    """Token ids (range-checked on the host; a pending token is read from last_tokens, the engine's per-row
    last sampled token), positions and write slots of the new tokens of validated requests. The slot checks run
    on the device and are not waited for: if they fail, every write goes to the dummy page and every read to the
    dummy row, and the verdict reaches the host with the step's tokens. kernels runs the slot checks (its
    slot_check). Runs on the engine's stream."""
    device = page_table.device
    parts = [r.new_token_ids() for r in reqs]
    pending = [i for i, r in enumerate(reqs) if r.token_pending]  # its only new token: 0 holds the place
    flat = [t for p in parts for t in (p or _PLACEHOLDER)]
    check_token_ids(reqs, parts, min(flat), max(flat), limits.vocab)
    ids = torch.tensor(flat)  # only now: an id past int64 would fail here before the message
    cached = [r.cached_len for r in reqs]
    device_lens = [r.device_len for r in reqs]
    extend = [d - c for c, d in zip(cached, device_lens)]
    n = len(reqs)
    if all(e == 1 for e in extend):
        token_req, positions = torch.arange(n), torch.tensor(cached)
        starts = list(range(n))
    else:
        ext = torch.tensor(extend)
        token_req = torch.repeat_interleave(torch.arange(n), ext)
        first = torch.repeat_interleave(torch.tensor(cached) - (torch.cumsum(ext, 0) - ext), ext)
        positions = torch.arange(len(token_req)) + first
        starts = [0, *accumulate(extend)][:-1]
    t = len(token_req)
    rows = [r.table_idx for r in reqs]
    in_batch = set(rows)
    others = [row for row in live_rows if row not in in_batch]
    other_lens = [live_rows[row][0] for row in others]
    pend_at = [starts[i] for i in pending] + [rows[i] for i in pending]
    host = torch.cat([
        torch.tensor(rows + cached + device_lens + starts + others + other_lens + pend_at), token_req, positions, ids,
    ])
    packed = upload(host, device)  # one transfer for everything the checks and inputs need
    rows_d, cached_d, device_d, starts_d = (packed[k * n : (k + 1) * n] for k in range(4))
    m, o = len(others), 4 * n
    others_d, other_lens_d = packed[o : o + m], packed[o + m : o + 2 * m]
    o += 2 * m
    pend_at_d, pend_rows_d = packed[o : o + len(pending)], packed[o + len(pending) : o + 2 * len(pending)]
    o += 2 * len(pending)
    token_req_d, positions_d = packed[o : o + t], packed[o + t : o + 2 * t]
    ids_d = packed[o + 2 * t :].to(torch.int32)
    if len(pending) == t:  # a decode step of pending tokens only: all ids come from the device
        ids_d = last_tokens.index_select(0, rows_d)
    elif pending:
        ids_d.index_copy_(0, pend_at_d, last_tokens.index_select(0, pend_rows_d))
    query = SlotQuery(rows_d, cached_d, device_d, starts_d, token_req_d, positions_d, others_d, other_lens_d,
                      max(device_lens), max(other_lens, default=0))
    out_loc, refused = kernels.slot_check(page_table, query, limits)
    out_loc = torch.where(refused, limits.num_slots, out_loc)  # slot num_slots: the dummy page's first
    table_rows = torch.where(refused, limits.max_rows, rows_d)  # row max_rows: the dummy row
    return BatchInputs(ids_d, positions_d, out_loc, rows_d, table_rows, refused.view(1))
