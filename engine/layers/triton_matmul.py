"""The batch-invariant matrix product on CUDA (EngineConfig.batch_invariant): x @ w.T in one Triton tile
configuration whatever the shapes, no split-K, so each output row's reduction over K runs in the same order however
many rows the batch has; a row's tile neighbours (other requests, graph padding) never enter its sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# One configuration for every call: choosing any of these from M would make a row's rounding depend on the batch.
BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit(do_not_specialize=["M"])  # a specialised M == 1 compiles another kernel
def _matmul_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_xk, stride_wn, stride_wk, stride_om,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] output tile, K in BLOCK_K steps in order into a float32 accumulator, rounded once."""
    pid_m = tl.program_id(0)  # fastest: the row tiles of one weight tile run together and share it in L2
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_at = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :] * stride_xk
    w_at = w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = rk + k0 < K
        x = tl.load(x_at, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_at, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
        x_at += BLOCK_K * stride_xk
        w_at += BLOCK_K * stride_wk
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_at = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out_at, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), x [..., K], weight [N, K] of x's dtype, in the one fixed tile configuration."""
    rows = x.reshape(-1, x.shape[-1])
    m, k = rows.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.dtype == x.dtype
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m:
        _matmul_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))](
            rows, weight, weight if bias is None else bias, out, m, n, rows.stride(0), rows.stride(1),
            weight.stride(0), weight.stride(1), out.stride(0), K=k, HAS_BIAS=bias is not None,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K, num_warps=NUM_WARPS, num_stages=NUM_STAGES,
        )
    return out.view(*x.shape[:-1], n)
