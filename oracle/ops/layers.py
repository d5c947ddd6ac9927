"""Op-level checks of the layer kernels (LayerKernels): each drawn call on the target's kernels against HF's op
sequence at the same dtype, with every input inside a guarded buffer.

Contracts: the torch reference is held to HF's bits; another implementation to oracle.tolerance.KERNEL_ULPS of
HF's result where it only reorders a float32 reduction (norms, SiLU), to HF's bits where it has no reduction (RoPE
without a norm, the residual sum, the KV store), and to the float64 product's dot_bound for linear (for the norm
folded into it, of HF's normed rows, widened by what the norm's ulps move it).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from hypothesis import strategies as st

from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig

from ..strategies import seeds
from ..tolerance import dot_bound, rounding_bound
from . import references as ref
from .bench import Bench
from .compare import assert_bitwise, assert_within, describe
from .guard import Guarded, assert_untouched, guarded
from .strategies import BLOCK_EDGES, MAGNITUDES, edge_sizes, gaps, random_tensor, widths

MAX_WIDTH = 4100
MAX_ROWS = 40


def _close(bench: Bench, op: str, method: str, call: str, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """got against HF's `want` under the op's contract on this target (bitwise, or KERNEL_ULPS of HF's result)."""
    ulps = bench.ulps(method)
    if ulps == 0:
        assert_bitwise(op, call, name, got, want)
    else:
        assert_within(op, call, name, got, want, rounding_bound(want, want.dtype, ulps), f"{ulps} ulp of HF's")


def dev(bench: Bench, t: torch.Tensor) -> torch.Tensor:
    return t.to(bench.device)


# ---- RMSNorm and the residual add ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormCase:
    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    gap: int
    residual: torch.Tensor | None = None


@st.composite
def norm_cases(draw: st.DrawFn, dtype: torch.dtype, with_residual: bool = False) -> NormCase:
    rows = draw(edge_sizes((8,), 1, MAX_ROWS))
    width = draw(widths(MAX_WIDTH))
    scale = draw(st.sampled_from(MAGNITUDES))
    seed = draw(seeds)
    x = random_tensor((rows, width), dtype, scale, seed)
    if draw(st.booleans()):  # a row of zeros: rsqrt(eps) alone
        x[draw(st.integers(0, rows - 1))] = 0
    weight = random_tensor((width,), dtype, 1.0, seed + 1)
    residual = random_tensor((rows, width), dtype, scale, seed + 2) if with_residual else None
    eps = draw(st.sampled_from((1e-6, 1e-5)))
    return NormCase(x, weight, eps, draw(gaps), residual)


def check_rms_norm(bench: Bench, case: NormCase) -> None:
    x, w = guarded("x", dev(bench, case.x), case.gap), guarded("weight", dev(bench, case.weight))
    call = describe({"x": x.view, "weight": w.view}, eps=case.eps)
    got = bench.run_kernel("rms_norm", "rms_norm", x.view, w.view, case.eps)
    assert isinstance(got, torch.Tensor)
    _close(bench, "rms_norm", "rms_norm", call, "out", got, ref.rms_norm(dev(bench, case.x), w.view, case.eps))
    assert_untouched("rms_norm", [x, w])


def check_add_rms_norm(bench: Bench, case: NormCase) -> None:
    assert case.residual is not None
    x, w = guarded("x", dev(bench, case.x), case.gap), guarded("weight", dev(bench, case.weight))
    r = guarded("residual", dev(bench, case.residual), case.gap)
    call = describe({"x": x.view, "residual": r.view, "weight": w.view}, eps=case.eps)
    out = bench.run_kernel("add_rms_norm", "add_rms_norm", x.view, r.view, w.view, case.eps)
    assert isinstance(out, tuple)
    got, total = out
    want_total = dev(bench, case.x) + dev(bench, case.residual)  # HF: hidden = residual + hidden
    assert_bitwise("add_rms_norm", call, "the residual sum", total, want_total)
    _close(bench, "add_rms_norm", "add_rms_norm", call, "out", got, ref.rms_norm(want_total, w.view, case.eps))
    assert_untouched("add_rms_norm", [x, r, w])


# ---- q/k norm + RoPE -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeCase:
    x: torch.Tensor  # [tokens, heads, head_dim]
    positions: torch.Tensor  # int64 [tokens]
    theta: float
    max_positions: int
    norm_weight: torch.Tensor | None
    gap: int


ROPE_SCALES = (1.0, 4.0, 300.0)


def table_positions(draw: st.DrawFn, tokens: int) -> tuple[torch.Tensor, int]:
    """(positions, the table's length): positions anywhere in a 128/4096/40960-row table, and at its last rows."""
    max_positions = draw(st.sampled_from((128, 4096, 40960)))
    top = st.integers(max(0, max_positions - 3), max_positions - 1)  # the last rows of the cos/sin tables
    positions = draw(st.lists(st.integers(0, max_positions - 1) | top, min_size=tokens, max_size=tokens))
    return torch.tensor(positions), max_positions


@st.composite
def rope_cases(draw: st.DrawFn, dtype: torch.dtype, head_dim: int) -> RopeCase:
    tokens = draw(edge_sizes((8, 32), 1, 70))
    heads = draw(st.integers(1, 9))
    positions, max_positions = table_positions(draw, tokens)
    seed = draw(seeds)
    x = random_tensor((tokens, heads, head_dim), dtype, draw(st.sampled_from(ROPE_SCALES)), seed)
    norm = random_tensor((head_dim,), dtype, 1.0, seed + 1) if draw(st.booleans()) else None
    theta = draw(st.sampled_from((1e4, 1e6)))
    return RopeCase(x, positions, theta, max_positions, norm, draw(gaps))


def guarded_head_norm(
    bench: Bench, name: str, weight: torch.Tensor | None, guards: list[Guarded]
) -> SimpleNamespace | None:
    """A q/k norm (eps 1e-6) whose weight sits in a guarded buffer, or None."""
    if weight is None:
        return None
    w = guarded(name, dev(bench, weight))
    guards.append(w)
    return SimpleNamespace(weight=w.view, eps=1e-6)


def want_rope(bench: Bench, x: torch.Tensor, positions: torch.Tensor, norm: SimpleNamespace | None, theta: float,
               max_positions: int) -> torch.Tensor:
    """HF's q/k norm (if any) and RoPE of x."""
    normed = dev(bench, x) if norm is None else ref.rms_norm(dev(bench, x), norm.weight, norm.eps)
    return ref.rope(normed, positions, theta, max_positions)


def rope_close(bench: Bench, op: str, call: str, name: str, got: torch.Tensor, want: torch.Tensor,
               normed: bool, method: str | None = None) -> None:
    """Under the contract of the kernels' `method` (default: op itself)."""
    if normed:
        _close(bench, op, method or op, call, name, got, want)
    else:  # no reduction: any implementation keeps HF's bits
        assert_bitwise(op, call, name, got, want)


def check_norm_rope(bench: Bench, case: RopeCase) -> None:
    x = guarded("x", dev(bench, case.x), case.gap)
    positions = guarded("positions", dev(bench, case.positions))
    guards = [x, positions]
    head_norm = guarded_head_norm(bench, "norm weight", case.norm_weight, guards)
    table = RotaryEmbedding(case.x.shape[-1], case.max_positions, RopeConfig(theta=case.theta), bench.device)
    call = describe({"x": x.view, "positions": positions.view}, theta=case.theta, qk_norm=head_norm is not None)
    got = bench.run_kernel("norm_rope", "norm_rope", x.view, table.at(positions.view), head_norm)
    assert isinstance(got, torch.Tensor)
    want = want_rope(bench, case.x, positions.view, head_norm, case.theta, case.max_positions)
    rope_close(bench, "norm_rope", call, "out", got, want, head_norm is not None)
    assert_untouched("norm_rope", guards)


# ---- SiLU-and-mul ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateUpCase:
    gate_up: torch.Tensor  # [tokens, 2 * size]
    gap: int


@st.composite
def gate_up_cases(draw: st.DrawFn, dtype: torch.dtype) -> GateUpCase:
    rows = draw(edge_sizes((8,), 1, MAX_ROWS))
    size = draw(widths(MAX_WIDTH))
    scale = draw(st.sampled_from((1e-39, 1.0, 20.0, 90.0, 1e4)))  # exp(-g) overflows float32 past g ~ -88.7
    return GateUpCase(random_tensor((rows, 2 * size), dtype, scale, draw(seeds)), draw(gaps))


def check_silu_and_mul(bench: Bench, case: GateUpCase) -> None:
    x = guarded("gate_up", dev(bench, case.gate_up), case.gap)
    call = describe({"gate_up": x.view})
    got = bench.run_kernel("silu_and_mul", "silu_and_mul", x.view)
    assert isinstance(got, torch.Tensor)
    _close(bench, "silu_and_mul", "silu_and_mul", call, "out", got, ref.silu_and_mul(dev(bench, case.gate_up)))
    assert_untouched("silu_and_mul", [x])


# ---- linear (the small-batch GEMV where an implementation has one) ------------------------------------------------


# Each side of the GEMV's most rows (2, GEMV_MAX_ROWS in engine/layers/triton_gemv.py; the skinny GEMM takes the
# rows past it), of the skinny GEMM's most rows (16, GEMM_MAX_ROWS in engine/layers/triton_gemm.py; past it the
# product declines to torch), of the 8-row batch and of 32- and 64-row batches.
product_rows = edge_sizes((2, 8, 16, 32, 64), 1, 65)


@dataclass(frozen=True)
class LinearCase:
    x: torch.Tensor  # [rows, K] or, gated, [rows, 2K]
    weight: torch.Tensor  # [N, K]
    bias: torch.Tensor | None
    gated: bool
    column_major: bool
    gap: int


# The projections [N, K] of the models the engine is benchmarked on (the Qwen3-0.6B shape, SmolLM2-135M): kernels
# may launch a single row of these with blocks of their own (engine/layers/triton_gemv.py, ONE_ROW_BLOCKS).
MODEL_PROJECTIONS = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (960, 576), (576, 576), (3072, 576),
                     (576, 1536))


