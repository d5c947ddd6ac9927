"""Batch-invariance mutants (issue #27): each breaks one reduction of the invariant mode (EngineConfig.batch_invariant)
so that a request's logits depend on its batch again, within rounding: only an exact property can see them."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from engine.attention.torch_backend import TorchAttnBackend, TorchAttnMetadata
from engine.layers.kernels import BLOCK_ROWS, InvariantKernels, TorchKernels, TritonInvariantKernels, blocked_linear

from .base import swap

_ORIGINAL_PER_TOKEN = TorchAttnBackend._per_token
_ORIGINAL_TRITON_LINEAR = TritonInvariantKernels.linear
_ORIGINAL_RMS_NORM = TorchKernels.rms_norm


def _linear_last_block_unpadded(
    self: InvariantKernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """Inputs shorter than one block run unpadded, so their row count picks the product (a lone decode row a GEMV):
    a request's rows round differently alone and in a batch."""
    x = self.silu_and_mul(x) if gated else x
    return F.linear(x, weight, bias) if x.shape[0] < BLOCK_ROWS else blocked_linear(x, weight, bias)


def linear_rows_by_count() -> contextlib.AbstractContextManager[None]:
    return swap(InvariantKernels, "linear", _linear_last_block_unpadded)


def _per_token_decode_padded(
    q: torch.Tensor, meta: TorchAttnMetadata, k_slots: torch.Tensor, v_slots: torch.Tensor, gqa: bool
) -> torch.Tensor:
    """Decode batches keep the one padded, masked SDPA call: its key padding follows the longest request."""
    if all(qe - qs == 1 for qs, qe in meta.q_ranges) and meta.cached_lens and all(
        cached == len(slots) - 1 for slots, cached in zip(meta.kv_slots, meta.cached_lens)
    ):
        return TorchAttnBackend._decode(q, meta, k_slots, v_slots, gqa)
    return _ORIGINAL_PER_TOKEN(q, meta, k_slots, v_slots, gqa)


def attention_decode_padded() -> contextlib.AbstractContextManager[None]:
    return swap(TorchAttnBackend, "_per_token", staticmethod(_per_token_decode_padded))


def _linear_lone_row_split_k(
    self: TritonInvariantKernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """A lone row (a batch of one) splits K in two halves summed after rounding, to keep more SMs busy: a request's
    rows round differently alone and in a batch."""
    if x.numel() != x.shape[-1]:
        return _ORIGINAL_TRITON_LINEAR(self, x, weight, bias, gated)
    from engine.layers.triton_matmul import matmul  # imports triton: CUDA only

    x = self.silu_and_mul(x) if gated else x
    half = x.shape[-1] // 2
    return matmul(x[..., :half], weight[:, :half], bias) + matmul(x[..., half:], weight[:, half:])


def matmul_split_k_by_rows() -> contextlib.AbstractContextManager[None]:
    return swap(TritonInvariantKernels, "linear", _linear_lone_row_split_k)


def _rms_norm_blocks_by_rows(self: TorchKernels, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """In batch-invariant mode the sum of squares runs in as many column blocks as the input has rows (up to 4), a
    split that follows the batch: a row's norm rounds differently alone and batched."""
    rows = x.numel() // x.shape[-1]
    if not isinstance(self, InvariantKernels) or rows < 2:
        return _ORIGINAL_RMS_NORM(self, x, weight, eps)
    h = x.to(torch.float32)
    width = -(-x.shape[-1] // min(rows, 4))
    squares = torch.stack([part.pow(2).sum(-1) for part in h.split(width, dim=-1)]).sum(0, keepdim=True).T
    h = h * torch.rsqrt(squares.view(*x.shape[:-1], 1) / x.shape[-1] + eps)
    return weight * h.to(x.dtype)


def norm_reduction_by_block_count() -> contextlib.AbstractContextManager[None]:
    return swap(TorchKernels, "rms_norm", _rms_norm_blocks_by_rows)
