"""HF's top-k, top-p, min-p and softmax in one go and without a sort, on CUDA, where the logits hold 16-bit values
(docs/sampling.md, keys): tokens of one 16-bit value hold one score, so exact integer counts of each row's values
(65536 bins) give the scores' ascending order bin by bin. One pass counts, one sums each chunk of bins' mass, one
program per row finds top-k's bin, the bin where top-p's cumulative mass passes the cut and how many of its tied
tokens top-p removes (the lowest indices), min-p's first bin and the kept mass; two passes rank the cut bin's tokens by
index and write the probabilities. Masses are summed in another order than the sort's, which moves a decision only
within the harness's ambiguity band; a row's bits depend on the row alone."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_rows_triton import CHUNK

BINS = 1 << 16
BIN_CHUNK = 4096


@triton.jit
def _ordered_key(x, BF16: tl.constexpr):
    """x (float32 holding a bf16 or fp16 value) → its bin: the value's 16 bits, in x's order, -0.0 sharing +0.0's bin
    (they tie). Integer ops only, so no subnormal is flushed on the way."""
    xi = x.to(tl.int32, bitcast=True)
    if BF16:
        bits = (xi >> 16) & 0xFFFF
    else:
        e = (xi >> 23) & 0xFF
        m = xi & 0x7FFFFF
        subnormal = (m | 0x800000) >> tl.minimum(tl.maximum(126 - e, 0), 31)  # fp16 subnormals: e in 103..112
        magnitude = tl.where(e >= 113, ((e - 112) << 10) | (m >> 13), tl.where(e == 0, 0, subnormal))
        bits = ((xi >> 16) & 0x8000) | tl.where(e == 255, 0x7C00, magnitude)
    bits = tl.where(bits == 0x8000, 0, bits)
    return tl.where(bits >= 0x8000, 0xFFFF - bits, bits | 0x8000)


@triton.jit
def _slot(b):
    """Where bin b's count is kept: its two bytes swapped, so the neighbouring bins that hold most of a row's tokens
    lie in different cache lines and their atomic adds do not queue on one (benchmarks/RESULTS.md, thirteenth part)."""
    return ((b & 0xFF) << 8) | (b >> 8)


@triton.jit
def _bin_score(b, t, BF16: tl.constexpr):
    """The score, value / t, of the tokens in bin b (NaN for the bins no value maps to)."""
    bits = tl.where(b >= 0x8000, b & 0x7FFF, 0xFFFF - b)
    if BF16:
        value = (bits << 16).to(tl.float32, bitcast=True)
    else:
        value = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return tl.math.div_rn(value, t)


@triton.jit
def _count_kernel(x_ptr, hist_ptr, top_ptr, stride, n, CHUNK: tl.constexpr, BF16: tl.constexpr):
    """Per (row, chunk): its tokens counted into the row's bins, and the chunk's highest bin."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    live = cols < n
    key = _ordered_key(tl.load(x_ptr + row * stride + cols, mask=live, other=0.0), BF16)
    tl.atomic_add(hist_ptr + row * 65536 + _slot(key), 1, mask=live, sem="relaxed")
    tl.store(top_ptr + row * tl.num_programs(1) + c, tl.max(tl.where(live, key, 0), axis=0))


@triton.jit
def _row_top(top_ptr, t_ptr, row, chunks, C_PAD: tl.constexpr, BF16: tl.constexpr):
    """(the row's highest bin, the top score)."""
    k = tl.arange(0, C_PAD)
    top_bin = tl.max(tl.load(top_ptr + row * chunks + k, mask=k < chunks, other=0), axis=0)
    return top_bin, _bin_score(top_bin, tl.load(t_ptr + row), BF16)


@triton.jit
def _bin_weights(hist_ptr, t_ptr, row, b, top, BF16: tl.constexpr):
    """(counts, weights exp(score - top), masses count x weight) of bins b."""
    count = tl.load(hist_ptr + row * 65536 + _slot(b))
    w = tl.exp(_bin_score(b, tl.load(t_ptr + row), BF16) - top)
    return count, w, tl.where(count > 0, count.to(tl.float32) * w, 0.0)


@triton.jit
def _bin_sums_kernel(hist_ptr, top_ptr, t_ptr, min_p_ptr, count_ptr, mass_ptr, mp_bin_ptr, mp_mass_ptr, chunks,
                     BIN_CHUNK: tl.constexpr, C_PAD: tl.constexpr, HAS_MIN_P: tl.constexpr, BF16: tl.constexpr):
    """Per (row, bin chunk): its token count and mass and, for min-p, its first live bin whose weight is at least
    min_p (the top token's weight is 1) and the mass from there on."""
    row = tl.program_id(0)
    j = tl.program_id(1)
    top = _row_top(top_ptr, t_ptr, row, chunks, C_PAD, BF16)[1]
    b = j * BIN_CHUNK + tl.arange(0, BIN_CHUNK)
    count, w, mass = _bin_weights(hist_ptr, t_ptr, row, b, top, BF16)
    at = row * tl.num_programs(1) + j
    tl.store(count_ptr + at, tl.sum(count, axis=0))
    tl.store(mass_ptr + at, tl.sum(mass, axis=0))
    if HAS_MIN_P:
        kept = (count > 0) & (w >= tl.load(min_p_ptr + row))
        tl.store(mp_bin_ptr + at, tl.min(tl.where(kept, b, 1 << 16), axis=0))
        tl.store(mp_mass_ptr + at, tl.sum(tl.where(kept, mass, 0.0), axis=0))


