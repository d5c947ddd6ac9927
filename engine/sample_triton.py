"""Exp(1) noise for seeded rows on CUDA from Triton's Philox, keyed by step_seed(seed, position) mixed in the kernel, so
a seeded row draws the same numbers in an eager step and inside a captured one (which reads its positions on the
device), whatever its batch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NOISE_BLOCK = 1024


@triton.jit
def step_seed(seed, position):
    """engine/sample_noise.step_seed on int64 tensors, in uint64 arithmetic (wrapping as the host's % 2**64)."""
    x = seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + position.to(tl.uint64, bitcast=True)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return ((x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF).to(tl.int64, bitcast=True)


@triton.jit
def _noise_kernel(rows_ptr, seeds_ptr, positions_ptr, out_ptr, stride, vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    u = tl.rand(step_seed(tl.load(seeds_ptr + i), tl.load(positions_ptr + i)), cols)
    noise = tl.maximum(-tl.log(u), 1.1754943508222875e-38)  # never 0: the race divides by it
    tl.store(out_ptr + row * stride + cols, noise, mask=cols < vocab)


def seeded_noise_(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> None:
    """Overwrite noise[rows[i]] (float32 [bs, vocab]) with the Exp(1) numbers of step_seed(seeds[i], positions[i])
    (int64 each), no host sync."""
    if rows.numel():
        grid = (rows.numel(), triton.cdiv(noise.shape[1], NOISE_BLOCK))
        _noise_kernel[grid](rows, seeds, positions, noise, noise.stride(0), noise.shape[1], BLOCK=NOISE_BLOCK)