def model_projection(draw: st.DrawFn, rows: int) -> tuple[int, int] | None:
    """A model projection's (N, K) for half the single rows, else None."""
    return draw(st.sampled_from(MODEL_PROJECTIONS)) if rows == 1 and draw(st.booleans()) else None


@st.composite
def linear_cases(draw: st.DrawFn, dtype: torch.dtype) -> LinearCase:
    rows = draw(st.just(1) | product_rows)
    n, k = model_projection(draw, rows) or (
        draw(edge_sizes(BLOCK_EDGES, 1, 3000)), draw(edge_sizes(BLOCK_EDGES, 1, 3000))
    )
    gated = draw(st.booleans())
    seed = draw(seeds)
    x = random_tensor((rows, 2 * k if gated else k), dtype, draw(st.sampled_from((1e-3, 1.0, 30.0))), seed)
    weight = random_tensor((n, k), dtype, k**-0.5, seed + 1)
    bias = random_tensor((n,), dtype, 1.0, seed + 2) if draw(st.booleans()) else None
    return LinearCase(x, weight, bias, gated, draw(st.booleans()), draw(gaps))


def reduced_reduction(bench: Bench) -> bool:
    """Whether cuBLAS may round partial sums to the dtype here (torch's allow_*_reduced_precision_reduction)."""
    matmul = torch.backends.cuda.matmul
    return bench.device.type == "cuda" and (
        bench.dtype == torch.bfloat16 and matmul.allow_bf16_reduced_precision_reduction
        or bench.dtype == torch.float16 and matmul.allow_fp16_reduced_precision_reduction
    )


