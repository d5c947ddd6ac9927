"""The batch-invariant matrix product on CUDA (EngineConfig.batch_invariant): x @ w.T with a tile configuration and a
split-K that `tiles(n, k)` picks from the weight's shape alone, never from the row count M. A row's sum over K is then
the same whatever the batch: each split sums its K range in BLOCK_K steps in order into float32, a second kernel adds
the splits' float32 partials in split order (no atomics) and rounds once; a row's tile neighbours (other requests,
graph padding) never enter its sums. BLOCK_M is fixed: it picks the MMA instruction.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 4
MIN_PROGRAMS = 264  # of a one-row product: two per SM of an H200, so a decode step streams its weights with all SMs
MIN_SPLIT_BLOCKS = 4  # BLOCK_K steps per split at least, for the loads in flight to cover the latency
REDUCE_BLOCK = 1024


class Tiles(NamedTuple):
    block_n: int
    splits: int
    chunk: int  # K per split, whole BLOCK_K steps


def tiles(n: int, k: int) -> Tiles:
    """The one configuration of every product of an [n, k] weight: narrow tiles, then split-K, until a one-row product
    has MIN_PROGRAMS programs. Its arguments are the weight's shape alone: M would make rounding follow the batch."""
    block_n = 64 if triton.cdiv(n, 64) >= MIN_PROGRAMS else 32
    steps = triton.cdiv(k, BLOCK_K)
    wanted = min(triton.cdiv(MIN_PROGRAMS, triton.cdiv(n, block_n)), max(1, steps // MIN_SPLIT_BLOCKS))
    chunk = triton.cdiv(steps, wanted) * BLOCK_K
    return Tiles(block_n, triton.cdiv(k, chunk), chunk)


@triton.jit(do_not_specialize=["M"])  # a specialised M == 1 compiles another kernel
def _matmul_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_om,
    K: tl.constexpr, CHUNK: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile over one split's K range, in BLOCK_K steps in order into a float32
    accumulator: rounded to the output if SPLIT is off, else stored in float32 at out[split]."""
    pid_m = tl.program_id(0)  # fastest: the row tiles of one weight tile run together and share it in L2
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * CHUNK
    rk = k_lo + tl.arange(0, BLOCK_K)
    k_hi = tl.minimum(k_lo + CHUNK, K)
    m_ok = rm < M
    n_ok = rn < N
    x_at = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk
    w_at = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, CHUNK // BLOCK_K):  # a constant count: the last split's steps past K load zeros
        k_ok = rk + step * BLOCK_K < k_hi
        x = tl.load(x_at, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_at, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        x_at += BLOCK_K * stride_xk
        w_at += BLOCK_K * stride_wk
    out_at = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    if SPLIT:
        tl.store(out_at + split.to(tl.int64) * M * N, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["size"])
def _reduce_kernel(parts_ptr, b_ptr, out_ptr, size, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK: tl.constexpr):
    """out = parts[0] + parts[1] + ... in split order, + bias, rounded once: element by element, so M never enters."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < size
    at = parts_ptr + i
    acc = tl.load(at, mask=ok, other=0.0)
    for _ in tl.static_range(1, SPLITS):
        at += size  # the pointer steps: s * size may pass int32
        acc += tl.load(at, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + i % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), x [..., K], weight [N, K] of x's dtype, in the weight shape's one configuration."""
    rows = x.reshape(-1, x.shape[-1])
    m, k = rows.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.dtype == x.dtype
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if not m:
        return out.view(*x.shape[:-1], n)
    block_n, splits, chunk = tiles(n, k)
    split = splits > 1
    parts = torch.empty((splits, m, n), dtype=torch.float32, device=x.device) if split else out
    bias_arg = weight if bias is None else bias
    _matmul_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, block_n), splits)](
        rows, weight, bias_arg, parts, m, n, rows.stride(0), rows.stride(1), weight.stride(0), weight.stride(1), n,
        K=k, CHUNK=chunk, SPLIT=split, HAS_BIAS=bias is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if split:
        _reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK),)](
            parts, bias_arg, out, m * n, n, SPLITS=splits, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK
        )
    return out.view(*x.shape[:-1], n)
