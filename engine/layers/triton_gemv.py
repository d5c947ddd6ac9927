"""The small-batch GEMV of the Triton kernels (single rows, narrowing products up to GEMV_MAX_ROWS rows), plain, with
SiLU-and-mul in its prologue, or with the add + RMSNorm in front of it in its prologue (one launch for norm and
projection, each program normalizing the rows itself with HF's rounding steps)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_kernels import _round, _rows
from .triton_pdl import pdl_on, pdl_release, pdl_wait

GEMV_MAX_ROWS = 2  # from 3 rows the skinny GEMM runs the layer faster (RESULTS.md, eleventh part)
GEMV_MAX_OUT = 65536  # a vocabulary-wide LM head streams at full bandwidth through cuBLAS (RESULTS.md)
GEMV_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om, K: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """x @ w.T (+ bias) in float32, rounded once; GATED: x is [gate | up] of width 2K, input SiLU(gate) * up."""
    pdl_release(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    # The first weight tile streams in while the kernel before this one drains (triton_pdl).
    w = tl.load(w_ptr + rn[:, None] * stride_wn + tl.arange(0, BLOCK_K)[None, :],
                mask=n_ok[:, None] & (tl.arange(0, BLOCK_K) < K)[None, :], other=0.0)
    pdl_wait(PDL)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        if k0 > 0:
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        x_mask = (rm[:, None] < M) & k_ok[None, :]
        x_at = x_ptr + rm[:, None] * stride_xm + rk[None, :]
        x = tl.load(x_at, mask=x_mask, other=0.0)
        if GATED:
            up = tl.load(x_at + K, mask=x_mask, other=0.0)
            g = x.to(tl.float32)
            x = _round(_round(g / (1.0 + tl.exp(-g)), up.dtype) * up.to(tl.float32), up.dtype)
        else:
            x = x.to(tl.float32)
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & n_ok[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _summed_rows(x_ptr, res_ptr, sum_ptr, rm, rk, mask, stride_xm, stride_rm, stride_sm, store,
                 HAS_RESIDUAL: tl.constexpr):
    """A block of rows of x, plus the residual rounded to the dtype as HF's sum is, in float32; `store`: write the
    sum out as the next residual."""
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=mask, other=0.0)
    h = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rm[:, None] * stride_rm + rk[None, :], mask=mask, other=0.0)
        h = _round(h + r.to(tl.float32), x.dtype)
        tl.store(sum_ptr + rm[:, None] * stride_sm + rk[None, :], h.to(x.dtype), mask=mask & store)
    return h


@triton.jit
def _normed_times_weight(h, inv_rms, nw_ptr, w, rk, k_ok, dt: tl.constexpr):
    """The normed block (HF's roundings: before and after the norm weight's multiply) times a loaded weight tile."""
    nw = tl.load(nw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
    x = _round(nw[None, :] * _round(h * inv_rms[:, None], dt), dt)
    return x[:, None, :] * w.to(tl.float32)[None, :, :]


@triton.jit
def _norm_gemv_kernel(
    x_ptr, res_ptr, sum_ptr, nw_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_rm, stride_sm, stride_wn,
    stride_om, eps, K: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    """RMSNorm(x (+ residual)) @ w.T (+ bias): _rms_norm_kernel's steps, then _gemv_kernel's product; program 0
    alone stores the residual sum."""
    pdl_release(PDL)
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    m_ok = rm < M
    dt = out_ptr.dtype.element_ty
    if K <= BLOCK_K:  # one block: the rows loaded once serve the norm and the product
        rk = tl.arange(0, BLOCK_K)
        k_ok = rk < K
        # The weight tile is asked for first, so its load overlaps the norm.
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        pdl_wait(PDL)
        h = _summed_rows(x_ptr, res_ptr, sum_ptr, rm, rk, m_ok[:, None] & k_ok[None, :], stride_xm, stride_rm,
                         stride_sm, pid == 0, HAS_RESIDUAL)
        inv_rms = tl.math.rsqrt(tl.sum(h * h, axis=1) / K + eps)
        out = tl.sum(_normed_times_weight(h, inv_rms, nw_ptr, w, rk, k_ok, dt), axis=2)
    else:
        pdl_wait(PDL)
        squares = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            h = _summed_rows(x_ptr, res_ptr, sum_ptr, rm, rk, m_ok[:, None] & (rk < K)[None, :], stride_xm,
                             stride_rm, stride_sm, pid == 0, HAS_RESIDUAL)
            squares += h * h
        inv_rms = tl.math.rsqrt(tl.sum(squares, axis=1) / K + eps)
        acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            k_ok = rk < K
            w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            h = _summed_rows(x_ptr, res_ptr, sum_ptr, rm, rk, m_ok[:, None] & k_ok[None, :], stride_xm, stride_rm,
                             stride_sm, pid < 0, HAS_RESIDUAL)
            acc += _normed_times_weight(h, inv_rms, nw_ptr, w, rk, k_ok, dt)
        out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], out.to(dt), mask=mask)


def product_rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def weight_fits(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """What the GEMV and the skinny GEMM both need: x's width the weight's K (2K gated), a row-major 16-bit weight of
    x's dtype, up to GEMV_MAX_OUT outputs and under 2**31 elements."""
    n, k = weight.shape
    return (
        x.shape[-1] == (2 * k if gated else k)
        and weight.stride(-1) == 1
        and n <= GEMV_MAX_OUT
        and weight.numel() < 2**31
        and weight.dtype == x.dtype
        and x.dtype in GEMV_DTYPES
    )


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Single rows, and narrowing products up to GEMV_MAX_ROWS rows, up to GEMV_MAX_OUT outputs: elsewhere cuBLAS is as
    fast (RESULTS.md)."""
    n, k = weight.shape
    rows = product_rows(x)
    return (rows == 1 or 0 < rows <= GEMV_MAX_ROWS and k > n) and weight_fits(x, weight, gated)


# (BLOCK_N, num_warps) of a single row's product by weight shape [n, k], each program taking a whole weight row
# (BLOCK_K = next power of two of k): the Qwen3-0.6B qkv, o_proj and down projections, measured together in the B 1
# step's chain of launches, where they beat the rule below (RESULTS.md, issue #26's eighteenth part).
ONE_ROW_BLOCKS = {(4096, 1024): (8, 2), (1024, 2048): (2, 4), (1024, 3072): (4, 16)}


def gemv_blocks(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of an m-row product of an [n, k] weight: ONE_ROW_BLOCKS' entry, else a
    rule tuned for the Qwen3-0.6B projections one at a time (RESULTS.md)."""
    if m == 1 and (n, k) in ONE_ROW_BLOCKS:
        block_n, warps = ONE_ROW_BLOCKS[n, k]
        return 1, block_n, triton.next_power_of_2(k), warps
    block_m = triton.next_power_of_2(m)
    block_n = max(1, min(4, triton.next_power_of_2(max(1, n // 256))))
    row = triton.next_power_of_2(k)
    if m == 1 and row * block_n <= 16384:  # one tile a program: all its weights stream in before it waits (PDL)
        block_k = row
    else:
        block_k = min(row, 2048 if k % 2048 == 0 else 1024, 8192 // (block_m * block_n))
    return block_m, block_n, block_k, 8 if block_k * block_n > 8192 else (2 if k <= 1024 and m == 1 else 4)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
    rows = _rows(x)
    m = rows.shape[0]
    n, k = weight.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps = gemv_blocks(m, n, k)
    pdl = pdl_on(rows)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        rows, weight, weight if bias is None else bias, out, m, n, rows.stride(0), weight.stride(0),
        out.stride(0), K=k, HAS_BIAS=bias is not None, GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, PDL=pdl, launch_pdl=pdl, num_warps=warps,
    )
    return out.view(*x.shape[:-1], n)


def norm_gemv(
    x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) @ weight.T + bias, x + residual), or without a residual (RMSNorm(x) @ ..., x)."""
    rows = _rows(x)
    res = rows if residual is None else _rows(residual)
    total = rows if residual is None else torch.empty_like(rows)
    m = rows.shape[0]
    n, k = weight.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps = gemv_blocks(m, n, k)
    pdl = pdl_on(rows)
    _norm_gemv_kernel[(triton.cdiv(n, block_n),)](
        rows, res, total, norm_weight, weight, weight if bias is None else bias, out, m, n, rows.stride(0),
        res.stride(0), total.stride(0), weight.stride(0), out.stride(0), eps, K=k, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, launch_pdl=pdl,
        num_warps=warps,
    )
    return out.view(*x.shape[:-1], n), x if residual is None else total.view(x.shape)