def check_linear(bench: Bench, case: LinearCase) -> None:
    x = guarded("x", dev(bench, case.x), case.gap)
    w_values = dev(bench, case.weight)
    w = guarded("weight", w_values.t().contiguous() if case.column_major else w_values)
    weight = w.view.t() if case.column_major else w.view
    guards: list[Guarded] = [x, w]
    bias = None
    if case.bias is not None:
        b = guarded("bias", dev(bench, case.bias))
        guards.append(b)
        bias = b.view
    call = describe({"x": x.view, "weight": weight, **({"bias": bias} if bias is not None else {})}, gated=case.gated)
    got = bench.run_kernel("linear", "linear", x.view, weight, bias, case.gated)
    assert isinstance(got, torch.Tensor)
    inputs = ref.silu_and_mul(dev(bench, case.x)) if case.gated else dev(bench, case.x)
    exact, magnitude = ref.linear_exact(inputs, w_values, bias)
    bound = dot_bound(exact, magnitude, case.weight.shape[1], bench.dtype, bias is not None or reduced_reduction(bench))
    assert_within("linear", call, "out", got, exact, bound, "float32 accumulation, one rounding")
    assert_untouched("linear", guards)


# ---- the norm folded into the projection that reads it (add + RMSNorm, then linear) -------------------------------


@dataclass(frozen=True)
class NormLinearCase:
    x: torch.Tensor  # [rows, K]
    residual: torch.Tensor | None
    norm_weight: torch.Tensor  # [K]
    eps: float
    weight: torch.Tensor  # [N, K]
    bias: torch.Tensor | None
    column_major: bool
    gap: int


