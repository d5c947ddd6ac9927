"""The decoder layers' elementwise ops (RMSNorm, add + RMSNorm, q/k norm + RoPE, SiLU-and-mul, KV store, and q/k
norm + RoPE + KV store in one) behind LayerKernels, picked by name and reaching the layers as ``ctx.kernels``: 'torch'
runs HF's op sequence (the reference), 'triton' (CUDA) fuses each into one launch with HF's rounding steps, plus a
small-batch GEMV that can take the norm in front of it; for EngineConfig.batch_invariant, 'torch_invariant' runs every
product of the reference in fixed row blocks and 'triton_invariant' (CUDA) in the one tile configuration and split-K of
its weight's shape.
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
    @property
    def weight(self) -> torch.Tensor: ...
    @property
    def eps(self) -> float: ...


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    # HF casts back before the weight multiply; after would change bf16 results.
    return weight * h.to(dtype)


class LayerKernels(ABC):
    """One method per op sequence, each computing what HF's modules compute."""

    name: str
    # When False, RMSNorm adds the residual itself and calls its (patchable) forward, then the projection after it.
    fuses_residual: bool

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """HF's RMSNorm over the last dim."""

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

    def norm_rope_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None,
        k_norm: HeadNorm | None, k_slots: torch.Tensor, v_slots: torch.Tensor, loc: torch.Tensor,
    ) -> torch.Tensor:
        """norm_rope of q and of k, then store_kv of the rotated k and v at loc: the rotated q."""
        q = self.norm_rope(q, rope, q_norm)
        self.store_kv(k_slots, v_slots, self.norm_rope(k, rope, k_norm), v, loc)
        return q

    def rope_store_fusable(self) -> bool:
        """Whether an attention kernel may run norm_rope_store's work in its place: only where norm_rope_store is
        triton_kernels' own, unreplaced, whose arithmetic (_norm_rope_rows) that kernel repeats."""
        return False

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        """F.linear(x, weight, bias); gated: x is a merged [gate | up] projection and the input is SiLU(gate) * up."""
        return F.linear(self.silu_and_mul(x) if gated else x, weight, bias)

    def norm_linear(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
        weight: torch.Tensor, bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(F.linear(norm(x + residual), weight, bias), x + residual); residual None: (F.linear(norm(x), ...), x)."""
        if residual is None:
            normed, residual = self.rms_norm(x, norm_weight, eps), x
        else:
            normed, residual = self.add_rms_norm(x, residual, norm_weight, eps)
        return self.linear(normed, weight, bias), residual

    def arrange_weights(self, model: nn.Module) -> None:
        """Lay the loaded weights out for these kernels' matrix products (CUDA only)."""
        narrowing_weights_column_major(model)

    def declines(self, op: str, *args: object) -> str | None:
        """Why op(*args) goes to the torch reference, or None; the op-level harness fails an undeclared hand-over."""
        return None


class TorchKernels(LayerKernels):
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


TORCH_KERNELS = TorchKernels()


def weight_eps(norm: HeadNorm | None) -> tuple[torch.Tensor | None, float]:
    return (None, 0.0) if norm is None else (norm.weight, norm.eps)


BLOCK_ROWS = 2


def blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear in zero-padded blocks of BLOCK_ROWS rows: one GEMM shape whatever the row count, whose per-row
    reduction order then depends on neither the number of rows nor the other rows (a lone row would take a GEMV)."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    padded = torch.cat([rows, rows.new_zeros(-n % BLOCK_ROWS, rows.shape[1])])
    out = torch.cat([F.linear(block, weight, bias) for block in padded.split(BLOCK_ROWS)])
    return out[:n].view(*x.shape[:-1], weight.shape[0])


class InvariantKernels(TorchKernels):
    """The torch reference with batch-invariant products (EngineConfig.batch_invariant): every product runs in fixed
    row blocks, so a token's logits cannot depend on the other tokens in the batch; norms and SiLU reduce per row."""

    name = "torch_invariant"

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        return blocked_linear(self.silu_and_mul(x) if gated else x, weight, bias)


class TritonKernels(LayerKernels):
    """Fused Triton launches (triton_kernels.py, triton_gemv.py, triton_gemm.py); what they cannot serve goes to
    torch (declines)."""

    name = "triton"
    fuses_residual = True

    def __init__(self) -> None:
        from . import triton_gemm, triton_gemv, triton_kernels

        self._k: ModuleType = triton_kernels
        self._gemv: ModuleType = triton_gemv
        self._gemm: ModuleType = triton_gemm
        self._gemm_arrivals: dict[torch.device, torch.Tensor] = {}

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._k.rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k.add_rms_norm(x, residual, weight, eps)

    def norm_rope(self, x: torch.Tensor, rope: RotaryAt, norm: HeadNorm | None) -> torch.Tensor:
        return self._k.norm_rope(x, rope.positions, rope.table, *weight_eps(norm))

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._k.silu_and_mul(gate_up)

    def store_kv(
        self, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
    ) -> None:
        if self.declines("store_kv", k_slots, v_slots, k, v, loc) is None:
            self._k.store_kv(k_slots, v_slots, k, v, loc)
        else:
            TORCH_KERNELS.store_kv(k_slots, v_slots, k, v, loc)

    def norm_rope_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None,
        k_norm: HeadNorm | None, k_slots: torch.Tensor, v_slots: torch.Tensor, loc: torch.Tensor,
    ) -> torch.Tensor:
        if self.declines("norm_rope_store", q, k, v, rope, q_norm, k_norm, k_slots, v_slots, loc) is not None:
            return super().norm_rope_store(q, k, v, rope, q_norm, k_norm, k_slots, v_slots, loc)
        (qw, q_eps), (kw, k_eps) = weight_eps(q_norm), weight_eps(k_norm)
        return self._k.norm_rope_store(q, k, v, rope.positions, rope.table, qw, q_eps, kw, k_eps, k_slots, v_slots, loc)

    def rope_store_fusable(self) -> bool:
        return type(self).norm_rope_store is _TRITON_NORM_ROPE_STORE

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        if self._gemv.gemv_fits(x, weight, gated):
            return self._gemv.gemv(x, weight, bias, gated)
        if self._gemm.gemm_fits(x, weight, gated):  # SiLU first, in its own launch
            return self._gemm.gemm(self.silu_and_mul(x) if gated else x, weight, bias, self._arrivals(x.device))
        return super().linear(x, weight, bias, gated)  # declines says why

    def _product_fits(self, x: object, weight: object, gated: bool) -> bool:
        return bool(self._gemv.gemv_fits(x, weight, gated) or self._gemm.gemm_fits(x, weight, gated))

    def _arrivals(self, device: torch.device) -> torch.Tensor:
        """The skinny GEMM's split counters, one buffer per device (they come back to zero after each launch)."""
        if device not in self._gemm_arrivals:
            self._gemm_arrivals[device] = torch.zeros(self._gemm.MAX_TILES, dtype=torch.int32, device=device)
        return self._gemm_arrivals[device]

    def norm_linear(
        self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
        weight: torch.Tensor, bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.declines("norm_linear", x, residual, norm_weight, eps, weight, bias) is None:
            return self._gemv.norm_gemv(x, residual, norm_weight, eps, weight, bias)
        return super().norm_linear(x, residual, norm_weight, eps, weight, bias)

    def arrange_weights(self, model: nn.Module) -> None:
        # Row-major where the GEMV serves the dtype (it reads whole rows); others keep cuBLAS's layout.
        if next(model.parameters()).dtype not in self._gemv.GEMV_DTYPES:
            super().arrange_weights(model)

    def declines(self, op: str, *args: object) -> str | None:
        if op == "store_kv" and not self._k.store_kv_fits(args[0], args[2], args[3]):
            return "the KV store's tiles need a power-of-two number of kv heads, unit inner strides, a contiguous pool"
        if op == "norm_rope_store" and not self._k.norm_rope_store_fits(args[0], args[1], args[6], args[7]):
            return "the fused RoPE + KV store needs q and k in one dtype and unit inner strides in the KV slots"
        if op == "linear" and not self._product_fits(args[0], args[1], bool(args[3])):
            return (
                "the GEMV serves single rows and narrowing products up to GEMV_MAX_ROWS rows, the skinny GEMM the rows "
                "past those up to GEMM_MAX_ROWS; both up to GEMV_MAX_OUT outputs of 16-bit row-major weights"
            )
        if op == "norm_linear" and not self._gemv.gemv_fits(args[0], args[4]):
            return "the norm folds into the GEMV only where the GEMV serves the product; else add_rms_norm, then linear"
        return None


# What rope_store_fusable compares against: a subclass's override or a patched method is not the Triton kernel.
_TRITON_NORM_ROPE_STORE = TritonKernels.norm_rope_store


class TritonInvariantKernels(TritonKernels):
    """TritonKernels with every product and the LM head in the weight-shaped matmul (triton_matmul.py), for
    EngineConfig.batch_invariant on CUDA; the norms, RoPE, SiLU and KV store already run one program per row."""

    name = "triton_invariant"

    def __init__(self) -> None:
        super().__init__()
        from . import triton_matmul

        self._mm: ModuleType = triton_matmul

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False
    ) -> torch.Tensor:
        return self._mm.matmul(self.silu_and_mul(x) if gated else x, weight, bias)

    # The GEMV's fused norm would take a lone row through another reduction than a batch's: norm, then the matmul.
    norm_linear = LayerKernels.norm_linear

    def declines(self, op: str, *args: object) -> str | None:
        return None if op in ("linear", "norm_linear") else super().declines(op, *args)


LAYER_KERNELS: Registry[Callable[[], LayerKernels]] = Registry("layer_kernels", preferred=("triton",))
"""Layer kernel implementations by name (EngineConfig.layer_kernels); a factory returns a LayerKernels."""
LAYER_KERNELS.register("torch", lambda: TORCH_KERNELS)
LAYER_KERNELS.register("torch_invariant", InvariantKernels)
TRITON_REQUIRES = Requires(
    devices=("cuda",), dtypes=(torch.float32, torch.bfloat16, torch.float16),
    head_dim=HeadDim("its RoPE kernel", 2), package="triton",
)
LAYER_KERNELS.register("triton", TritonKernels, TRITON_REQUIRES)
LAYER_KERNELS.register("triton_invariant", TritonInvariantKernels, TRITON_REQUIRES)
