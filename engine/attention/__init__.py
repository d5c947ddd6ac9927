"""Attention backends and ATTENTION_BACKENDS, the registry that picks one by name (EngineConfig.attention_backend).

A factory takes (kv_cache, page_table, num_qo_heads, device) and returns a BaseAttnBackend.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kvcache.pool import KVCachePool
from ..registry import Registry, Where
from .base import BaseAttnBackend, BaseAttnMetadata
from .flashinfer_backend import FlashInferAttnBackend, unsupported_reason
from .torch_backend import TorchAttnBackend
from .triton_backend import TritonAttnBackend
from .triton_backend import unsupported_reason as triton_unsupported_reason

BackendFactory = Callable[[KVCachePool, torch.Tensor, int, torch.device], BaseAttnBackend]

ATTENTION_BACKENDS: Registry[BackendFactory] = Registry("attention_backend", preferred=("flashinfer",))
ATTENTION_BACKENDS.register("torch", lambda kv, table, heads, device: TorchAttnBackend(kv, table, heads))
ATTENTION_BACKENDS.register(
    "flashinfer", FlashInferAttnBackend, lambda w: unsupported_reason(w.device, w.dtype, w.head_dim)
)
ATTENTION_BACKENDS.register(
    "triton", TritonAttnBackend, lambda w: triton_unsupported_reason(w.device, w.dtype, w.head_dim)
)


def create_backend(
    name: str, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
) -> BaseAttnBackend:
    return ATTENTION_BACKENDS.factory(name)(kv_cache, page_table, num_qo_heads, device)


__all__ = [
    "ATTENTION_BACKENDS",
    "BackendFactory",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "FlashInferAttnBackend",
    "TorchAttnBackend",
    "TritonAttnBackend",
    "Where",
    "create_backend",
]