WIDE_ROWS = (5120, 8192)
"""Hidden sizes past 4096 (14B-70B models): one row's norm spans several of the GEMV's K tiles even where a narrower
row is a single tile."""


def wide_projection(draw: st.DrawFn, rows: int) -> tuple[int, int] | None:
    """(N, K) of a wide model's norm-fed projection for half the products the GEMV serves (two rows or one), else
    None."""
    if rows > 2 or draw(st.booleans()):
        return None
    return draw(edge_sizes(BLOCK_EDGES, 1024, 3000)), draw(st.sampled_from(WIDE_ROWS) | st.integers(4097, 8192))


@st.composite
def norm_linear_cases(draw: st.DrawFn, dtype: torch.dtype) -> NormLinearCase:
    rows = draw(st.just(1) | product_rows)
    n, k = model_projection(draw, rows) or wide_projection(draw, rows) or (
        draw(edge_sizes(BLOCK_EDGES, 1, 3000)),
        draw(st.integers(1025, 3000) | edge_sizes(BLOCK_EDGES, 1, 3000)),  # rows of several K blocks as often
    )
    # Not subnormal: the normed rows' products would fall below float32's normal range, outside dot_bound.
    scale = draw(st.sampled_from(MAGNITUDES[1:]))
    seed = draw(seeds)
    x = random_tensor((rows, k), dtype, scale, seed)
    x[:, -1] *= draw(st.sampled_from((1000, 1)))  # an outlier channel (LLMs' massive activations) in the last block
    if draw(st.booleans()):  # a row of zeros: rsqrt(eps) alone
        x[draw(st.integers(0, rows - 1))] = 0
    residual = random_tensor((rows, k), dtype, scale, seed + 1) if draw(st.booleans()) else None
    norm_weight = random_tensor((k,), dtype, 1.0, seed + 2)
    weight = random_tensor((n, k), dtype, k**-0.5, seed + 3)
    bias = random_tensor((n,), dtype, 1.0, seed + 4) if draw(st.booleans()) else None
    eps = draw(st.sampled_from((1e-6, 1e-5)))
    return NormLinearCase(x, residual, norm_weight, eps, weight, bias, draw(st.integers(0, 3)) == 3, draw(gaps))


def check_norm_linear(bench: Bench, case: NormLinearCase) -> None:
    """The residual sum bitwise HF's (x itself without a residual); the product within linear's bound of the exact
    product of HF's normed rows, plus, where the norm may be off by the op's ulps, what that moves the product."""
    x = guarded("x", dev(bench, case.x), case.gap)
    norm_weight = guarded("norm weight", dev(bench, case.norm_weight))
    w_values = dev(bench, case.weight)
    w = guarded("weight", w_values.t().contiguous() if case.column_major else w_values)
    weight = w.view.t() if case.column_major else w.view
    guards: list[Guarded] = [x, norm_weight, w]
    views = {"x": x.view}
    residual = bias = None
    if case.residual is not None:
        r = guarded("residual", dev(bench, case.residual), case.gap)
        guards.append(r)
        residual = views["residual"] = r.view
    if case.bias is not None:
        b = guarded("bias", dev(bench, case.bias))
        guards.append(b)
        bias = views["bias"] = b.view
    call = describe({**views, "norm_weight": norm_weight.view, "weight": weight}, eps=case.eps)
    out = bench.run_kernel("norm_linear", "norm_linear", x.view, residual, norm_weight.view, case.eps, weight, bias)
    assert isinstance(out, tuple)
    got, total = out
    want_total = dev(bench, case.x) if case.residual is None else dev(bench, case.x) + dev(bench, case.residual)
    assert_bitwise("norm_linear", call, "the residual sum", total, want_total)
    normed = ref.rms_norm(want_total, norm_weight.view, case.eps)
    exact, magnitude = ref.linear_exact(normed, w_values, bias)
    bound = dot_bound(exact, magnitude, case.weight.shape[1], bench.dtype, bias is not None or reduced_reduction(bench))
    ulps = bench.ulps("norm_linear")
    if ulps:
        bound = bound + ref.linear_exact(rounding_bound(normed, bench.dtype, ulps), w_values.abs(), None)[0]
    what = "float32 accumulation, one rounding" + (f", inputs {ulps} ulp of HF's norm" if ulps else "")
    assert_within("norm_linear", call, "out", got, exact, bound, what)
    assert_untouched("norm_linear", guards)