@triton.jit
def _cut_kernel(hist_ptr, top_ptr, t_ptr, count_ptr, mass_ptr, mp_bin_ptr, mp_mass_ptr, k_ptr, cut_ptr, first_ptr,
                removed_ptr, total_ptr, chunks, HAS_K: tl.constexpr, HAS_MIN_P: tl.constexpr,
                BIN_CHUNK: tl.constexpr, J: tl.constexpr, C_PAD: tl.constexpr, BF16: tl.constexpr):
    """Per row: the first kept bin, how many of its tokens (the lowest indices) are removed, and the kept mass.

    Top-k keeps the bins from the highest one whose count from the top reaches k; top-p then removes, in ascending
    order, every token whose cumulative mass over those bins is <= the cut, never the row's last token; min-p drops
    the bins under its weight."""
    row = tl.program_id(0)
    t = tl.load(t_ptr + row)
    top_bin, top = _row_top(top_ptr, t_ptr, row, chunks, C_PAD, BF16)
    j = tl.arange(0, J)
    chunk_counts = tl.load(count_ptr + row * J + j)
    chunk_mass = tl.load(mass_ptr + row * J + j)
    in_chunk = tl.arange(0, BIN_CHUNK)
    kth_bin = 0
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int32)
        from_chunk = tl.sum(chunk_counts, axis=0) - tl.cumsum(chunk_counts, axis=0) + chunk_counts
        kth_chunk = tl.max(tl.where(from_chunk >= k, j, 0), axis=0)
        b = kth_chunk * BIN_CHUNK + in_chunk
        count, _, mass = _bin_weights(hist_ptr, t_ptr, row, b, top, BF16)
        later = tl.sum(tl.where(j > kth_chunk, chunk_counts, 0), axis=0)
        from_bin = later + tl.sum(count, axis=0) - tl.cumsum(count, axis=0) + count
        kth_bin = kth_chunk * BIN_CHUNK + tl.max(tl.where(from_bin >= k, in_chunk, 0), axis=0)
        kth_mass = tl.sum(tl.where(b >= kth_bin, mass, 0.0), axis=0)
        chunk_mass = tl.where(j < kth_chunk, 0.0, tl.where(j == kth_chunk, kth_mass, chunk_mass))
    cut = tl.load(cut_ptr + row) * tl.sum(chunk_mass, axis=0)  # cumulative / total <= cut, compared unnormalized
    passed = (tl.cumsum(chunk_mass, axis=0) > cut) | (j >= top_bin // BIN_CHUNK)
    cut_chunk = tl.min(tl.where(passed, j, J), axis=0)
    b = cut_chunk * BIN_CHUNK + in_chunk
    count, _, mass = _bin_weights(hist_ptr, t_ptr, row, b, top, BF16)
    mass = tl.where(b >= kth_bin, mass, 0.0)
    before_chunk = tl.sum(tl.where(j < cut_chunk, chunk_mass, 0.0), axis=0)
    cumulative = before_chunk + tl.cumsum(mass, axis=0)
    # The chunk's own cumulative may stay at the cut where the chunks' sums passed it: then its last live bin.
    last_live = tl.max(tl.where(mass > 0.0, b, -1), axis=0)
    cut_bin = tl.min(tl.where((cumulative > cut) | (b >= top_bin) | (b == last_live), b, 1 << 16), axis=0)
    before = tl.maximum(tl.max(tl.where(b < cut_bin, cumulative, 0.0), axis=0), before_chunk)
    w = tl.exp(_bin_score(cut_bin, t, BF16) - top)
    tied = tl.sum(tl.where(b == cut_bin, count, 0), axis=0)
    lo = tl.full((), 0, tl.int32)  # the most tokens of the bin, all but one at most, whose cumulative is <= the cut
    hi = tied - 1
    for _ in range(18):  # a bin holds < 2**18 tokens
        mid = (lo + hi + 1) // 2
        ok = before + mid.to(tl.float32) * w <= cut
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    removed = tl.where(before <= cut, lo, 0)
    first = cut_bin
    total = (tl.sum(tl.where(j > cut_chunk, chunk_mass, 0.0), axis=0)
             + tl.sum(tl.where(b > cut_bin, mass, 0.0), axis=0) + (tied - removed).to(tl.float32) * w)
    if HAS_MIN_P:
        mp_bin = tl.min(tl.load(mp_bin_ptr + row * J + j), axis=0)
        if mp_bin > cut_bin:  # min-p drops the whole cut bin and more: its kept bins are all top-k's and top-p's
            first = mp_bin
            removed = 0
            total = tl.sum(tl.load(mp_mass_ptr + row * J + j), axis=0)
    tl.store(first_ptr + row, first)
    tl.store(removed_ptr + row, removed)
    tl.store(total_ptr + row, total)


@triton.jit
def _tie_count_kernel(x_ptr, first_ptr, tie_ptr, stride, n, CHUNK: tl.constexpr, BF16: tl.constexpr):
    """Per (row, chunk): how many of the chunk's tokens are in the row's first kept bin."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
    tied = (_ordered_key(x, BF16) == tl.load(first_ptr + row)) & (cols < n)
    tl.store(tie_ptr + row * tl.num_programs(1) + c, tl.sum(tied.to(tl.int32), axis=0))


@triton.jit
def _probs_kernel(x_ptr, t_ptr, top_ptr, first_ptr, removed_ptr, total_ptr, tie_ptr, out_ptr, stride, out_stride, n,
                  CHUNK: tl.constexpr, C_PAD: tl.constexpr, BF16: tl.constexpr):
    """exp(score - top) / kept mass where the token is kept (above the first kept bin, or in it past its first
    `removed` tokens), else 0."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    k = tl.arange(0, C_PAD)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    key = _ordered_key(x, BF16)
    first = tl.load(first_ptr + row)
    kept = key > first
    ties_here = tl.load(tie_ptr + row * chunks + c)
    if ties_here > 0:  # only a chunk holding the first kept bin's tokens ranks them
        ties_before = tl.sum(tl.load(tie_ptr + row * chunks + k, mask=k < c, other=0), axis=0)
        tied = key == first
        rank = ties_before + tl.cumsum(tied.to(tl.int32), axis=0) - 1
        kept = kept | (tied & (rank >= tl.load(removed_ptr + row)))
    t = tl.load(t_ptr + row)
    top = _row_top(top_ptr, t_ptr, row, chunks, C_PAD, BF16)[1]
    p = tl.exp(tl.math.div_rn(x, t) - top) / tl.load(total_ptr + row)  # IEEE division, as torch's scores
    tl.store(out_ptr + row * out_stride + cols, tl.where(kept, p, 0.0), mask=cols < n)


def filtered_probs_by_keys(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                           top_p: torch.Tensor, min_p: torch.Tensor | None, key_dtype: torch.dtype) -> torch.Tensor:
    """float32 [bs, vocab]: softmax(logits / temperature) after HF's top-k (if any), top-p and min-p (if any), by
    docs/sampling.md. logits: float32 holding key_dtype values, every row's max finite; temperature: float32 [bs]
    under KEYS_EXACT_BELOW; top_k: int [bs]; top_p: float64 [bs]; min_p: float32 [bs]."""
    assert logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1
    bs, n = logits.shape
    assert key_dtype in (torch.bfloat16, torch.float16)
    bf16 = key_dtype == torch.bfloat16
    chunks = triton.cdiv(n, CHUNK)
    c_pad = triton.next_power_of_2(chunks)
    j = BINS // BIN_CHUNK
    dev = logits.device
    hist = torch.zeros(bs, BINS, dtype=torch.int32, device=dev)
    tops = torch.empty(bs, chunks, dtype=torch.int32, device=dev)
    counts = torch.empty(bs, j, dtype=torch.int32, device=dev)
    masses = torch.empty(bs, j, dtype=torch.float32, device=dev)
    mp_bins = torch.empty(bs, j, dtype=torch.int32, device=dev)
    mp_masses = torch.empty(bs, j, dtype=torch.float32, device=dev)
    first = torch.empty(bs, dtype=torch.int32, device=dev)
    removed = torch.empty(bs, dtype=torch.int32, device=dev)
    total = torch.empty(bs, dtype=torch.float32, device=dev)
    ties = torch.empty(bs, chunks, dtype=torch.int32, device=dev)
    out = torch.empty_like(logits)
    t = temperature.contiguous()
    cut = (1.0 - top_p).float().contiguous()
    k_arg = cut if top_k is None else top_k.contiguous()
    min_p_arg = cut if min_p is None else min_p.contiguous()
    _count_kernel[(bs, chunks)](logits, hist, tops, logits.stride(0), n, CHUNK=CHUNK, BF16=bf16)
    _bin_sums_kernel[(bs, j)](hist, tops, t, min_p_arg, counts, masses, mp_bins, mp_masses, chunks,
                              BIN_CHUNK=BIN_CHUNK, C_PAD=c_pad, HAS_MIN_P=min_p is not None, BF16=bf16)
    _cut_kernel[(bs,)](hist, tops, t, counts, masses, mp_bins, mp_masses, k_arg, cut, first, removed, total, chunks,
                       HAS_K=top_k is not None, HAS_MIN_P=min_p is not None, BIN_CHUNK=BIN_CHUNK, J=j, C_PAD=c_pad,
                       BF16=bf16)
    _tie_count_kernel[(bs, chunks)](logits, first, ties, logits.stride(0), n, CHUNK=CHUNK, BF16=bf16)
    _probs_kernel[(bs, chunks)](logits, t, tops, first, removed, total, ties, out, logits.stride(0), out.stride(0),
                                n, CHUNK=CHUNK, C_PAD=c_pad, BF16=bf16)
    return out
