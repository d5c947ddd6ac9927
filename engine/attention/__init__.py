"""Attention backends and ATTENTION_BACKENDS (EngineConfig.attention_backend): a factory takes (kv_cache, page_table,
num_qo_heads, device) and returns a BaseAttnBackend; a hybrid entry states which backend serves which batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..kvcache.pool import KVCachePool
from ..registry import HeadDim, Registry, Requires, Where
from .base import BaseAttnBackend, BaseAttnMetadata
from .flashinfer_backend import FlashInferAttnBackend
from .hybrid import HybridAttnBackend, Route
from .torch_backend import TorchAttnBackend
from .triton_backend import TritonDecodeBackend
from .triton_invariant import TritonInvariantBackend

BackendFactory = Callable[[KVCachePool, torch.Tensor, int, torch.device], BaseAttnBackend]

DECODE_MAX_BS = 8  # the dot kernel steps faster than FlashInfer up to 8 rows, slower at 16 (RESULTS.md, eleventh part)

# The triton hybrid first: its decode up to DECODE_MAX_BS rows steps faster than FlashInfer's (RESULTS.md, eighth and
# eleventh parts).
ATTENTION_BACKENDS: Registry[BackendFactory] = Registry("attention_backend", preferred=("triton", "flashinfer"))


def create_backend(
    name: str, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
) -> BaseAttnBackend:
    return ATTENTION_BACKENDS.factory(name)(kv_cache, page_table, num_qo_heads, device)


@dataclass(frozen=True)
class Hybrid:
    """HybridAttnBackend `name`'s factory: `decode`, and the rest on the first route usable here."""

    name: str
    decode: BackendFactory
    routes: tuple[Route, ...]

    def __call__(
        self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int, device: torch.device
    ) -> HybridAttnBackend:
        where = Where(device, kv_cache.buffer.dtype, kv_cache.head_dim)
        reasons = {r.rest: ATTENTION_BACKENDS.unusable(r.rest, where) for r in self.routes}
        route = next((r for r in self.routes if reasons[r.rest] is None), None)
        if route is None:
            why = "; ".join(f"{rest}: {reason}" for rest, reason in reasons.items())
            raise ConfigError(f"attention_backend={self.name!r} cannot be used: no backend for its rest ({why})")
        decode = self.decode(kv_cache, page_table, num_qo_heads, device)
        rest = create_backend(route.rest, kv_cache, page_table, num_qo_heads, device)
        return HybridAttnBackend(self.name, decode, rest, route.decode_max_bs)


ATTENTION_BACKENDS.register("torch", lambda kv, table, heads, device: TorchAttnBackend(kv, table, heads))
ATTENTION_BACKENDS.register(
    "flashinfer",
    FlashInferAttnBackend,
    Requires(
        devices=("cuda",), dtypes=(torch.bfloat16, torch.float16), head_dim=HeadDim("its prefill kernel", 64, 256),
        package="flashinfer",
    ),
)
# Beside torch, which has no graphs, Triton takes every decode batch.
ATTENTION_BACKENDS.register(
    "triton",
    Hybrid("triton", TritonDecodeBackend, (Route("flashinfer", DECODE_MAX_BS), Route("torch", None))),
    Requires(
        devices=("cuda",), dtypes=(torch.bfloat16, torch.float16, torch.float32),
        head_dim=HeadDim("its decode kernel", 16, 256), package="triton",
    ),
)
# EngineConfig.batch_invariant on CUDA: every token alone, prefill and decode, with graphs.
ATTENTION_BACKENDS.register(
    "triton_invariant",
    TritonInvariantBackend,
    Requires(
        devices=("cuda",), dtypes=(torch.bfloat16, torch.float16, torch.float32),
        head_dim=HeadDim("its decode kernel", 16, 256), package="triton",
    ),
)

__all__ = [
    "ATTENTION_BACKENDS",
    "BackendFactory",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "FlashInferAttnBackend",
    "Hybrid",
    "HybridAttnBackend",
    "Route",
    "TorchAttnBackend",
    "TritonDecodeBackend",
    "TritonInvariantBackend",
    "Where",
    "create_backend",
]
