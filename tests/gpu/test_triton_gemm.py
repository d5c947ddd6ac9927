"""The skinny split-K Triton GEMM (engine/layers/triton_gemm.py) against the float64 product of its inputs, and
TritonKernels' routing to it.

Each output must lie within the float32 product's bound of the exact one. Shapes reach K on, off and under the
128-wide tile, N tails of the column tiles, row counts each side of the 16-row dot (GEMM_MAX_ROWS), strided rows,
and one split, a few and one per K step (whose merge must leave its counters zero and sum in a fixed order).

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from gpu_support import KERNEL_DEVICE as DEVICE  # noqa: E402
from gpu_support import needs_kernel_device  # noqa: E402

from engine.layers import triton_gemm, triton_gemv  # noqa: E402
from engine.layers.kernels import TritonKernels  # noqa: E402
from oracle.tolerance import dot_bound  # noqa: E402

pytestmark = needs_kernel_device

# (rows, N, K): K under one tile (24), off it (1030, 300) and on it (2048); N tails of 64-, 32- (30) and 16-wide (13)
# tiles; 3 rows (the fewest routed to it), 9 and GEMM_MAX_ROWS; 2, 17 and 33, outside its rows, which the kernel
# still computes (32- and 64-row tiles past 16).
CASES = [(2, 50, 24), (3, 64, 300), (17, 130, 300), (9, 1030, 1030), (33, 30, 2048),
         (triton_gemm.GEMM_MAX_ROWS, 13, 1030)]


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).bfloat16().to(DEVICE)


def _within(out: torch.Tensor, rows: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    exact = rows.double() @ w.double().T + (0 if b is None else b.double())
    bound = dot_bound(exact, rows.double().abs() @ w.double().abs().T, rows.shape[-1], out.dtype, b is not None)
    gap = (out.double() - exact).abs()
    bad = gap > bound
    assert not bool(bad.any()), f"{int(bad.sum())} of {out.numel()} outputs out of bound; max gap {gap.max().item()}"


@pytest.mark.parametrize(("rows", "n", "k"), CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_is_the_product(rows: int, n: int, k: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * n + k)
    x = _randn(gen, rows, k + 3, scale=3.0)[:, :k]  # strided rows, as a view of a wider buffer
    w = _randn(gen, n, k, scale=k**-0.5)
    b = _randn(gen, n) if bias else None
    fits = triton_gemv.GEMV_MAX_ROWS < rows <= triton_gemm.GEMM_MAX_ROWS
    assert triton_gemm.gemm_fits(x, w) == fits  # outside them the kernel still computes
    _within(triton_gemm.gemm(x, w, b), x, w, b)


@pytest.mark.parametrize("splits", [1, 3, 24])
def test_every_split_count_sums_the_same_product(splits: int) -> None:
    """One K split, three (the last one partly past K) and one a step: each within the bound, the counters back to
    zero after, and a second launch bitwise the first (the merge adds the partials in split order)."""
    gen = torch.Generator().manual_seed(splits)
    rows, n, k = 20, 70, 3000
    x, w, b = _randn(gen, rows, k, scale=3.0), _randn(gen, n, k, scale=k**-0.5), _randn(gen, n)
    steps = triton.cdiv(triton.cdiv(k, triton_gemm.BLOCK_K), splits)
    tiles = triton_gemm.GemmTiles(32, 16, triton.cdiv(k, steps * triton_gemm.BLOCK_K), steps)
    arrivals = torch.zeros(triton_gemm.MAX_TILES, dtype=torch.int32, device=DEVICE)
    out = triton_gemm.gemm(x, w, b, arrivals, tiles)
    _within(out, x, w, b)
    assert not bool(arrivals.any()), "a split counter was left set"
    assert torch.equal(triton_gemm.gemm(x, w, b, arrivals, tiles), out)


def test_triton_kernels_route_rows_past_the_gemv_to_the_gemm() -> None:
    """Rows past the GEMV's up to GEMM_MAX_ROWS (gated too: SiLU-and-mul first, and after add + RMSNorm) take the GEMM;
    a widening product of the GEMV's rows, more rows than GEMM_MAX_ROWS, or a column-major weight, torch."""
    kernels = TritonKernels()
    gen = torch.Generator().manual_seed(3)
    w = _randn(gen, 40, 300, scale=300**-0.5)
    gate_up = _randn(gen, 12, 600)
    assert kernels.declines("linear", gate_up, w, None, True) is None
    want = triton_gemm.gemm(kernels.silu_and_mul(gate_up), w, None)
    assert torch.equal(kernels.linear(gate_up, w, gated=True), want)
    x, r, nw = _randn(gen, 12, 300), _randn(gen, 12, 300), _randn(gen, 300)
    assert kernels.declines("norm_linear", x, r, nw, 1e-6, w, None) is not None  # the norm runs first, on its own
    out, total = kernels.norm_linear(x, r, nw, 1e-6, w)
    normed, want_total = kernels.add_rms_norm(x, r, nw, 1e-6)
    assert torch.equal(total, want_total) and torch.equal(out, triton_gemm.gemm(normed, w, None))
    widening = _randn(gen, 300, 40, scale=40**-0.5)
    few = _randn(gen, triton_gemv.GEMV_MAX_ROWS + 1, 40)
    assert kernels.declines("linear", few, widening, None, False) is None
    assert torch.equal(kernels.linear(few, widening), triton_gemm.gemm(few, widening, None))
    assert kernels.declines("linear", few[: triton_gemv.GEMV_MAX_ROWS], widening, None, False) is not None
    many = _randn(gen, triton_gemm.GEMM_MAX_ROWS + 1, 300)
    assert kernels.declines("linear", many, w, None, False) is not None
    assert kernels.declines("linear", x, w.t().contiguous().t(), None, False) is not None
