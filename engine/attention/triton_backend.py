"""Triton decode attention on CUDA for small decode batches: it reads the page table and the sequence lengths on the
device (engine/attention/triton_decode.py), so the host builds no page metadata and a captured graph replays with
no plan in between. Everything else (prefill, extend, decode batches over DECODE_MAX_BS padded rows, where
FlashInfer's graphs step faster, plan and all) runs on the paged backend: FlashInfer where it serves the
configuration, else the torch backend (which then leaves every decode batch to Triton, since it has no graphs).

A decode request's length is its position + 1 (one new token, already stored), computed on the device from the
batch's positions (inside the graph: graph_metadata); its KV is read through ctx.batch.table_rows, which a captured
step computes itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from ..core import Batch, Context
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata, require_supported
from .flashinfer_backend import FlashInferAttnBackend
from .flashinfer_backend import unsupported_reason as flashinfer_unsupported_reason
from .torch_backend import TorchAttnBackend

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DECODE_MAX_BS = 1  # already at bs 4 FlashInfer's graphs step faster, plan and all (RESULTS.md, H200)


def unsupported_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the Triton decode kernel cannot serve this configuration, or None if it can."""
    if device.type != "cuda":
        return f"it needs a CUDA device, got {device}"
    if dtype not in SUPPORTED_DTYPES:
        return f"it serves bfloat16, float16 and float32, got {dtype}"
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        return f"its decode kernel needs a power-of-two head_dim in [16, 256], got {head_dim}"
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed (it comes with CUDA builds of torch)"
    return None


@dataclass
class TritonDecodeMetadata(BaseAttnMetadata):
    last_indices: torch.Tensor  # arange(padded_size): one token per request
    num_splits: int  # split-KV chunks per request: per graph size, or per eager batch from its longest request
    seq_lens: torch.Tensor | None = None  # positions + 1, on the device (a graph's: computed inside it)

    def get_last_indices(self) -> torch.Tensor:
        return self.last_indices


class TritonAttnBackend(BaseAttnBackend):
    name = "triton"
    supports_cuda_graph = True

    def __init__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> None:
        require_supported(self.name, unsupported_reason(device, kv_cache.buffer.dtype, kv_cache.head_dim))
        from . import triton_decode

        self._kernels = triton_decode
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.scale = kv_cache.head_dim**-0.5
        self.paged: BaseAttnBackend
        if flashinfer_unsupported_reason(device, kv_cache.buffer.dtype, kv_cache.head_dim) is None:
            self.paged = FlashInferAttnBackend(kv_cache, page_table, num_qo_heads, device)
            self.decode_max_bs = DECODE_MAX_BS
        else:
            self.paged = TorchAttnBackend(kv_cache, page_table, num_qo_heads)
            self.decode_max_bs = page_table.shape[0]
        self._arange = torch.arange(page_table.shape[0], dtype=torch.int64, device=device)
        self._num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._max_seq_len = page_table.shape[1]

    def _splits(self, bs: int, max_len: int) -> int:
        return int(self._kernels.choose_splits(bs, self.kv_cache.num_kv_heads, max_len, self._num_sms))

    def _serves(self, batch: Batch) -> bool:
        """Whether the Triton kernel runs this batch (else the paged backend does)."""
        return batch.is_decode and batch.padded_size <= self.decode_max_bs

    def delegate(self, batch: Batch) -> str | None:
        return None if self._serves(batch) else self.paged.name

    def prepare_metadata(self, batch: Batch) -> None:
        if not self._serves(batch):
            self.paged.prepare_metadata(batch)
            return
        longest = max(r.device_len for r in batch.padded_reqs)
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, longest), batch.positions + 1)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, ctx: Context
    ) -> torch.Tensor:
        batch = ctx.batch
        if not self._serves(batch):
            return self.paged.forward(q, k, v, layer_id, ctx)
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id, ctx.kernels)
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata) and meta.seq_lens is not None
        return self._kernels.paged_decode(
            q, self.kv_cache.k_slots(layer_id), self.kv_cache.v_slots(layer_id), self.page_table, batch.table_rows,
            meta.seq_lens, self.scale, meta.num_splits,
        )

    # ---- CUDA graphs: nothing to plan for Triton's sizes; the lengths and rows are read on the device ---------
    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        self._max_seq_len = max_seq_len
        larger = [bs for bs in bs_list if bs > self.decode_max_bs]
        if larger:
            self.paged.init_capture_graph(max_seq_len, larger)

    def prepare_for_capture(self, batch: Batch) -> None:
        if not self._serves(batch):
            self.paged.prepare_for_capture(batch)
            return
        bs = batch.padded_size
        batch.attn_metadata = TritonDecodeMetadata(self._arange[:bs], self._splits(bs, self._max_seq_len))

    def graph_metadata(self, batch: Batch) -> None:
        if not self._serves(batch):
            self.paged.graph_metadata(batch)
            return
        meta = batch.attn_metadata
        assert isinstance(meta, TritonDecodeMetadata)
        meta.seq_lens = batch.positions + 1

    def prepare_for_replay(self, batch: Batch) -> None:
        """Nothing for Triton's sizes: the graph computes the rows and lengths from the step's packed inputs."""
        if not self._serves(batch):
            self.paged.prepare_for_replay(batch)
