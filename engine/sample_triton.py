"""Exp(1) noise for seeded rows on CUDA from Triton's Philox, keyed by each row's seed alone, so a seeded row draws the
same numbers in an eager step and inside a captured one, whatever its batch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NOISE_BLOCK = 1024


@triton.jit
def _noise_kernel(rows_ptr, seeds_ptr, out_ptr, stride, vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    u = tl.rand(tl.load(seeds_ptr + i), cols)
    noise = tl.maximum(-tl.log(u), 1.1754943508222875e-38)  # never 0: the race divides by it
    tl.store(out_ptr + row * stride + cols, noise, mask=cols < vocab)


def seeded_noise_(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor) -> None:
    """Overwrite noise[rows[i]] (float32 [bs, vocab]) with the Exp(1) numbers of seeds[i] (int64), no host sync."""
    if rows.numel():
        grid = (rows.numel(), triton.cdiv(noise.shape[1], NOISE_BLOCK))
        _noise_kernel[grid](rows, seeds, noise, noise.stride(0), noise.shape[1], BLOCK=NOISE_BLOCK)
