"""The slot rule, stated once: every slot a request reads lies in the KV pool (page-structured when page_size > 1),
and no new token lands on another new token or on cached KV of the batch or of a live row (Engine.live_rows). The
step kernels run it on the device; a refused step touches only the dummy page; slot_error words the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..core import Batch, Req
from ..errors import InvalidRequestError
from ..validate import Limits


@dataclass
class SlotQuery:
    # int64 [n] per request, [tokens] per new token, [m] per live row outside the batch
    rows: torch.Tensor
    cached: torch.Tensor
    device_len: torch.Tensor
    starts: torch.Tensor  # each request's first new token in the batch
    token_req: torch.Tensor
    positions: torch.Tensor
    others: torch.Tensor
    other_lens: torch.Tensor
    max_len: int
    max_other_len: int
    one_each: bool = False  # token k is request k's, at position cached[k] (a decode layout: one token at most each)


@dataclass
class SlotFaults:
    """Per-slot bool masks of where a batch breaks the rule."""

    out_of_pool: torch.Tensor  # [n, max_len]
    off_page: torch.Tensor | None  # [n, max_len], page_size > 1 only
    overwrite: torch.Tensor | None  # [tokens]

    def verdict(self) -> torch.Tensor:
        return torch.stack([m.any() for m in (self.out_of_pool, self.off_page, self.overwrite) if m is not None])


def redirected_slots(
    page_table: torch.Tensor, q: SlotQuery, limits: Limits, padded: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """slot_check, then (out_loc, table_rows, refused): a refused step (and padding) uses the dummy page."""
    out_loc, refused = slot_check(page_table, q, limits)
    to_dummy = refused | (q.device_len == 0) if padded else refused
    out_loc = torch.where(to_dummy, limits.num_slots, out_loc)
    return out_loc, torch.where(refused, limits.max_rows, q.rows), refused


def slot_check(page_table: torch.Tensor, q: SlotQuery, limits: Limits) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 [tokens] written slots, bool [] refuse), launched and not waited for."""
    table, out_loc, live = _gather(page_table, q)
    flags = slot_verdict(table, q.cached, q.device_len, out_loc, live, q.other_lens if live is not None else None,
                         limits, _written_or_cached(q, out_loc))
    return out_loc, flags.any()


def slot_verdict(
    table: torch.Tensor,
    cached: torch.Tensor,
    device_len: torch.Tensor,
    out_loc: torch.Tensor,
    live: torch.Tensor | None,
    live_lens: torch.Tensor | None,
    limits: Limits,
    written_or_cached: bool,
) -> torch.Tensor:
    return slot_faults(table, cached, device_len, out_loc, live, live_lens, limits, written_or_cached).verdict()


