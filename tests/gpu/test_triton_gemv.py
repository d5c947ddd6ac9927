"""The Triton add + RMSNorm folded into the GEMV (engine/layers/triton_gemv.py) against the composition it replaces.

The residual sum must be HF's bit for bit, written whole (one program writes it). The product is checked against
the GEMV of the torch reference's normed rows: bitwise in Triton's interpreter, where the sum of squares is
numpy's as in torch; on CUDA a float32 sum of squares in another order may move a normed element by one bf16 ulp
(and that element every output a little), so there each output lies within the float32 product's bound of the
exact product of HF's normed rows plus what one ulp of each normed element moves it. Shapes reach one K block and
several, K off the block, N tails, one row and the GEMV's most rows.

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from gpu_support import KERNEL_DEVICE as DEVICE
from gpu_support import needs_kernel_device  # noqa: E402

from engine.layers import triton_gemm, triton_gemv  # noqa: E402
from engine.layers.kernels import TORCH_KERNELS, TritonKernels  # noqa: E402
from oracle.tolerance import KERNEL_ULPS, dot_bound, rounding_bound  # noqa: E402

pytestmark = needs_kernel_device

# (rows, N, K): one K block (24, 1024; at one row a whole weight row up to 16384 values a program: 1500 off the
# block, 4096 on it) and several (8192 at one row, 2500 and 2048 at 2 and 8 rows), N tails (50, 1030: BLOCK_N 1 and 4),
# and narrowing products of GEMV_MAX_ROWS rows and past them, which the kernel still computes; and the one-row shapes
# with blocks of their own.
CASES = [(1, 50, 24), (1, 1030, 1024), (1, 40, 1500), (1, 33, 4096), (1, 1030, 8192), (2, 30, 2500), (3, 24, 50),
         (8, 30, 2500), (8, 96, 2048), *((1, n, k) for n, k in triton_gemv.ONE_ROW_BLOCKS)]


def _case(rows: int, n: int, k: int, residual: bool, bias: bool, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).bfloat16().to(DEVICE)

    x = randn(rows, k + 3, scale=3.0)[:, :k]  # strided rows, as a view of a wider buffer
    r = randn(rows, k) if residual else None
    return x, r, randn(k), randn(n, k, scale=k**-0.5), randn(n) if bias else None


@pytest.mark.parametrize(("rows", "n", "k"), CASES)
@pytest.mark.parametrize(("residual", "bias"), [(True, False), (False, True)])
def test_norm_gemv_is_the_gemv_of_the_normed_rows(rows: int, n: int, k: int, residual: bool, bias: bool) -> None:
    x, r, nw, w, b = _case(rows, n, k, residual, bias, rows * n + k)
    assert triton_gemv.gemv_fits(x, w) == (rows <= triton_gemv.GEMV_MAX_ROWS)
    out, total = triton_gemv.norm_gemv(x, r, nw, 1e-6, w, b)
    if r is None:
        normed, want_total = TORCH_KERNELS.rms_norm(x, nw, 1e-6), x
    else:
        normed, want_total = TORCH_KERNELS.add_rms_norm(x, r, nw, 1e-6)
    assert torch.equal(total, want_total), "the residual sum is not HF's"
    want = triton_gemv.gemv(normed, w, b, False)
    if DEVICE == "cpu":
        assert torch.equal(out, want), f"{(out != want).sum().item()} of {out.numel()} outputs differ"
        return
    exact = normed.double() @ w.double().T + (0 if b is None else b.double())
    moved = rounding_bound(normed, normed.dtype, KERNEL_ULPS) @ w.double().abs().T
    bound = dot_bound(exact, normed.double().abs() @ w.double().abs().T, normed.shape[-1], out.dtype) + moved
    gap = (out.double() - exact).abs()
    assert bool((gap <= bound).all()), f"max gap {gap.max().item()}"


def test_norm_linear_declines_what_the_gemv_and_gemm_do_not_serve() -> None:
    """Rows past the skinny GEMM's, and a column-major weight, go to add_rms_norm and then linear."""
    kernels = TritonKernels()
    for rows, n, k, column_major in ((triton_gemm.GEMM_MAX_ROWS + 1, 24, 50, False), (2, 50, 24, True)):
        x, r, nw, w, _ = _case(rows, n, k, True, False, 7)
        w = w.t().contiguous().t() if column_major else w
        assert kernels.declines("norm_linear", x, r, nw, 1e-6, w, None) is not None
        out, total = kernels.norm_linear(x, r, nw, 1e-6, w)
        normed, want_total = kernels.add_rms_norm(x, r, nw, 1e-6)
        assert torch.equal(total, want_total) and torch.equal(out, kernels.linear(normed, w))
    x, r, nw, w, _ = _case(1, 50, 24, True, False, 7)
    assert kernels.declines("norm_linear", x, r, nw, 1e-6, w, None) is None
