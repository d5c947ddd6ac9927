"""Exp(1) noise for seeded rows on CUDA from Triton's Philox, keyed by step_seed(seed, position) mixed in the kernel, so
a seeded row draws the same numbers in an eager step and inside a captured one (which reads its positions on the
device), whatever its batch; and the exponential race of a batch whose rows are all seeded, with those numbers made
where they are used instead of written out and read back."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NOISE_BLOCK = 1024
RACE_BLOCK = 1024


@triton.jit
def step_seed(seed, position):
    """engine/sample_noise.step_seed on int64 tensors, in uint64 arithmetic (wrapping as the host's % 2**64)."""
    x = seed.to(tl.uint64, bitcast=True) * 0x9E3779B97F4A7C15 + position.to(tl.uint64, bitcast=True)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return ((x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF).to(tl.int64, bitcast=True)


@triton.jit
def _exp_noise(seed, position, cols):
    """The Exp(1) numbers of step_seed(seed, position) at cols, never 0: the race divides by them."""
    return tl.maximum(-tl.log(tl.rand(step_seed(seed, position), cols)), 1.1754943508222875e-38)


@triton.jit
def _noise_kernel(rows_ptr, seeds_ptr, positions_ptr, out_ptr, stride, vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    noise = _exp_noise(tl.load(seeds_ptr + i), tl.load(positions_ptr + i), cols)
    tl.store(out_ptr + tl.load(rows_ptr + i) * stride + cols, noise, mask=cols < vocab)


@triton.jit
def _race_kernel(probs_ptr, seeds_ptr, positions_ptr, best_ptr, at_ptr, stride, vocab, BLOCK: tl.constexpr):
    """Per (row, chunk): the chunk's highest p / noise (IEEE division, as torch's) and its first column."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    live = cols < vocab
    p = tl.load(probs_ptr + row * stride + cols, mask=live, other=0.0)
    race = tl.math.div_rn(p, _exp_noise(tl.load(seeds_ptr + row), tl.load(positions_ptr + row), cols))
    race = tl.where(live, race, -1.0)
    best = tl.max(race, axis=0)
    at = row * tl.num_programs(1) + c
    tl.store(best_ptr + at, best)
    tl.store(at_ptr + at, tl.min(tl.where(race == best, cols, vocab), axis=0))


@triton.jit
def _race_pick_kernel(best_ptr, at_ptr, out_ptr, chunks, C_PAD: tl.constexpr):
    """Per row: the first column of the highest chunk best (torch's argmax takes the first of tied maxima)."""
    row = tl.program_id(0)
    k = tl.arange(0, C_PAD)
    best = tl.load(best_ptr + row * chunks + k, mask=k < chunks, other=-1.0)
    at = tl.load(at_ptr + row * chunks + k, mask=k < chunks, other=0)
    top = tl.max(best, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best == top, at, 2**31 - 1), axis=0).to(tl.int64))


def seeded_noise_(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> None:
    """Overwrite noise[rows[i]] (float32 [bs, vocab]) with the Exp(1) numbers of step_seed(seeds[i], positions[i])
    (int64 each), no host sync."""
    if rows.numel():
        grid = (rows.numel(), triton.cdiv(noise.shape[1], NOISE_BLOCK))
        _noise_kernel[grid](rows, seeds, positions, noise, noise.stride(0), noise.shape[1], BLOCK=NOISE_BLOCK)


def seeded_race(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 [bs]: (probs / noise).argmax(dim=-1) where row i's noise is seeded_noise_'s for (seeds[i],
    positions[i]); probs float32 [bs, vocab], finite and >= 0. No host sync, nothing [bs, vocab] written."""
    bs, vocab = probs.shape
    chunks = triton.cdiv(vocab, RACE_BLOCK)
    best = torch.empty(bs, chunks, dtype=torch.float32, device=probs.device)
    at = torch.empty(bs, chunks, dtype=torch.int32, device=probs.device)
    out = torch.empty(bs, dtype=torch.int64, device=probs.device)
    _race_kernel[(bs, chunks)](probs, seeds, positions, best, at, probs.stride(0), vocab, BLOCK=RACE_BLOCK)
    _race_pick_kernel[(bs,)](best, at, out, chunks, C_PAD=triton.next_power_of_2(chunks))
    return out