def slot_faults(
    table: torch.Tensor,
    cached: torch.Tensor,
    device_len: torch.Tensor,
    out_loc: torch.Tensor,
    live: torch.Tensor | None,
    live_lens: torch.Tensor | None,
    limits: Limits,
    written_or_cached: bool,
) -> SlotFaults:
    """The rule itself; `live`, `live_lens`: the live rows outside the batch and their cached lengths."""
    num_slots, ps = limits.num_slots, limits.page_size
    cols = torch.arange(table.shape[1], device=table.device)
    used = cols < device_len.unsqueeze(1)
    out_of_pool = ((table < 0) | (table >= num_slots)) & used
    off_page = None
    if ps > 1:
        # Paged kernels read whole pages: position j sits at offset j % ps of its block's page.
        first = table[:, (cols // ps) * ps]
        off_page = ((table % ps != cols % ps) | (table // ps != first // ps)) & used
    overwrite = None
    if written_or_cached:
        # Cached slots count 2, each new token adds 1: over 1 is a clash (isin and sort would sync).
        hits = torch.zeros(num_slots + 1, dtype=torch.int32, device=table.device)
        cached_slots = torch.where((cols < cached.unsqueeze(1)) & ~out_of_pool, table, num_slots)
        hits.index_fill_(0, cached_slots.flatten().long(), 2)
        if live is not None and live_lens is not None:
            live_cols = torch.arange(live.shape[1], device=live.device)
            held = (live_cols < live_lens.unsqueeze(1)) & (live >= 0) & (live < num_slots)
            hits.index_fill_(0, torch.where(held, live, num_slots).flatten().long(), 2)
        written = torch.where((out_loc >= 0) & (out_loc < num_slots), out_loc, num_slots).long()
        hits.index_add_(0, written, torch.ones_like(written, dtype=torch.int32))
        hits[num_slots:].zero_()
        overwrite = hits[written] > 1
    return SlotFaults(out_of_pool, off_page, overwrite)


def _gather(page_table: torch.Tensor, q: SlotQuery) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    table = page_table.index_select(0, q.rows)[:, : q.max_len]
    live = page_table.index_select(0, q.others)[:, : q.max_other_len] if q.max_other_len else None
    return table, table[q.token_req, q.positions], live


def _written_or_cached(q: SlotQuery, out_loc: torch.Tensor) -> bool:
    return len(out_loc) > 1 or q.max_other_len > 0 or q.max_len > 1


def slot_error(
    batch: Batch, page_table: torch.Tensor, limits: Limits, live_rows: Mapping[int, tuple[int, int]]
) -> InvalidRequestError:
    """The error of an undone step whose slot verdict failed, naming the culprit slot and check."""
    reqs = batch.reqs
    cached = [c for c, _ in batch.spans]
    q = _host_query(reqs, cached, batch.ends, live_rows, page_table.device)
    table, out_loc, live = _gather(page_table, q)
    faults = slot_faults(table, q.cached, q.device_len, out_loc, live, q.other_lens if live is not None else None,
                         limits, _written_or_cached(q, out_loc))
    rows = table.tolist()
    ps = limits.page_size
    checks = [("pool", faults.out_of_pool), ("page", faults.off_page)]
    for i, req in enumerate(reqs):
        for check, mask in checks:
            bad = mask[i].nonzero().flatten().tolist() if mask is not None else []
            if not bad:
                continue
            pos = bad[0]
            cell = f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {rows[i][pos]}"
            if check == "pool":
                return InvalidRequestError(
                    f"{cell} is not a KV slot: slots lie in [0, num_pages * page_size = {limits.num_slots})"
                )
            block = pos - pos % ps
            page = rows[i][block] // ps
            return InvalidRequestError(
                f"{cell} breaks the page structure: with page_size={ps}, position {pos} must be slot "
                f"{page * ps + pos % ps} (offset {pos % ps} of page {page}, which holds position {block})"
            )
    if faults.overwrite is not None:
        flagged = faults.overwrite.nonzero().flatten().tolist()
        token_req, positions, slots = q.token_req.tolist(), q.positions.tolist(), out_loc.tolist()
        seen: set[int] = set()
        for k in flagged:
            req, pos, slot = reqs[token_req[k]], positions[k], slots[k]
            whose = _owner(slot, reqs, cached, page_table, live_rows)
            whose = whose or ("another new token" if slot in seen else None)
            if whose is not None:
                return InvalidRequestError(
                    f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {slot} would overwrite {whose}; give "
                    "every new token a slot of its own"
                )
            seen.add(slot)
    return InvalidRequestError(
        "the step's page-table rows mapped a slot outside the KV pool, across pages, or over live KV, and were "
        "changed before its tokens were read; check the page table"
    )


def _host_query(
    reqs: Sequence[Req], cached: list[int], ends: list[int], live_rows: Mapping[int, tuple[int, int]],
    device: torch.device,
) -> SlotQuery:
    in_batch = {r.table_idx for r in reqs}
    others = [row for row in live_rows if row not in in_batch]
    other_lens = [live_rows[row][0] for row in others]
    extend = [e - c for c, e in zip(cached, ends)]
    token_req = [i for i, n in enumerate(extend) for _ in range(n)]
    positions = [c + j for c, n in zip(cached, extend) for j in range(n)]
    starts = [sum(extend[:i]) for i in range(len(reqs))]

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return SlotQuery(t([r.table_idx for r in reqs]), t(cached), t(ends), t(starts), t(token_req), t(positions),
                     t(others), t(other_lens), max(ends), max(other_lens, default=0))


def _owner(
    slot: int, reqs: Sequence[Req], cached: list[int], page_table: torch.Tensor,
    live_rows: Mapping[int, tuple[int, int]],
) -> str | None:
    for req, length in zip(reqs, cached):
        if slot in page_table[req.table_idx, :length].tolist():
            return f"cached KV of request {req.uid}"
    in_batch = {r.table_idx for r in reqs}
    for row, (kv_len, uid) in live_rows.items():
        if row not in in_batch and slot in page_table[row, :kv_len].tolist():
            return (
                f"cached KV of request {uid} in page-table row {row}, outside this batch (if that request is done, "
                f"release its row first: engine.release_rows([{row}]))"
            )
    return None
