"""Checks inputs before anything is written, so a rejected call changes no state.

validate_batch runs in prepare_batch, before the page table is read or the KV pool written; check_fresh runs
in forward_batch; prompt_tensor guards the driver's add(); check_memory runs before the engine allocates.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from .core import Batch, Phase, Req, SamplingParams
from .errors import CapacityError, InvalidRequestError

if TYPE_CHECKING:
    from .engine import Engine


def is_int(x: object) -> bool:
    """A real integer: Python or NumPy ints, but not bool (True is not a token id or an index)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def validate_batch(engine: Engine, reqs: Sequence[Req], phase: Phase) -> None:
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
        if req.table_idx in rows_seen:
            raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is used twice in the batch")
        rows_seen.add(req.table_idx)
    _validate_slots(engine, reqs)


def _validate_req(engine: Engine, req: Req, phase: Phase) -> None:
    ids = req.input_ids
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
    if len(ids) == 0:
        raise InvalidRequestError(f"request {req.uid}: the prompt is empty; give at least one token")
    if not isinstance(req.sampling_params, SamplingParams):
        raise InvalidRequestError(
            f"request {req.uid}: sampling_params must be a SamplingParams, got {type(req.sampling_params).__name__}"
        )
    for name in ("table_idx", "cached_len", "device_len"):
        if not is_int(getattr(req, name)):
            raise InvalidRequestError(f"request {req.uid}: {name}={getattr(req, name)!r} is not an int")
    max_rows = engine.config.max_running_req
    if not (0 <= req.table_idx < max_rows):
        raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is out of range [0, {max_rows})")
    if not (0 <= req.cached_len < req.device_len):
        raise InvalidRequestError(
            f"request {req.uid}: cached_len={req.cached_len} must be in [0, device_len={req.device_len})"
        )
    if req.device_len > len(ids):
        raise InvalidRequestError(
            f"request {req.uid}: device_len={req.device_len} exceeds the {len(ids)} known tokens (append the "
            "sampled token with append_host() before the next step)"
        )
    if req.device_len > engine.max_seq_len:
        raise InvalidRequestError(
            f"request {req.uid}: {req.device_len} tokens exceed max_seq_len={engine.max_seq_len}"
        )
    new = ids[req.cached_len : req.device_len]
    lo, hi = int(new.min()), int(new.max())
    vocab = engine.model_config.vocab_size
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise InvalidRequestError(f"request {req.uid}: token id {bad} is outside the vocabulary [0, {vocab})")
    if phase == "decode" and req.extend_len != 1:
        raise InvalidRequestError(
            f"request {req.uid}: a decode step computes one token, but extend_len={req.extend_len}"
        )


def _validate_slots(engine: Engine, reqs: Sequence[Req]) -> None:
    """The page table must map every position a request reads to a real KV slot, and the slots it writes
    must be distinct and hold no cached token of the batch; else the step would index out of range or
    overwrite live KV. One device-to-host transfer for the whole batch."""
    table = engine.page_table
    limit = engine.num_pages * engine.config.page_size  # the dummy page's slots start here
    rows = [table[r.table_idx] for r in reqs]
    new = torch.cat([row[r.cached_len : r.device_len] for row, r in zip(rows, reqs)])
    cached = torch.cat([row[: r.cached_len] for row, r in zip(rows, reqs)])
    read = torch.cat([new, cached])
    sorted_new = new.sort().values
    flags = torch.stack(
        [
            (read < 0).any() | (read >= limit).any(),
            (sorted_new[1:] == sorted_new[:-1]).any(),
            torch.isin(new, cached).any(),
        ]
    ).tolist()
    if not any(flags):
        return
    # The error path: find the first offending request for the message.
    for row, req in zip(rows, reqs):
        slots = row[: req.device_len]
        bad = ((slots < 0) | (slots >= limit)).nonzero()
        if len(bad):
            pos = int(bad[0])
            raise InvalidRequestError(
                f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {int(slots[pos])} is not a KV slot: "
                f"slots lie in [0, num_pages * page_size = {limit})"
            )
    owner: dict[int, int] = {}
    for row, req in zip(rows, reqs):
        for slot in row[: req.cached_len].tolist():
            owner.setdefault(slot, req.uid)
    written: set[int] = set()
    for row, req in zip(rows, reqs):
        for pos in range(req.cached_len, req.device_len):
            slot = int(row[pos])
            if slot in owner or slot in written:
                whose = f"cached KV of request {owner[slot]}" if slot in owner else "another new token"
                raise InvalidRequestError(
                    f"request {req.uid}: page_table[{req.table_idx}, {pos}] = {slot} would overwrite {whose}; "
                    "give every new token a slot of its own"
                )
            written.add(slot)


def check_fresh(batch: Batch) -> None:
    """forward_batch runs a batch once, as prepare_batch built it: a second run would mark KV as cached that
    was never computed."""
    now = [(r.cached_len, r.device_len) for r in batch.reqs]
    if not batch.spans or now != batch.spans:
        raise InvalidRequestError(
            "the batch is stale: its requests' cached_len/device_len changed since prepare_batch built it (was "
            "it already run?) or it was not built by prepare_batch; call prepare_batch again"
        )


def prompt_tensor(prompt_ids: object, vocab: int) -> torch.Tensor:
    """A prompt (a sequence of ints or a 1-D integer tensor) as a new int32 CPU tensor, range-checked before the
    cast so that no id wraps around."""
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
        bad = next((t for t in values if not is_int(t)), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt_ids must hold ints, got {bad!r} of type {type(bad).__name__}")
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
