"""Attention backends and the registry that picks one by name."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..choice import resolve_choice
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata
from .flashinfer_backend import FlashInferAttnBackend, unsupported_reason
from .torch_backend import TorchAttnBackend

BackendFactory = Callable[[KVCachePool, torch.Tensor, int, torch.device], BaseAttnBackend]

_BACKENDS: dict[str, BackendFactory] = {
    "torch": lambda kv, table, heads, device: TorchAttnBackend(kv, table, heads),
    "flashinfer": FlashInferAttnBackend,
}


def register_backend(name: str, factory: BackendFactory) -> None:
    _BACKENDS[name] = factory


def known_backends() -> list[str]:
    return sorted(["auto", *_BACKENDS])


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """'auto' is flashinfer where it can serve (CUDA, bf16/fp16, its head dims, package installed), else torch."""
    reason = unsupported_reason(device, dtype, head_dim)
    return resolve_choice("attention_backend", name, _BACKENDS, "flashinfer", reason)


def create_backend(
    name: str, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
) -> BaseAttnBackend:
    return _BACKENDS[name](kv_cache, page_table, num_qo_heads, device)


__all__ = [
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "FlashInferAttnBackend",
    "TorchAttnBackend",
    "create_backend",
    "known_backends",
    "register_backend",
    "resolve_backend_name",
]
