"""The decoder layers' elementwise kernels (RMSNorm, residual add + RMSNorm, q/k norm + RoPE, SiLU-and-mul, the
KV store) behind one interface, LayerKernels, picked by name like the attention backends and reaching the layers
the same way: the Engine puts its instance in the Context (``ctx.kernels``), which every forward pass gets.

TorchKernels ('torch') runs HF's own op sequence: the reference, on any device, and exact to HF on CPU.
TritonKernels ('triton', CUDA) fuses each sequence into one launch that keeps HF's rounding steps, and runs the
projections of small batches as its own GEMV (SiLU-and-mul fused into down_proj's). Unfused, a
decode step is ~60 small kernels per layer; inside a CUDA graph their latencies still add up to most of a
small-batch step (3.9 ms of device time for the Qwen3-0.6B shape at bs 1 on an H200, where the weights take
~0.3 ms to read).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import HeadDim, Registry, Requires
from .activation import silu_and_mul
from .linear import narrowing_weights_column_major

if TYPE_CHECKING:  # rotary imports the models package, which imports the layers
    from .rotary import RotaryAt


class HeadNorm(Protocol):
    """The parameters of a per-head RMSNorm module (Qwen3's q_norm / k_norm)."""

    @property
    def weight(self) -> torch.Tensor: ...
    @property
    def eps(self) -> float: ...


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: mean of squares and rsqrt in float32, cast back, then scaled by the weight."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    # HF casts back to the input dtype before the weight multiply; doing it after changes bf16 results.
    return weight * h.to(dtype)


class LayerKernels(ABC):
    """The interface: one method per op sequence, each computing what HF's modules compute."""

    name: str
    fuses_residual: bool  # when False, RMSNorm adds the residual itself and calls its (patchable) forward

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """HF's RMSNorm of x over its last dim."""

    @abstractmethod
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""

    @abstractmethod
    def norm_rope(self, x: torch.Tensor, rope: RotaryAt, norm: HeadNorm | None) -> torch.Tensor:
        """Optional per-head RMSNorm, then RoPE, of x [tokens, heads, head_dim]."""

    @abstractmethod
    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of a merged [tokens, 2 * size] gate/up projection."""

    @abstractmethod
    def store_kv(
        self, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> None:
        """k_slots[loc] = k and v_slots[loc] = v; slots [num_slots, kv_heads, head_dim], k, v [tokens, ...]."""

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        """F.linear(x, weight, bias); gated: x is a merged [gate | up] projection and the input is SiLU(gate) * up."""
        return F.linear(self.silu_and_mul(x) if gated else x, weight, bias)

    def arrange_weights(self, model: nn.Module) -> None:
        """Lay the loaded weights out for these kernels' matrix products (CUDA only): cuBLAS's batch-1 GEMV is
        faster on column-major narrowing weights (engine/layers/linear.py)."""
        narrowing_weights_column_major(model)

    def declines(self, op: str, *args: object) -> str | None:
        """Why these kernels hand op(*args) (the method's own arguments) to the torch reference, or None where they
        run it themselves: the op-level harness fails a hand-over that is not declared here."""
        return None


class TorchKernels(LayerKernels):
    """The torch reference: HF's op sequences, one torch op at a time."""

    name = "torch"
    fuses_residual = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm_reference(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + residual
        return self.rms_norm(total, weight, eps), total

    def norm_rope(self, x: torch.Tensor, rope: RotaryAt, norm: HeadNorm | None) -> torch.Tensor:
        if norm is not None:
            x = self.rms_norm(x, norm.weight, norm.eps)
        return rope.apply(x)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(gate_up)

    def store_kv(
        self, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> None:
        index = loc.long()
        k_slots[index] = k.to(k_slots.dtype)
        v_slots[index] = v.to(v_slots.dtype)


TORCH_KERNELS = TorchKernels()  # stateless, so every engine that picks 'torch' can share it


class TritonKernels(LayerKernels):
    """Fused Triton launches (see triton_kernels.py); a KV store or product the kernels cannot serve falls back to
    torch."""

    name = "triton"
    fuses_residual = True

    def __init__(self) -> None:
        from . import triton_kernels

        self._k: ModuleType = triton_kernels

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._k.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k.add_rms_norm(x, residual, weight, eps)

    def norm_rope(self, x: torch.Tensor, rope: RotaryAt, norm: HeadNorm | None) -> torch.Tensor:
        weight, eps = (None, 0.0) if norm is None else (norm.weight, norm.eps)
        return self._k.norm_rope(x, rope.positions, rope.table, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._k.silu_and_mul(gate_up)

    def store_kv(
        self, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> None:
        if self.declines("store_kv", k_slots, v_slots, k, v, loc) is None:
            self._k.store_kv(k_slots, v_slots, k, v, loc)
        else:
            TORCH_KERNELS.store_kv(k_slots, v_slots, k, v, loc)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        if self.declines("linear", x, weight, bias, gated) is None:
            return self._k.gemv(x, weight, bias, gated)
        return super().linear(x, weight, bias, gated)

    def arrange_weights(self, model: nn.Module) -> None:
        """Row-major stays where the small-batch GEMV serves the dtype (it reads whole rows, and at larger batches
        cuBLAS is as fast either way, RESULTS.md); other dtypes keep cuBLAS's layout."""
        if next(model.parameters()).dtype not in self._k.GEMV_DTYPES:
            super().arrange_weights(model)

    def declines(self, op: str, *args: object) -> str | None:
        if op == "store_kv" and not self._k.store_kv_fits(args[0], args[2], args[3]):
            return "the KV store's tiles need a power-of-two number of kv heads, unit inner strides, a contiguous pool"
        if op == "linear" and not self._k.gemv_fits(args[0], args[1], bool(args[3])):
            return "the GEMV serves single rows and narrowing products up to GEMV_MAX_ROWS rows, row-major weights"
        return None


LAYER_KERNELS: Registry[Callable[[], LayerKernels]] = Registry("layer_kernels", preferred=("triton",))
"""Layer kernel implementations by name (EngineConfig.layer_kernels); a factory returns a LayerKernels."""
LAYER_KERNELS.register("torch", lambda: TORCH_KERNELS)
LAYER_KERNELS.register(
    "triton",
    TritonKernels,
    Requires(
        devices=("cuda",), dtypes=(torch.float32, torch.bfloat16, torch.float16),
        head_dim=HeadDim("its RoPE kernel", 2), package="triton",
    ),
)
