"""Host checks of the engine's inputs, run before anything is written so a rejected call changes no state; each takes
the limits and state it reads, never the Engine. The slot rule is engine/step/slots.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .checks import is_int, token_list
from .core import Batch, Phase, Req, SamplingParams
from .errors import CapacityError, InvalidRequestError
from .sample import BatchSamplingArgs


@dataclass(frozen=True)
class Limits:
    max_rows: int  # max_running_req; the dummy row is max_rows
    max_seq_len: int
    vocab: int
    num_slots: int  # num_pages * page_size; the dummy page starts here
    page_size: int


def validate_batch(
    reqs: Sequence[Req], phase: Phase, limits: Limits, live_rows: Mapping[int, tuple[int, int]]
) -> None:
    if phase not in ("prefill", "decode"):
        raise InvalidRequestError(f"phase={phase!r} is invalid: use 'prefill' or 'decode'")
    check_reqs(reqs)
    rows_seen: set[int] = set()
    for req in reqs:
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
            raise InvalidRequestError(
                f"request {req.uid}: page-table row {req.table_idx} holds the live KV of request {live[1]} "
                f"({live[0]} tokens); release the row first (engine.release_rows([{req.table_idx}])) or use another"
            )
        if req.table_idx in rows_seen:
            raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is used twice in the batch")
        rows_seen.add(req.table_idx)


def check_reqs(reqs: object) -> None:
    if not isinstance(reqs, (list, tuple)):
        raise InvalidRequestError(f"reqs must be a list or tuple of Req, got {type(reqs).__name__}")
    if not reqs:
        raise InvalidRequestError("a batch needs at least one request")
    for i, req in enumerate(reqs):
        if not isinstance(req, Req):
            raise InvalidRequestError(f"batch entry {i} is a {type(req).__name__}, not a Req")


def check_ends(reqs: Sequence[Req], ends: object) -> list[int]:
    check_reqs(reqs)
    if not isinstance(ends, (list, tuple)) or len(ends) != len(reqs):
        raise InvalidRequestError(f"ends must be a list of {len(reqs)} ints, one per request, got {ends!r}")
    bad = next((e for e in ends if not is_int(e)), None)
    if bad is not None:
        raise InvalidRequestError(f"ends must hold ints, got {bad!r} of type {type(bad).__name__}")
    return [int(e) for e in ends]


def _validate_req(req: Req, phase: Phase, limits: Limits) -> None:
    token_ids = req.token_ids
    if type(token_ids) is not list:
        raise InvalidRequestError(
            f"request {req.uid}: token_ids must be the list of ints Req builds, got {type(token_ids).__name__}"
        )
    if not token_ids:
        raise InvalidRequestError(f"request {req.uid}: the prompt is empty; give at least one token")
    if not isinstance(req.sampling_params, SamplingParams):
        raise InvalidRequestError(
            f"request {req.uid}: sampling_params must be a SamplingParams, got {type(req.sampling_params).__name__}"
        )
    table_idx, cached_len, device_len = req.table_idx, req.cached_len, req.device_len
    if type(table_idx) is not int or type(cached_len) is not int or type(device_len) is not int:
        table_idx, cached_len, device_len = _python_ints(req)
    max_rows = limits.max_rows
    if not (0 <= table_idx < max_rows):
        raise InvalidRequestError(f"request {req.uid}: table_idx={table_idx} is out of range [0, {max_rows})")
    if not (0 <= cached_len < device_len):
        raise InvalidRequestError(f"request {req.uid}: cached_len={cached_len} must be in [0, device_len={device_len})")
    if device_len > limits.max_seq_len:
        raise InvalidRequestError(f"request {req.uid}: {device_len} tokens exceed max_seq_len={limits.max_seq_len}")
    if phase == "decode" and device_len - cached_len != 1:
        raise InvalidRequestError(
            f"request {req.uid}: a decode step computes one token, but extend_len={req.extend_len}"
        )


def _python_ints(req: Req) -> tuple[int, int, int]:
    for name in ("table_idx", "cached_len", "device_len"):
        value = getattr(req, name)
        if type(value) is not int:
            if not is_int(value):
                raise InvalidRequestError(f"request {req.uid}: {name}={value!r} is not an int")
            setattr(req, name, int(value))  # a NumPy int would leak NumPy bools into the kernels
    return req.table_idx, req.cached_len, req.device_len


def check_token_ids(reqs: Sequence[Req], parts: Sequence[list[int]], lo: int, hi: int, vocab: int) -> None:
    if lo >= 0 and hi < vocab:
        return
    for req, part in zip(reqs, parts):
        bad = next((t for t in part if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"request {req.uid}: token id {bad} is outside the vocabulary [0, {vocab})")


def check_fresh(batch: Batch, args: BatchSamplingArgs) -> None:
    """A batch runs once, with its own args: a second run would mark KV cached that was never computed."""
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
    """Refuse an allocation that cannot fit (else torch fails deep inside, or the OOM killer ends the process)."""
    total = sum(needs.values())
    if total > free_bytes:
        parts = ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in needs.items())
        raise CapacityError(
            f"the engine needs {total / 2**20:.1f} MiB ({parts}) but only {free_bytes / 2**20:.1f} MiB are free; "
            f"{hint}"
        )
