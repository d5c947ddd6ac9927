"""Attention backends and the registry that picks one by name."""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import ConfigError
from ..kvcache.pool import KVCachePool
from .base import BaseAttnBackend, BaseAttnMetadata
from .torch_backend import TorchAttnBackend

BackendFactory = Callable[[KVCachePool, torch.Tensor, int, torch.device], BaseAttnBackend]

_BACKENDS: dict[str, BackendFactory] = {
    "torch": lambda kv, table, heads, device: TorchAttnBackend(kv, table, heads),
}


def register_backend(name: str, factory: BackendFactory) -> None:
    _BACKENDS[name] = factory


def known_backends() -> list[str]:
    return sorted(["auto", *_BACKENDS])


def resolve_backend_name(name: str, device: torch.device, dtype: torch.dtype) -> str:
    if name == "auto":
        return "torch"
    if name not in _BACKENDS:
        raise ConfigError(f"attention_backend={name!r} is unknown; known: {', '.join(known_backends())}")
    return name


def create_backend(
    name: str, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
) -> BaseAttnBackend:
    return _BACKENDS[name](kv_cache, page_table, num_qo_heads, device)


__all__ = [
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "TorchAttnBackend",
    "create_backend",
    "known_backends",
    "register_backend",
    "resolve_backend_name",
]
