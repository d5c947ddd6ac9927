"""Attention mutants: the torch backend's causal mask, decode KV length, key padding and last-token gather, and
the GPU backends' metadata (FlashInfer's paged-KV index, Triton's lengths under graph replay) and the Triton decode's
own RoPE of the new tokens."""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from engine.attention import flashinfer_backend, torch_backend
from engine.attention.torch_backend import TorchAttnBackend
from engine.attention.triton_backend import TritonDecodeBackend, TritonDecodeMetadata
from engine.core import Batch, Req

from .base import swap

_ORIGINAL_PREPARE_METADATA = TorchAttnBackend.prepare_metadata
_ORIGINAL_DECODE = TorchAttnBackend._decode
_ORIGINAL_PAGED_KV_INDEX = flashinfer_backend.build_paged_kv_index
_ORIGINAL_TRITON_GRAPH_METADATA = TritonDecodeBackend.graph_metadata
_ORIGINAL_TRITON_NEW_TOKENS = TritonDecodeBackend.forward_new_tokens


def _sdpa_extend_sees_next_token(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, **kw: Any
) -> torch.Tensor:
    """On an extend (kv longer than q) the bottom-right causal diagonal is shifted by one: each new token also
    sees the token after it. Fresh prefills (kv == q) and decodes (no causal mask: q_len 1) are untouched."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    cached = kv_len - q_len
    if attn_mask is not None and attn_mask.dim() == 2 and q_len > 1 and cached > 0:
        rows = torch.arange(q_len, device=q.device)[:, None] + cached + 1  # the bug: + 1
        attn_mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)


def causal_mask_off_by_one_extend() -> contextlib.AbstractContextManager[None]:
    # torch_backend reaches SDPA through its module-level name `F`; only that name is rebound, not torch itself.
    shim = types.SimpleNamespace(scaled_dot_product_attention=_sdpa_extend_sees_next_token)
    return swap(torch_backend, "F", shim)


def _prepare_metadata_short_kv(self: TorchAttnBackend, batch: Batch) -> None:
    """Decode attends over the KV length from *before* this step: the token's own K/V slot is left out."""
    _ORIGINAL_PREPARE_METADATA(self, batch)
    meta = batch.attn_metadata
    if batch.is_decode and isinstance(meta, torch_backend.TorchAttnMetadata):
        meta.kv_slots = [slots[:-1] for slots in meta.kv_slots]


def decode_kv_len_off_by_one() -> contextlib.AbstractContextManager[None]:
    return swap(TorchAttnBackend, "prepare_metadata", _prepare_metadata_short_kv)


def _decode_keys_unmasked(
    q: torch.Tensor, meta: torch_backend.TorchAttnMetadata, k_slots: torch.Tensor, v_slots: torch.Tensor, gqa: bool
) -> torch.Tensor:
    """Batched decode pads every request's keys to the longest one (with slot 0) but builds no key mask, so the
    shorter requests also attend to the padding."""
    if meta.decode_slots is None:
        meta.decode_slots = torch.nn.utils.rnn.pad_sequence(meta.kv_slots, batch_first=True)
    return _ORIGINAL_DECODE(q, meta, k_slots, v_slots, gqa)


def decode_keys_unmasked() -> contextlib.AbstractContextManager[None]:
    return swap(TorchAttnBackend, "_decode", staticmethod(_decode_keys_unmasked))


def _prepare_metadata_gather_past_end(self: TorchAttnBackend, batch: Batch) -> None:
    """The last-token index of each request is its query end (cu_seqlens[1:]) instead of end - 1, clamped to the
    batch: every request but the last reads the next request's first token; a lone request is unaffected."""
    _ORIGINAL_PREPARE_METADATA(self, batch)
    meta = batch.attn_metadata
    if isinstance(meta, torch_backend.TorchAttnMetadata):
        meta.last_indices = (meta.last_indices + 1).clamp(max=meta.q_ranges[-1][1] - 1)


def last_token_gather_off_by_one() -> contextlib.AbstractContextManager[None]:
    return swap(TorchAttnBackend, "prepare_metadata", _prepare_metadata_gather_past_end)


# ---- GPU backends: FlashInfer's paged-KV index, Triton's graph metadata ----------------------------------------------


def _paged_kv_index_modulo_last_page(reqs: Sequence[Req], page_size: int) -> flashinfer_backend.PagedKVIndex:
    """kv_last_page_len = kv_len % page_size: a request whose KV fills its last page exactly (always, at page_size 1)
    attends to one page fewer than it holds."""
    index = _ORIGINAL_PAGED_KV_INDEX(reqs, page_size)
    kv_lens = torch.tensor([r.device_len for r in reqs], dtype=torch.int32)
    return dataclasses.replace(index, kv_last_page_len=kv_lens % page_size)


def flashinfer_last_page_len_modulo() -> contextlib.AbstractContextManager[None]:
    # The backend looks the function up by its module-level name, so rebinding that name is enough.
    return swap(flashinfer_backend, "build_paged_kv_index", _paged_kv_index_modulo_last_page)


def _triton_lengths_of_capture(self: TritonDecodeBackend, batch: Batch) -> None:
    """The Triton decode lengths are fixed when the graph is captured (its dummy requests' one token) instead of
    computed from each replay's positions."""
    _ORIGINAL_TRITON_GRAPH_METADATA(self, batch)
    meta = batch.attn_metadata
    if isinstance(meta, TritonDecodeMetadata):
        meta.positions = torch.zeros_like(batch.positions)


def triton_decode_lengths_frozen() -> contextlib.AbstractContextManager[None]:
    return swap(TritonDecodeBackend, "graph_metadata", _triton_lengths_of_capture)


def _triton_new_tokens_one_ahead(
    self: TritonDecodeBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Any, *rest: Any
) -> torch.Tensor | None:
    """The decode that rotates its new tokens reads the RoPE tables one row late: q and the stored k are rotated to
    the position after theirs."""
    tables = types.SimpleNamespace(tables_in=lambda dtype: tuple(t[1:] for t in rope.table.tables_in(dtype)))
    shifted: Any = types.SimpleNamespace(table=tables, positions=rope.positions)
    return _ORIGINAL_TRITON_NEW_TOKENS(self, q, k, v, shifted, *rest)


def triton_new_tokens_rotated_one_ahead() -> contextlib.AbstractContextManager[None]:
    return swap(TritonDecodeBackend, "forward_new_tokens", _triton_new_tokens_one_ahead)
