"""Checks inputs before anything is written, so a rejected call changes no state. Nothing here takes the Engine:
each check gets the limits and state it reads.

validate_batch (host checks) and check_token_ids run in prepare_batch. The slot checks (slot_check, and with the
redirect redirected_slots: the torch reference of LayerKernels.slot_check) are launched on the device by
engine/inputs.py's unpack_inputs, inside a captured step too, and not waited for: every slot read lies in the pool
(page-structured when page_size > 1), and no new token may land on another new token or on cached KV of the batch or
of a live row (Engine.live_rows), since a row's live KV is overwritten only by the request that owns it until the
row is released. A failed verdict sends the step's reads and writes to the dummy
page and comes back with its tokens, where raise_slot_error names the culprit. check_fresh runs in forward_batch;
prompt_list guards the driver's add(); check_memory runs before the engine allocates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .core import Batch, Phase, Req, SamplingParams, is_int, token_list
from .errors import CapacityError, InvalidRequestError
from .sample import BatchSamplingArgs


@dataclass(frozen=True)
class Limits:
    """What a batch is checked against, fixed when the engine is built."""

    max_rows: int  # max_running_req: page-table rows [0, max_rows) belong to requests
    max_seq_len: int
    vocab: int
    num_slots: int  # num_pages * page_size: the real KV slots; the dummy page's start here
    page_size: int


def validate_batch(
    reqs: Sequence[Req], phase: Phase, limits: Limits, live_rows: Mapping[int, tuple[int, int]]
) -> None:
    """The host-side checks of every request; nothing is read from the device."""
    if phase not in ("prefill", "decode"):
        raise InvalidRequestError(f"phase={phase!r} is invalid: use 'prefill' or 'decode'")
    if not isinstance(reqs, (list, tuple)):
        raise InvalidRequestError(f"reqs must be a list or tuple of Req, got {type(reqs).__name__}")
    if not reqs:
        raise InvalidRequestError("a batch needs at least one request")
    rows_seen: set[int] = set()
    for i, req in enumerate(reqs):
        if not isinstance(req, Req):
            raise InvalidRequestError(f"batch entry {i} is a {type(req).__name__}, not a Req")
        _validate_req(req, phase, limits)
        live = live_rows.get(req.table_idx)
        if req.device_len > req.num_tokens and not (
            req.token_pending and req.extend_len == 1 and live == (req.cached_len, req.uid)
        ):
            raise InvalidRequestError(
                f"request {req.uid}: device_len={req.device_len} exceeds the {req.num_tokens} known tokens (append "
                "the sampled token with append_host() before the next step, or run the step right after the one "
                "that sampled it, whose token the engine keeps on the device)"
            )
        if live is not None and live[1] != req.uid and live[0] > req.cached_len:
            # Its new tokens would land on the live request's own slots: the page table cannot tell them apart.
            raise InvalidRequestError(
                f"request {req.uid}: page-table row {req.table_idx} holds the live KV of request {live[1]} "
                f"({live[0]} tokens); release the row first (engine.release_rows([{req.table_idx}])) or use another"
            )
        if req.table_idx in rows_seen:
            raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is used twice in the batch")
        rows_seen.add(req.table_idx)


def _validate_req(req: Req, phase: Phase, limits: Limits) -> None:
    if type(req.token_ids) is not list:  # Req builds it; only an assignment from outside can break it
        raise InvalidRequestError(
            f"request {req.uid}: token_ids must be the list of ints Req builds, got {type(req.token_ids).__name__}"
        )
    num_tokens = req.num_tokens
    if num_tokens == 0:
        raise InvalidRequestError(f"request {req.uid}: the prompt is empty; give at least one token")
    if not isinstance(req.sampling_params, SamplingParams):
        raise InvalidRequestError(
            f"request {req.uid}: sampling_params must be a SamplingParams, got {type(req.sampling_params).__name__}"
        )
    for name in ("table_idx", "cached_len", "device_len"):
        value = getattr(req, name)
        if type(value) is not int:
            if not is_int(value):
                raise InvalidRequestError(f"request {req.uid}: {name}={value!r} is not an int")
            setattr(req, name, int(value))  # a NumPy int would leak NumPy bools into the kernels
    max_rows = limits.max_rows
    if not (0 <= req.table_idx < max_rows):
        raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is out of range [0, {max_rows})")
    if not (0 <= req.cached_len < req.device_len):
        raise InvalidRequestError(
            f"request {req.uid}: cached_len={req.cached_len} must be in [0, device_len={req.device_len})"
        )
    if req.device_len > limits.max_seq_len:
        raise InvalidRequestError(
            f"request {req.uid}: {req.device_len} tokens exceed max_seq_len={limits.max_seq_len}"
        )
    if phase == "decode" and req.device_len - req.cached_len != 1:
        raise InvalidRequestError(
            f"request {req.uid}: a decode step computes one token, but extend_len={req.extend_len}"
        )


def check_token_ids(reqs: Sequence[Req], parts: Sequence[list[int]], lo: int, hi: int, vocab: int) -> None:
    """Every new token id lies in the vocabulary (lo and hi: the smallest and largest of them)."""
    if lo >= 0 and hi < vocab:
        return
    for req, part in zip(reqs, parts):
        bad = next((t for t in part if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"request {req.uid}: token id {bad} is outside the vocabulary [0, {vocab})")


@dataclass
class SlotQuery:
    """A batch's page-table rows and lengths on the device, what the slot checks read (Engine.ctx.kernels does
    them: slot_check below is the torch reference)."""

    rows: torch.Tensor  # int64 [n]: each request's page-table row
    cached: torch.Tensor  # int64 [n]: cached_len
    device_len: torch.Tensor  # int64 [n]
    starts: torch.Tensor  # int64 [n]: index of each request's first new token in the batch
    token_req: torch.Tensor  # int64 [tokens]: the request of each new token
    positions: torch.Tensor  # int64 [tokens]: its position, also its page-table column
    others: torch.Tensor  # int64 [m]: live rows outside the batch
    other_lens: torch.Tensor  # int64 [m]: their cached lengths
    max_len: int  # the longest device_len
    max_other_len: int  # the longest of other_lens (0 without live rows outside)


def redirected_slots(
    page_table: torch.Tensor, q: SlotQuery, limits: Limits, padded: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """slot_check, then where its verdict sends the step: (out_loc, table_rows, refused). A refused step writes only
    the dummy page (slot num_slots, its first) and reads only the dummy row (max_rows); padded: padding requests
    (device_len 0, one token each) write the dummy page too."""
    out_loc, refused = slot_check(page_table, q, limits)
    to_dummy = refused | (q.device_len == 0) if padded else refused
    out_loc = torch.where(to_dummy, limits.num_slots, out_loc)
    return out_loc, torch.where(refused, limits.max_rows, q.rows), refused


def slot_check(page_table: torch.Tensor, q: SlotQuery, limits: Limits) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots the new tokens write (int32 [tokens], read from the page table) and the verdict (bool []: True
    when the batch must be refused), launched on the device and not waited for."""
    table = page_table.index_select(0, q.rows)[:, : q.max_len]  # every slot the batch reads or writes is in here
    out_loc = table[q.token_req, q.positions]
    live = page_table.index_select(0, q.others)[:, : q.max_other_len] if q.max_other_len else None
    written_or_cached = len(out_loc) > 1 or q.max_other_len > 0 or q.max_len > 1
    flags = slot_verdict(table, q.cached, q.device_len, out_loc, live, q.other_lens if live is not None else None,
                         limits, written_or_cached)
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
    """The device half of the slot checks, launched and not waited for: bool [2 or 3], a slot the batch reads or
    writes is out of the pool, or (page_size > 1) breaks the page structure; a written slot is written twice or
    holds cached KV (of the batch, or of the live rows outside it: `live`, their page-table rows, and
    `live_lens`). table: the batch's page-table rows."""
    num_slots, ps = limits.num_slots, limits.page_size
    cols = torch.arange(table.shape[1], device=table.device)
    used = cols < device_len.unsqueeze(1)
    out_of_range = ((table < 0) | (table >= num_slots)) & used
    checks = [out_of_range.any()]
    if ps > 1:
        # Paged kernels (FlashInfer) read whole pages: position j must sit at offset j % ps of the page that
        # holds the first position of its block.
        first = table[:, (cols // ps) * ps]
        checks.append((((table % ps != cols % ps) | (table // ps != first // ps)) & used).any())
    if written_or_cached:
        # One count per slot: cached slots count 2, each new token adds 1, so a written slot that is cached or
        # written twice counts more than 1. (isin and sort cost a host sync and ~0.5 ms here.)
        hits = torch.zeros(num_slots + 1, dtype=torch.int32, device=table.device)
        cached_slots = torch.where((cols < cached.unsqueeze(1)) & ~out_of_range, table, num_slots)
        hits.index_fill_(0, cached_slots.flatten().long(), 2)
        if live is not None and live_lens is not None:
            live_cols = torch.arange(live.shape[1], device=live.device)
            held = (live_cols < live_lens.unsqueeze(1)) & (live >= 0) & (live < num_slots)
            hits.index_fill_(0, torch.where(held, live, num_slots).flatten().long(), 2)
        written = torch.where((out_loc >= 0) & (out_loc < num_slots), out_loc, num_slots).long()
        hits.index_add_(0, written, torch.ones_like(written, dtype=torch.int32))
        hits[num_slots:].zero_()  # the spare entry that out-of-range and unread positions point at (no sync)
        checks.append((hits[written] > 1).any())
    return torch.stack(checks)


def raise_slot_error(
    reqs: Sequence[Req],
    page_table: torch.Tensor,
    limits: Limits,
    live_rows: Mapping[int, tuple[int, int]],
) -> None:
    """The error for a step whose slot verdict failed: the page table must map every position a request reads
    to a real KV slot (page-structured when page_size > 1), and the slots it writes must be distinct and hold no
    cached token of the batch or of a live row outside it. Finds the first offending request on the host."""
    table = page_table
    in_batch = {r.table_idx for r in reqs}
    others = [row for row in live_rows if row not in in_batch]
    limit, ps = limits.num_slots, limits.page_size
    rows = [table[r.table_idx] for r in reqs]
    for row, req in zip(rows, reqs):
        slots = row[: req.device_len]
        bad = ((slots < 0) | (slots >= limit)).nonzero()
        if len(bad):
            pos = int(bad[0])
            raise InvalidRequestError(
                f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {int(slots[pos])} is not a KV slot: "
                f"slots lie in [0, num_pages * page_size = {limit})"
            )
        values = slots.tolist()
        for pos, slot in enumerate(values):
            page = values[pos - pos % ps] // ps
            if slot != page * ps + pos % ps:
                raise InvalidRequestError(
                    f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {slot} breaks the page structure: "
                    f"with page_size={ps}, position {pos} must be slot {page * ps + pos % ps} (offset {pos % ps} of "
                    f"page {page}, which holds position {pos - pos % ps})"
                )
    owner: dict[int, str] = {}
    for row, req in zip(rows, reqs):
        for slot in row[: req.cached_len].tolist():
            owner.setdefault(slot, f"cached KV of request {req.uid}")
    for other in others:
        kv_len, uid = live_rows[other]
        for slot in table[other, :kv_len].tolist():
            owner.setdefault(
                slot,
                f"cached KV of request {uid} in page-table row {other}, outside this batch (if that request is "
                f"done, release its row first: engine.release_rows([{other}]))",
            )
    written: set[int] = set()
    for row, req in zip(rows, reqs):
        for pos in range(req.cached_len, req.device_len):
            slot = int(row[pos])
            if slot in owner or slot in written:
                whose = owner.get(slot, "another new token")
                raise InvalidRequestError(
                    f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {slot} would overwrite {whose}; "
                    "give every new token a slot of its own"
                )
            written.add(slot)
    raise InvalidRequestError(
        "the step's page-table rows mapped a slot outside the KV pool, across pages, or over live KV, and were "
        "changed before its tokens were read; check the page table"
    )


def check_fresh(batch: Batch, args: BatchSamplingArgs) -> None:
    """forward_batch runs a batch once, with the sampling args prepare_batch built for it: a second run would
    mark KV as cached that was never computed."""
    if not isinstance(batch, Batch):
        raise InvalidRequestError(f"batch must be the Batch from prepare_batch, got {type(batch).__name__}")
    if not isinstance(args, BatchSamplingArgs):
        raise InvalidRequestError(f"args must be the BatchSamplingArgs from prepare_batch, got {type(args).__name__}")
    if args.uids != [r.uid for r in batch.reqs]:
        raise InvalidRequestError(
            f"args were built for requests {args.uids}, but the batch holds {[r.uid for r in batch.reqs]}: pass "
            "the (batch, args) pair that one prepare_batch call returned"
        )
    now = [(r.cached_len, r.device_len) for r in batch.reqs]
    if not batch.spans or now != batch.spans:
        raise InvalidRequestError(
            "the batch is stale: its requests' cached_len/device_len changed since prepare_batch built it (was "
            "it already run?) or it was not built by prepare_batch; call prepare_batch again"
        )


def prompt_list(prompt_ids: object, vocab: int) -> list[int]:
    """A prompt (a sequence of ints, a 1-D integer tensor or array) as a list of ints in the vocabulary."""
    values = token_list(prompt_ids, "prompt_ids")
    if not values:
        raise InvalidRequestError("the prompt is empty; give at least one token")
    lo, hi = min(values), max(values)
    if lo < 0 or hi >= vocab:
        raise InvalidRequestError(
            f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab}) (prompt ids span {lo}..{hi})"
        )
    return values


def check_memory(free_bytes: int, needs: dict[str, int], hint: str) -> None:
    """Refuse an allocation that cannot fit: torch would fail deep inside (or, on Linux, the OOM killer would
    end the process while the buffer is zeroed)."""
    total = sum(needs.values())
    if total > free_bytes:
        parts = ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in needs.items())
        raise CapacityError(
            f"the engine needs {total / 2**20:.1f} MiB ({parts}) but only {free_bytes / 2**20:.1f} MiB are free; "
            f"{hint}"
        )
