"""HF's top-k then top-p on CUDA without a sort (engine/sample_rows.top_k_top_p_filter states what they keep).

Each filter removes a prefix of the stable ascending (score, index) order, so each is one threshold, found by a radix
select over the scores' 32-bit order-preserving keys, four bits a round: every (row, chunk) program histograms the
keys that share the bits decided so far (counts for top-k, masses exp(score - max) for top-p), and the next round
picks the bucket where the row's running total passes its target (V - k tokens; (1 - top_p) x the kept mass). Top-p's
exact ties at its threshold are split by index: the first r0 of them, in index order, go. A row's chunks depend on
the vocabulary alone, so its result is the same bits whatever its batch (the seeded contract).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sample_rows_triton import CHUNK

DIGIT_BITS = 4
BUCKETS = 1 << DIGIT_BITS
ROUNDS = 32 // DIGIT_BITS
SUB = 512  # tokens per histogram step: a [SUB, BUCKETS] one-hot stays in registers


@triton.jit
def _ordered_keys(x):
    """uint32 keys that sort as the float32 x do, -0.0 made +0.0 (they compare equal, so ties)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) | -2147483648)).to(tl.uint32, bitcast=True)


@triton.jit
def _key_value(key):
    """The float32 whose _ordered_keys is key."""
    bits = key.to(tl.int32, bitcast=True)
    return (bits ^ (((~bits) >> 31) | -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _decide(part_ptr, base, target, row, chunks, C_PAD: tl.constexpr, BUCKETS: tl.constexpr):
    """(digit, total below it): the first bucket of the row's histogram (summed over its chunks in a fixed order)
    where base plus the running total passes target; where rounding leaves none, the last bucket with any."""
    c = tl.arange(0, C_PAD)[:, None]
    d = tl.arange(0, BUCKETS)
    part = tl.load(part_ptr + (row * chunks + c) * BUCKETS + d[None, :], mask=c < chunks, other=0.0)
    total = tl.sum(part, axis=0)
    running = tl.cumsum(total, axis=0)
    first = tl.min(tl.where(base + running > target, d, BUCKETS), axis=0)
    last = tl.max(tl.where(total > 0, d, 0), axis=0)
    digit = tl.where(first < BUCKETS, first, last)
    return digit, base + tl.sum(tl.where(d == digit, running - total, 0.0), axis=0)


@triton.jit
def _row_top(max_ptr, row, chunks, C_PAD: tl.constexpr):
    c = tl.arange(0, C_PAD)
    return tl.max(tl.load(max_ptr + row * chunks + c, mask=c < chunks, other=float("-inf")), axis=0)


@triton.jit
def _top_k_key(part_ptr, prefix_ptr, base_ptr, want_ptr, row, rows, chunks, C_PAD: tl.constexpr,
               BUCKETS: tl.constexpr, ROUNDS: tl.constexpr, DIGIT_BITS: tl.constexpr):
    """The key of the row's k-th largest score (0, keeping everything, on a row without top-k)."""
    want = tl.load(want_ptr + row)
    at = (ROUNDS - 1) * rows + row
    digit, _ = _decide(part_ptr + (ROUNDS - 1) * rows * chunks * BUCKETS, tl.load(base_ptr + at), want, row, chunks,
                       C_PAD, BUCKETS)
    key = (tl.load(prefix_ptr + at).to(tl.uint32, bitcast=True) << DIGIT_BITS) | digit.to(tl.uint32)
    return tl.where(want > 0, key, 0).to(tl.uint32)


@triton.jit(do_not_specialize=["r"])  # one build for every round: Triton would make r = 1 a constant
def _round_kernel(x_ptr, stride, n, r, max_ptr, part_ptr, prefix_ptr, base_ptr, want_ptr, cut_ptr, count_ptr,
                  k_part_ptr, k_prefix_ptr, k_base_ptr, k_want_ptr,
                  MASS: tl.constexpr, HAS_K: tl.constexpr, FIND_K: tl.constexpr, CHUNK: tl.constexpr,
                  SUB: tl.constexpr, C_PAD: tl.constexpr, BUCKETS: tl.constexpr, ROUNDS: tl.constexpr,
                  DIGIT_BITS: tl.constexpr):
    """Round r of a search (top-k's where MASS is off, top-p's where on): decide digit r - 1 from round r - 1's
    histograms (chunk 0 records the state), then histogram this chunk's keys in the prefix by digit r. Top-k's
    round 0 also records each chunk's max, which top-p's weights are relative to."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    rows = tl.num_programs(0)
    chunks = tl.num_programs(1)
    base_cols = c * CHUNK + tl.arange(0, SUB)
    if FIND_K and r == 0:
        m = tl.full((), float("-inf"), tl.float32)
        for s in range(0, CHUNK, SUB):
            m = tl.maximum(m, tl.max(tl.load(x_ptr + row * stride + base_cols + s, mask=base_cols + s < n,
                                             other=float("-inf")), axis=0))
        tl.store(max_ptr + row * chunks + c, m)
    want = tl.load(cut_ptr + row)  # top-k's V - k; top-p's cut, which round 1 turns into a mass
    limit = tl.where(want > 0, n, 0)  # a row the filter is off on loads nothing, and its results are never read
    prefix = tl.zeros((), dtype=tl.uint32)
    base = 0.0
    if r > 0:
        prev = part_ptr + (r - 1) * rows * chunks * BUCKETS
        if MASS and r == 1:
            c2 = tl.arange(0, C_PAD)[:, None]
            d2 = tl.arange(0, BUCKETS)[None, :]
            want = want * tl.sum(tl.sum(tl.load(prev + (row * chunks + c2) * BUCKETS + d2, mask=c2 < chunks,
                                                other=0.0), axis=1), axis=0)
            if c == 0:
                tl.store(want_ptr + row, want)
        elif MASS:
            want = tl.load(want_ptr + row)
        at = (r - 1) * rows + row
        digit, base = _decide(prev, tl.load(base_ptr + at), want, row, chunks, C_PAD, BUCKETS)
        prefix = (tl.load(prefix_ptr + at).to(tl.uint32, bitcast=True) << DIGIT_BITS) | digit.to(tl.uint32)
        if c == 0:
            tl.store(prefix_ptr + r * rows + row, prefix.to(tl.int32, bitcast=True))
            tl.store(base_ptr + r * rows + row, base)
    shift = (32 - DIGIT_BITS * (r + 1)).to(tl.uint32)
    k_key = tl.zeros((), dtype=tl.uint32)
    top = 0.0
    if MASS:
        top = _row_top(max_ptr, row, chunks, C_PAD)
        if HAS_K:
            k_key = _top_k_key(k_part_ptr, k_prefix_ptr, k_base_ptr, k_want_ptr, row, rows, chunks, C_PAD, BUCKETS,
                               ROUNDS, DIGIT_BITS)
    d = tl.arange(0, BUCKETS)
    hist = tl.zeros((BUCKETS,), dtype=tl.float32)
    count = tl.zeros((BUCKETS,), dtype=tl.int32)
    for s in range(0, CHUNK, SUB):
        cols = base_cols + s
        x = tl.load(x_ptr + row * stride + cols, mask=cols < limit, other=float("-inf"))
        key = _ordered_keys(x)
        inside = (cols < limit) & ((r == 0) | ((key >> (shift + DIGIT_BITS)) == prefix))
        digit = ((key >> shift) & (BUCKETS - 1)).to(tl.int32)
        hit = inside[:, None] & (digit[:, None] == d[None, :])
        if MASS:
            w = tl.where(key >= k_key, tl.exp(x - top), 0.0)
            hist += tl.sum(tl.where(hit, w[:, None], 0.0), axis=0)
            if r == ROUNDS - 1:
                count += tl.sum(hit.to(tl.int32), axis=0)
        else:
            hist += tl.sum(hit.to(tl.float32), axis=0)
    tl.store(part_ptr + ((r * rows + row) * chunks + c) * BUCKETS + d, hist)
    if MASS and r == ROUNDS - 1:
        tl.store(count_ptr + (row * chunks + c) * BUCKETS + d, count)


@triton.jit
def _thresholds_kernel(max_ptr, part_ptr, prefix_ptr, base_ptr, want_ptr, cut_ptr, count_ptr,
                       k_part_ptr, k_prefix_ptr, k_base_ptr, k_want_ptr, k_key_ptr, p_key_ptr, drop_ptr, before_ptr,
                       chunks, HAS_K: tl.constexpr, C_PAD: tl.constexpr,
                       BUCKETS: tl.constexpr, ROUNDS: tl.constexpr, DIGIT_BITS: tl.constexpr):
    """Per row: top-k's key, top-p's key, how many of top-p's ties at its key go (r0), and the ties before each
    chunk, which rank a tie within its row."""
    row = tl.program_id(0)
    rows = tl.num_programs(0)
    k_key = tl.zeros((), dtype=tl.uint32)
    if HAS_K:
        k_key = _top_k_key(k_part_ptr, k_prefix_ptr, k_base_ptr, k_want_ptr, row, rows, chunks, C_PAD, BUCKETS,
                           ROUNDS, DIGIT_BITS)
    tl.store(k_key_ptr + row, k_key.to(tl.int32, bitcast=True))
    p_key = tl.zeros((), dtype=tl.uint32)
    drop = 0
    c = tl.arange(0, C_PAD)
    before = tl.zeros((C_PAD,), dtype=tl.int32)
    if tl.load(cut_ptr + row) > 0:
        want = tl.load(want_ptr + row)
        at = (ROUNDS - 1) * rows + row
        digit, base = _decide(part_ptr + (ROUNDS - 1) * rows * chunks * BUCKETS, tl.load(base_ptr + at), want,
                              row, chunks, C_PAD, BUCKETS)
        p_key = (tl.load(prefix_ptr + at).to(tl.uint32, bitcast=True) << DIGIT_BITS) | digit.to(tl.uint32)
        ties = tl.load(count_ptr + (row * chunks + c) * BUCKETS + digit, mask=c < chunks, other=0)
        before = tl.cumsum(ties, axis=0) - ties
        weight = tl.exp(_key_value(p_key) - _row_top(max_ptr, row, chunks, C_PAD))
        room = tl.where(weight > 0, (want - base) / weight, 0.0)
        drop = tl.minimum(tl.maximum(room, 0.0), (tl.sum(ties, axis=0) - 1).to(tl.float32)).to(tl.int32)
    tl.store(p_key_ptr + row, p_key.to(tl.int32, bitcast=True))
    tl.store(drop_ptr + row, drop)
    tl.store(before_ptr + row * chunks + c, before, mask=c < chunks)


@triton.jit
def _keep_kernel(x_ptr, out_ptr, k_key_ptr, p_key_ptr, drop_ptr, before_ptr, stride, out_stride, n,
                 CHUNK: tl.constexpr):
    """x where top-k and top-p keep it, else -inf: keys at or above top-k's; above top-p's, or at it past r0 ties."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    key = _ordered_keys(x)
    k_key = tl.load(k_key_ptr + row).to(tl.uint32, bitcast=True)
    p_key = tl.load(p_key_ptr + row).to(tl.uint32, bitcast=True)
    tie = ((key == p_key) & (cols < n)).to(tl.int32)
    rank = tl.load(before_ptr + row * tl.num_programs(1) + c) + tl.cumsum(tie, axis=0) - tie
    kept = (key >= k_key) & ((key > p_key) | ((tie > 0) & (rank >= tl.load(drop_ptr + row))))
    tl.store(out_ptr + row * out_stride + cols, tl.where(kept, x, float("-inf")), mask=cols < n)


def _search(x: torch.Tensor, maxes: torch.Tensor, want: torch.Tensor, cut: torch.Tensor | None,
            k_state: tuple[torch.Tensor, ...] | None, rounds: int = ROUNDS) -> tuple[torch.Tensor, ...]:
    """Run a search's first `rounds` rounds: top-k's (cut None; want = V - k) or top-p's (want filled in round 1).
    Returns (histograms, prefixes, bases, want, tie counts)."""
    rows, chunks = x.shape[0], maxes.shape[1]
    part = torch.empty(ROUNDS, rows, chunks, BUCKETS, dtype=torch.float32, device=x.device)
    prefix = torch.zeros(ROUNDS, rows, dtype=torch.int32, device=x.device)
    base = torch.zeros(ROUNDS, rows, dtype=torch.float32, device=x.device)
    counts = torch.empty(rows, chunks, BUCKETS, dtype=torch.int32, device=x.device)
    mass = cut is not None
    k_args = k_state if k_state is not None else (part, prefix, base, want)
    for r in range(rounds):
        _round_kernel[(rows, chunks)](
            x, x.stride(0), x.shape[1], r, maxes, part, prefix, base, want, cut if mass else want, counts, *k_args,
            MASS=mass, HAS_K=k_state is not None, FIND_K=not mass, CHUNK=CHUNK, SUB=SUB,
            C_PAD=triton.next_power_of_2(chunks), BUCKETS=BUCKETS, ROUNDS=ROUNDS, DIGIT_BITS=DIGIT_BITS)
    return part, prefix, base, want, counts


def _thresholds(x: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per row: (top-k's key, top-p's key, r0, ties before each chunk), as int32 tensors."""
    rows, vocab = x.shape
    chunks = triton.cdiv(vocab, CHUNK)
    maxes = torch.empty(rows, chunks, dtype=torch.float32, device=x.device)
    k_want = torch.zeros(rows, dtype=torch.float32, device=x.device)
    if top_k is not None:
        k_want = (vocab - top_k.clamp(max=vocab)).float()
    # Round 0 records the chunk maxima on every row; without top-k that is all it is run for.
    k_state = _search(x, maxes, k_want, None, None, ROUNDS if top_k is not None else 1)[:4]
    cut = (1.0 - top_p).float().contiguous()
    p_state = _search(x, maxes, torch.empty_like(cut), cut, k_state if top_k is not None else None)
    keys = [torch.empty(rows, dtype=torch.int32, device=x.device) for _ in range(3)]
    before = torch.empty(rows, chunks, dtype=torch.int32, device=x.device)
    _thresholds_kernel[(rows,)](maxes, *p_state[:4], cut, p_state[4], *k_state, *keys, before, chunks,
                                HAS_K=top_k is not None, C_PAD=triton.next_power_of_2(chunks),
                                BUCKETS=BUCKETS, ROUNDS=ROUNDS, DIGIT_BITS=DIGIT_BITS)
    return (*keys, before)


def top_k_top_p(scores: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor) -> torch.Tensor:
    """scores (float32 [bs, vocab], each row with a finite max) with -inf where HF's top-k (None: off) then top-p
    remove a token; a row with top_k >= vocab or top_p >= 1 is left to the other filter."""
    assert scores.dim() == 2 and scores.dtype == torch.float32 and scores.stride(1) == 1
    k_key, p_key, drop, before = _thresholds(scores, top_k, top_p)
    out = torch.empty_like(scores)
    _keep_kernel[(scores.shape[0], before.shape[1])](scores, out, k_key, p_key, drop, before, scores.stride(0),
                                                     out.stride(0), scores.shape[1], CHUNK=CHUNK)
    return out
