"""Checks inputs before anything is written, so a rejected call changes no state.

validate_batch (host checks), build_layout (token range on the host, slot checks launched on the device) and
check_slots (their verdict) run in prepare_batch, before the KV pool is written: no new token may land outside
the pool, on another new token, or on cached KV of the batch or of a live row (Engine.live_rows): a row's live
KV is overwritten only by the request that owns it, until the row is released.
check_fresh runs in forward_batch; prompt_tensor guards the driver's add(); check_memory runs before the engine
allocates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .core import Batch, Phase, Req, SamplingParams, is_int
from .device import upload
from .errors import CapacityError, InvalidRequestError
from .sample import BatchSamplingArgs

if TYPE_CHECKING:
    from .engine import Engine


@dataclass
class BatchLayout:
    """Where a batch's new tokens come from and where they go, built once by validate_batch for prepare_batch.

    Host tensors are built with a fixed number of ops whatever the batch size; the write slots are gathered and
    checked on the device, and check_slots reads the verdict back (one sync) after the rest of the batch is built.
    """

    ids: torch.Tensor  # int32 [tokens], device: the new tokens, request by request
    positions: torch.Tensor  # int64 [tokens], device: their positions, which are also their page-table columns
    out_loc: torch.Tensor  # int32 [tokens], device: the KV slots they write
    flags: torch.Tensor | None  # bool [2], device: a slot out of range; a slot written twice or over cached KV
    others: list[int]  # live page-table rows outside the batch, whose cached KV the batch may not overwrite


def validate_batch(engine: Engine, reqs: Sequence[Req], phase: Phase) -> None:
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
        _validate_req(engine, req, phase)
        live = engine.live_rows.get(req.table_idx)
        if live is not None and live[1] != req.uid and live[0] > req.cached_len:
            # Its new tokens would land on the live request's own slots: the page table cannot tell them apart.
            raise InvalidRequestError(
                f"request {req.uid}: page-table row {req.table_idx} holds the live KV of request {live[1]} "
                f"({live[0]} tokens); release the row first (engine.release_rows([{req.table_idx}])) or use another"
            )
        if req.table_idx in rows_seen:
            raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is used twice in the batch")
        rows_seen.add(req.table_idx)


def _validate_req(engine: Engine, req: Req, phase: Phase) -> None:
    ids = req.stored_ids
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dim() != 1
        or ids.dtype not in (torch.int32, torch.int64)
        or ids.device.type != "cpu"
    ):
        got = type(ids).__name__
        if isinstance(ids, torch.Tensor):
            got += f" {ids.dtype} of shape {tuple(ids.shape)} on {ids.device}"
        raise InvalidRequestError(f"request {req.uid}: input_ids must be a 1-D int32/int64 CPU tensor, got {got}")
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
    max_rows = engine.config.max_running_req
    if not (0 <= req.table_idx < max_rows):
        raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is out of range [0, {max_rows})")
    if not (0 <= req.cached_len < req.device_len):
        raise InvalidRequestError(
            f"request {req.uid}: cached_len={req.cached_len} must be in [0, device_len={req.device_len})"
        )
    if req.device_len > num_tokens:
        raise InvalidRequestError(
            f"request {req.uid}: device_len={req.device_len} exceeds the {num_tokens} known tokens (append the "
            "sampled token with append_host() before the next step)"
        )
    if req.device_len > engine.max_seq_len:
        raise InvalidRequestError(
            f"request {req.uid}: {req.device_len} tokens exceed max_seq_len={engine.max_seq_len}"
        )
    if phase == "decode" and req.device_len - req.cached_len != 1:
        raise InvalidRequestError(
            f"request {req.uid}: a decode step computes one token, but extend_len={req.extend_len}"
        )


def build_layout(engine: Engine, reqs: Sequence[Req]) -> BatchLayout:
    """Token ids (range-checked on the host), positions and write slots of the new tokens of validated requests;
    the slot checks are launched on the device, not waited for. Runs on the engine's stream."""
    vocab = engine.model_config.vocab_size
    parts = [r.new_token_ids() for r in reqs]
    appended = all(isinstance(p, list) for p in parts)  # decode: the tokens the driver appended, as ints
    if appended:
        flat = [t for p in parts for t in p]
        lo, hi = min(flat), max(flat)
    else:
        ids = torch.cat([torch.as_tensor(p, dtype=torch.int64) for p in parts])
        lo, hi = (int(v) for v in ids.aminmax())
    if lo < 0 or hi >= vocab:
        for req, part in zip(reqs, parts):
            values = part if isinstance(part, list) else part.tolist()
            bad = next((t for t in values if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequestError(f"request {req.uid}: token id {bad} is outside the vocabulary [0, {vocab})")
    if appended:  # only now: an id past int64 would fail the tensor's construction before the message
        ids = torch.tensor(flat)
    cached = [r.cached_len for r in reqs]
    device = [r.device_len for r in reqs]
    extend = [d - c for c, d in zip(cached, device)]
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
    others = [row for row in engine.live_rows if row not in in_batch]
    other_lens = [engine.live_rows[row][0] for row in others]
    host = torch.cat([torch.tensor(rows + cached + device + others + other_lens), token_req, positions, ids])
    packed = upload(host, engine.device.torch_device)  # one transfer for everything the checks and inputs need
    rows_d, cached_d, device_d = packed[:n], packed[n : 2 * n], packed[2 * n : 3 * n]
    o = 3 * n + 2 * len(others)
    others_d, other_lens_d = packed[3 * n : 3 * n + len(others)], packed[3 * n + len(others) : o]
    token_req_d, positions_d = packed[o : o + t], packed[o + t : o + 2 * t]
    ids_d = packed[o + 2 * t :].to(torch.int32)
    # The rows of the batch, as wide as the longest request: every slot it reads or writes is in there.
    table = engine.page_table.index_select(0, rows_d)[:, : max(device)]
    out_loc = table[token_req_d, positions_d]
    limit = engine.num_pages * engine.config.page_size  # the dummy page's slots start here
    cols = torch.arange(table.shape[1], device=table.device)
    out_of_range = ((table < 0) | (table >= limit)) & (cols < device_d.unsqueeze(1))
    checks = [out_of_range.any()]
    if len(ids) > 1 or max(cached) > 0 or others:
        # One count per slot: cached slots (of the batch and of live rows outside it) count 2, each new token
        # adds 1, so a written slot that is cached or written twice counts more than 1. (isin and sort cost a
        # host sync and ~0.5 ms here.)
        hits = torch.zeros(limit + 1, dtype=torch.int32, device=table.device)
        cached_slots = torch.where((cols < cached_d.unsqueeze(1)) & ~out_of_range, table, limit)
        hits.index_fill_(0, cached_slots.flatten().long(), 2)
        if others:
            live = engine.page_table.index_select(0, others_d)[:, : max(other_lens)]
            live_cols = torch.arange(live.shape[1], device=live.device)
            held = (live_cols < other_lens_d.unsqueeze(1)) & (live >= 0) & (live < limit)
            hits.index_fill_(0, torch.where(held, live, limit).flatten().long(), 2)
        written = torch.where((out_loc >= 0) & (out_loc < limit), out_loc, limit).long()
        hits.index_add_(0, written, torch.ones_like(written, dtype=torch.int32))
        hits[limit] = 0  # the spare entry that out-of-range and unread positions point at
        checks.append((hits[written] > 1).any())
    return BatchLayout(ids_d, positions_d, out_loc, torch.stack(checks), others)


def check_slots(engine: Engine, reqs: Sequence[Req], layout: BatchLayout) -> None:
    """The page table must map every position a request reads to a real KV slot, and the slots it writes
    must be distinct and hold no cached token of the batch; else the step would index out of range or
    overwrite live KV. Reads the device verdict of build_layout: one device-to-host transfer for the batch."""
    if layout.flags is None or not any(layout.flags.tolist()):
        return
    # The error path: find the first offending request for the message.
    table = engine.page_table
    limit = engine.num_pages * engine.config.page_size
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
    owner: dict[int, str] = {}
    for row, req in zip(rows, reqs):
        for slot in row[: req.cached_len].tolist():
            owner.setdefault(slot, f"cached KV of request {req.uid}")
    for other in layout.others:
        kv_len, uid = engine.live_rows[other]
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


def prompt_tensor(prompt_ids: object, vocab: int) -> torch.Tensor:
    """A prompt (a sequence of ints or a 1-D integer tensor) as a new int32 CPU tensor, range-checked before the
    cast so that no id wraps around. A NumPy array is taken as the tensor it converts to."""
    if not isinstance(prompt_ids, torch.Tensor) and hasattr(prompt_ids, "__array__") and hasattr(prompt_ids, "dtype"):
        try:
            prompt_ids = torch.as_tensor(prompt_ids)
        except (TypeError, RuntimeError):
            raise InvalidRequestError(
                f"prompt_ids must be a 1-D integer array, got an array of dtype {prompt_ids.dtype}"
            ) from None
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() != 1 or prompt_ids.is_floating_point() or prompt_ids.is_complex() or (
            prompt_ids.dtype == torch.bool
        ):
            raise InvalidRequestError(
                f"prompt_ids must be a 1-D integer tensor, got {prompt_ids.dtype} of shape {tuple(prompt_ids.shape)}"
            )
        ids = prompt_ids.detach().to("cpu", torch.int64)
        values = ids.tolist()
    else:
        if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
            raise InvalidRequestError(
                f"prompt_ids must be a list of ints or a 1-D integer tensor, got {type(prompt_ids).__name__}"
            )
        values = list(prompt_ids)
        bad = next((i for i, t in enumerate(values) if not is_int(t)), None)  # an index: the value may be None
        if bad is not None:
            raise InvalidRequestError(
                f"prompt_ids must hold ints, got {values[bad]!r} of type {type(values[bad]).__name__} at index {bad}"
            )
    if not values:
        raise InvalidRequestError("the prompt is empty; give at least one token")
    lo, hi = min(values), max(values)
    if lo < 0 or hi >= vocab:
        raise InvalidRequestError(
            f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab}) (prompt ids span {lo}..{hi})"
        )
    return torch.tensor(values, dtype=torch.int32)


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
