"""Checks a batch before anything is written, so a rejected call changes no state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from .core import Phase, Req
from .errors import InvalidRequestError

if TYPE_CHECKING:
    from .engine import Engine


def validate_batch(engine: Engine, reqs: Sequence[Req], phase: Phase) -> None:
    if phase not in ("prefill", "decode"):
        raise InvalidRequestError(f"phase={phase!r} is invalid: use 'prefill' or 'decode'")
    if not reqs:
        raise InvalidRequestError("a batch needs at least one request")
    vocab = engine.model_config.vocab_size
    rows_seen: set[int] = set()
    for req in reqs:
        ids = req.input_ids
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
            raise InvalidRequestError(
                f"request {req.uid}: input_ids must be a 1-D int32/int64 tensor, got "
                f"{type(ids).__name__}{'' if not isinstance(ids, torch.Tensor) else f' {ids.dtype} {tuple(ids.shape)}'}"
            )
        if len(ids) == 0:
            raise InvalidRequestError(f"request {req.uid}: the prompt is empty; give at least one token")
        if not (0 <= req.table_idx < engine.config.max_running_req):
            raise InvalidRequestError(
                f"request {req.uid}: table_idx={req.table_idx} is out of range [0, {engine.config.max_running_req})"
            )
        if req.table_idx in rows_seen:
            raise InvalidRequestError(f"request {req.uid}: table_idx={req.table_idx} is used twice in the batch")
        rows_seen.add(req.table_idx)
        if not (0 <= req.cached_len < req.device_len):
            raise InvalidRequestError(
                f"request {req.uid}: cached_len={req.cached_len} must be in [0, device_len={req.device_len})"
            )
        if req.device_len > len(ids):
            raise InvalidRequestError(
                f"request {req.uid}: device_len={req.device_len} exceeds the {len(ids)} known tokens"
            )
        if req.device_len > engine.max_seq_len:
            raise InvalidRequestError(
                f"request {req.uid}: {req.device_len} tokens exceed max_seq_len={engine.max_seq_len}"
            )
        new = ids[req.cached_len : req.device_len]
        lo, hi = int(new.min()), int(new.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise InvalidRequestError(f"request {req.uid}: token id {bad} is outside the vocabulary [0, {vocab})")
        if phase == "decode" and req.extend_len != 1:
            raise InvalidRequestError(
                f"request {req.uid}: a decode step computes one token, but extend_len={req.extend_len}"
            )
