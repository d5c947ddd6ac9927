"""The skinny GEMM of the Triton kernels: products of a few rows (past the GEMV's, up to GEMM_MAX_ROWS) on tensor
cores, split over K so a decode step's small projections keep every SM streaming weights, under programmatic
dependent launch. Each (row tile, column tile, K split) program sums its K range in BLOCK_K steps in order into
float32; the last split of a tile to finish adds the splits' partials in split order and rounds once, so the sums do
not depend on which split finished last.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import triton_gemv
from .triton_gemv import GEMV_MAX_OUT, product_rows, weight_fits
from .triton_kernels import _round, _rows
from .triton_pdl import interpreted, pdl_on, pdl_release, pdl_wait

GEMM_MAX_ROWS = 16  # cuBLAS is faster at 32 and 64 rows (RESULTS.md, issue #26's tenth part)
BLOCK_K = 128
MIN_PROGRAMS = 264  # two per SM of an H200
MAX_TILES = triton.cdiv(GEMV_MAX_OUT, 16)  # the arrival counters one product may need


class GemmTiles(NamedTuple):
    block_m: int
    block_n: int
    splits: int
    steps: int  # BLOCK_K steps per split


@triton.jit
def _dot(x, w, acc, F32: tl.constexpr):
    """acc + x @ w.T: 16-bit products on tensor cores, or float32 ones in Triton's interpreter, whose 16-bit dot is
    wrong."""
    if F32:
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, parts_ptr, arrivals_ptr, M, N, stride_xm, stride_wn, stride_om, K: tl.constexpr,
    STEPS: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, F32: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of x @ w.T (+ bias) over one split's STEPS * BLOCK_K columns of K."""
    pdl_release(PDL)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = split * (STEPS * BLOCK_K) + tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    w_at = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :]
    x_at = x_ptr + rm[:, None] * stride_xm + rk[None, :]
    # The split's first weight tile streams in while the kernel before this one drains (triton_pdl).
    w = tl.load(w_at, mask=n_ok[:, None] & (rk < K)[None, :], other=0.0)
    pdl_wait(PDL)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in tl.static_range(STEPS):
        k_ok = rk + step * BLOCK_K < K
        if step > 0:
            w = tl.load(w_at + step * BLOCK_K, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_at + step * BLOCK_K, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = _dot(x, w, acc, F32)
    tile = rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLITS > 1:
        tl.store(parts_ptr + split * M * N + tile, acc, mask=mask)
        # Every thread's stores are issued before the release; the acquire makes the other splits' visible.
        tl.debug_barrier()
        counter = arrivals_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(counter, 1, sem="acq_rel") == SPLITS - 1:
            tl.debug_barrier()
            acc = tl.load(parts_ptr + tile, mask=mask, other=0.0)
            for s in tl.static_range(1, SPLITS):
                acc += tl.load(parts_ptr + s * M * N + tile, mask=mask, other=0.0)
            _store_tile(acc, b_ptr, out_ptr, rm, rn, n_ok, mask, stride_om, HAS_BIAS)
            tl.atomic_xchg(counter, 0)  # ready for the next launch
    else:
        _store_tile(acc, b_ptr, out_ptr, rm, rn, n_ok, mask, stride_om, HAS_BIAS)


@triton.jit
def _store_tile(acc, b_ptr, out_ptr, rm, rn, n_ok, mask, stride_om, HAS_BIAS: tl.constexpr):
    """acc (+ bias) rounded to nearest (in Triton's interpreter too) into out."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :], _round(acc, dt).to(dt), mask=mask)


def gemm_fits(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Past the GEMV's rows (cuBLAS takes a widening product there), up to GEMM_MAX_ROWS, of a 16-bit row-major weight
    of up to GEMV_MAX_OUT outputs (gated: x is [gate | up], SiLU-and-mul's launch makes the input)."""
    return triton_gemv.GEMV_MAX_ROWS < product_rows(x) <= GEMM_MAX_ROWS and weight_fits(x, weight, gated)


def gemm_tiles(m: int, n: int, k: int, min_programs: int = MIN_PROGRAMS) -> GemmTiles:
    """Rows padded to a dot's 16 or more; 64-wide column tiles (narrower for narrow products); then K split into
    whole BLOCK_K steps until the product has min_programs programs."""
    block_m = max(16, triton.next_power_of_2(m))
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    total = triton.cdiv(k, BLOCK_K)
    steps = triton.cdiv(total, max(1, min(total, triton.cdiv(min_programs, tiles))))
    return GemmTiles(block_m, block_n, triton.cdiv(total, steps), steps)


def gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, arrivals: torch.Tensor | None = None,
    tiles: GemmTiles | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for the rows gemm_fits serves. arrivals: int32 zeros, at least MAX_TILES, that the
    split merge counts on and leaves zero (None: made here)."""
    rows = _rows(x)
    m, k = rows.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    t = tiles or gemm_tiles(m, n, k)
    grid = (triton.cdiv(n, t.block_n), t.splits, triton.cdiv(m, t.block_m))
    parts = out
    if t.splits > 1:
        parts = torch.empty((t.splits, m, n), dtype=torch.float32, device=x.device)
        if arrivals is None:
            arrivals = torch.zeros(grid[0] * grid[2], dtype=torch.int32, device=x.device)
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= grid[0] * grid[2]
    pdl = pdl_on(rows)
    _gemm_kernel[grid](
        rows, weight, weight if bias is None else bias, out, parts, out if arrivals is None else arrivals, m, n,
        rows.stride(0), weight.stride(0), out.stride(0), K=k, STEPS=t.steps, SPLITS=t.splits,
        HAS_BIAS=bias is not None, F32=interpreted(), BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=BLOCK_K,
        PDL=pdl, launch_pdl=pdl, num_warps=4,
    )
    return out.view(*x.shape[:-1], n)
