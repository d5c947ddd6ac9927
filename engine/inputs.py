"""A batch's device inputs: the new tokens' ids, their positions and the KV slots they write, built from validated
requests in one host-to-device upload, with the slot checks (engine/validate.py) launched on the same tensors.

Host tensors are built with a fixed number of ops whatever the batch size; check_slots reads the verdict back (one
sync) after the rest of the batch is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .core import Req
from .device import upload
from .validate import Limits, check_token_ids, slot_verdict


@dataclass
class BatchInputs:
    ids: torch.Tensor  # int32 [tokens], device: the new tokens, request by request
    positions: torch.Tensor  # int64 [tokens], device: their positions, which are also their page-table columns
    out_loc: torch.Tensor  # int32 [tokens], device: the KV slots they write
    flags: torch.Tensor  # bool [1 to 3], device: slot_verdict's, not yet read
    others: list[int]  # live page-table rows outside the batch, whose cached KV the batch may not overwrite


def build_inputs(
    reqs: Sequence[Req],
    limits: Limits,
    page_table: torch.Tensor,
    live_rows: Mapping[int, tuple[int, int]],
    device: torch.device,
) -> BatchInputs:
    """Token ids (range-checked on the host), positions and write slots of the new tokens of validated requests;
    the slot checks are launched on the device, not waited for. Runs on the engine's stream."""
    parts = [r.new_token_ids() for r in reqs]
    appended = all(isinstance(p, list) for p in parts)  # decode: the tokens the driver appended, as ints
    if appended:
        flat = [t for p in parts for t in p]
        lo, hi = min(flat), max(flat)
    else:
        ids = torch.cat([torch.as_tensor(p, dtype=torch.int64) for p in parts])
        lo, hi = (int(v) for v in ids.aminmax())
    check_token_ids(reqs, parts, lo, hi, limits.vocab)
    if appended:  # only now: an id past int64 would fail the tensor's construction before the message
        ids = torch.tensor(flat)
    cached = [r.cached_len for r in reqs]
    device_lens = [r.device_len for r in reqs]
    extend = [d - c for c, d in zip(cached, device_lens)]
    n = len(reqs)
    if all(e == 1 for e in extend):
        token_req, positions = torch.arange(n), torch.tensor(cached)
    else:
        ext = torch.tensor(extend)
        token_req = torch.repeat_interleave(torch.arange(n), ext)
        first = torch.repeat_interleave(torch.tensor(cached) - (torch.cumsum(ext, 0) - ext), ext)
        positions = torch.arange(len(token_req)) + first
    t = len(ids)
    rows = [r.table_idx for r in reqs]
    in_batch = set(rows)
    others = [row for row in live_rows if row not in in_batch]
    other_lens = [live_rows[row][0] for row in others]
    host = torch.cat([torch.tensor(rows + cached + device_lens + others + other_lens), token_req, positions, ids])
    packed = upload(host, device)  # one transfer for everything the checks and inputs need
    rows_d, cached_d, device_d = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n]
    o = 3 * n + 2 * len(others)
    others_d, other_lens_d = packed[3 * n : 3 * n + len(others)], packed[3 * n + len(others) : o]
    token_req_d, positions_d = packed[o : o + t], packed[o + t : o + 2 * t]
    ids_d = packed[o + 2 * t :].to(torch.int32)
    # The rows of the batch, as wide as the longest request: every slot it reads or writes is in there.
    table = page_table.index_select(0, rows_d)[:, : max(device_lens)]
    out_loc = table[token_req_d, positions_d]
    live = page_table.index_select(0, others_d)[:, : max(other_lens)] if others else None
    flags = slot_verdict(
        table, cached_d, device_d, out_loc, live, other_lens_d if others else None, limits,
        written_or_cached=len(ids) > 1 or max(cached) > 0 or bool(others),
    )
    return BatchInputs(ids_d, positions_d, out_loc, flags, others)
