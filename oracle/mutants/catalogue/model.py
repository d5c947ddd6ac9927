"""Model mutants: a layer's arithmetic (RMSNorm in the model dtype, the Triton GEMV's gate) and the stop tokens
read from a model directory's config files."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path

import torch

import engine.models.config as model_config_module
from engine.core import Context
from engine.layers.norm import RMSNorm

from .base import swap

_ORIGINAL_GENERATION_EOS = model_config_module.generation_eos


def _rmsnorm_model_dtype(self: RMSNorm, x: torch.Tensor, ctx: Context) -> torch.Tensor:
    """RMSNorm's mean of squares and rsqrt in the model dtype (bf16 loses ~3 significant digits) instead of fp32."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rmsnorm_model_dtype() -> contextlib.AbstractContextManager[None]:
    return swap(RMSNorm, "forward", _rmsnorm_model_dtype)


@contextlib.contextmanager
def gemv_gate_unactivated() -> Iterator[None]:
    """The small-batch GEMV's gated form (down_proj of a decode step of up to 8 rows) multiplies by up alone,
    without SiLU(gate); the cuBLAS path of larger batches is right."""
    kernels = importlib.import_module("engine.layers.triton_gemv")  # imports triton: CUDA machines only
    original = kernels.gemv

    def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
        if gated:
            return original(x[..., x.shape[-1] // 2 :], weight, bias, False)
        return original(x, weight, bias, gated)

    with swap(kernels, "gemv", gemv):
        yield


def _generation_eos_unused(file: Path, vocab_size: int) -> tuple[int, ...] | None:
    """generation_config.json is read and checked, but its EOS ids are dropped: the stop set is config.json's alone,
    so a model stops on fewer tokens than HF's generate does."""
    _ORIGINAL_GENERATION_EOS(file, vocab_size)
    return None


def eos_from_config_only() -> contextlib.AbstractContextManager[None]:
    # ModelConfig.from_dir reaches generation_eos through its module-level name; only that name is rebound.
    return swap(model_config_module, "generation_eos", _generation_eos_unused)
