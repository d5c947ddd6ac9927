"""Triton kernels for the decoder layers on CUDA: each fuses one of HF's op sequences into a single launch.

Every intermediate that HF rounds to the model dtype is rounded here too (``_round`` between steps), so the
results follow HF's bf16/fp16 arithmetic step by step; only the order of a sum of squares differs. Imported only
on CUDA machines that have Triton (it ships with CUDA builds of torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..validate import SlotQuery
from .rotary import RotaryEmbedding


@triton.jit
def _round(x, dt: tl.constexpr):
    """float32 x rounded to dt (round to nearest even) and widened back. For bfloat16 this works on the bits: as a
    cast pair, the compiler folded the rounding of a product into an FMA with the following add (seen on the
    H200: 18% of RoPE outputs 1 ulp off HF's)."""
    if dt == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dt).to(tl.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, sum_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_s, stride_o, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dt = x.dtype
    h = x.to(tl.float32)
    if HAS_RESIDUAL:  # HF: hidden = residual + hidden, rounded to the model dtype, kept as the next residual
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        h = _round(h + r.to(tl.float32), dt)
        tl.store(sum_ptr + row * stride_s + cols, h.to(dt), mask=mask)
    inv_rms = tl.math.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    normed = _round(h * inv_rms, dt)  # HF casts back before the weight multiply
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, (w.to(tl.float32) * normed).to(dt), mask=mask)


@triton.jit
def _norm_rope_kernel(
    x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, stride_xt, stride_xh, stride_ot, stride_oh, stride_table, eps,
    HAS_NORM: tl.constexpr, HALF: tl.constexpr,
):
    """One head of one token: optional per-head RMSNorm (Qwen3's q/k norm), then NeoX RoPE."""
    t = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, HALF)
    src = x_ptr + t * stride_xt + head * stride_xh
    x1 = tl.load(src + offs)
    x2 = tl.load(src + HALF + offs)
    dt = x1.dtype
    if HAS_NORM:
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        inv_rms = tl.math.rsqrt((tl.sum(a * a, axis=0) + tl.sum(b * b, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + offs).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)
        x1 = _round(w1 * _round(a * inv_rms, dt), dt)
        x2 = _round(w2 * _round(b * inv_rms, dt), dt)
    pos = tl.load(pos_ptr + t)
    # HF: x * cos and rotate_half(x) * sin rounded, then their sum; the tables come already cast to the model
    # dtype (casting them here, the compiler dropped that rounding of loaded values: 18% of outputs were 1 ulp off).
    c1 = tl.load(cos_ptr + pos * stride_table + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * stride_table + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * stride_table + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * stride_table + HALF + offs).to(tl.float32)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    o1 = (_round(f1 * c1, dt) + _round(-f2 * s1, dt)).to(dt)
    o2 = (_round(f2 * c2, dt) + _round(f1 * s2, dt)).to(dt)
    dst = out_ptr + t * stride_ot + head * stride_oh
    tl.store(dst + offs, o1)
    tl.store(dst + HALF + offs, o2)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + t * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + t * stride_x + n_cols + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = _round(g / (1.0 + tl.exp(-g)), up.dtype)  # F.silu rounds its output before the multiply
    tl.store(out_ptr + t * stride_o + cols, (act * up.to(tl.float32)).to(up.dtype), mask=mask)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, stride_kt, stride_kh, stride_vt, stride_vh, stride_slot,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Token t's keys and values (all heads) into slot loc[t] of both caches: one launch instead of two
    index_puts and an index cast."""
    t = tl.program_id(0)
    slot = tl.load(loc_ptr + t).to(tl.int64)
    head = tl.arange(0, HEADS)[:, None]
    dim = tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_ptr + t * stride_kt + head * stride_kh + dim)
    v = tl.load(v_ptr + t * stride_vt + head * stride_vh + dim)
    dst = slot * stride_slot + head * HEAD_DIM + dim
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty))
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with unit stride in the last dim (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _norm_warps(n_cols: int) -> int:
    return 4 if n_cols <= 2048 else 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = _rows(x)
    out = torch.empty_like(rows)
    n = rows.shape[1]
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, rows, rows, weight, out, rows.stride(0), 0, 0, out.stride(0), n, eps,
            HAS_RESIDUAL=False, BLOCK=triton.next_power_of_2(n), num_warps=_norm_warps(n),
        )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, res = _rows(x), _rows(residual)
    out, total = torch.empty_like(rows), torch.empty_like(rows)
    n = rows.shape[1]
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res, total, weight, out, rows.stride(0), res.stride(0), total.stride(0), out.stride(0), n, eps,
            HAS_RESIDUAL=True, BLOCK=triton.next_power_of_2(n), num_warps=_norm_warps(n),
        )
    return out.view(x.shape), total.view(x.shape)


def norm_rope(
    x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, weight: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """x: [tokens, heads, head_dim] (rows may be strided) → a new contiguous tensor of the same shape."""
    tokens, heads, head_dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    cos, sin = rotary.tables_in(x.dtype)
    if tokens:
        _norm_rope_kernel[(tokens, heads)](
            x, out, positions, cos, sin, x if weight is None else weight,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos.stride(0), eps,
            HAS_NORM=weight is not None, HALF=head_dim // 2, num_warps=1,
        )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows = _rows(x)
    n = rows.shape[1] // 2
    out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    if rows.shape[0]:
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
            rows, out, rows.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
        )
    return out.view(*x.shape[:-1], n)


def store_kv_fits(k_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether store_kv's power-of-two tiles cover these shapes (unit inner strides, contiguous caches)."""
    heads = k.shape[1]
    return not heads & (heads - 1) and k.stride(-1) == 1 and v.stride(-1) == 1 and k_slots.is_contiguous()


def store_kv(
    k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
) -> None:
    """k_slots[loc] = k, v_slots[loc] = v; the caches are [slots, heads, head_dim], shapes as store_kv_fits asks."""
    tokens, heads, head_dim = k.shape
    if tokens:
        _store_kv_kernel[(tokens,)](
            k, v, k_slots, v_slots, loc, k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_slots.stride(0),
            HEADS=heads, HEAD_DIM=head_dim, num_warps=4,
        )


# ---- the slot checks (engine/validate.py's slot_check states them): a few launches instead of ~30 torch ops -------
SLOT_BLOCK = 256


@triton.jit
def _slot_mark_kernel(
    table_ptr, stride_row, rows_ptr, cached_ptr, len_ptr, starts_ptr, others_ptr, other_lens_ptr, n_batch, hits_ptr,
    flag_ptr, out_ptr, num_slots, PS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Row i (the batch's first, then the live rows outside it), columns of block b: flag a read slot outside the
    pool or off the page structure; mark cached slots 2 and add 1 per written one; write out_loc."""
    i = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    batch = i < n_batch
    other = tl.maximum(i - n_batch, 0)
    if batch:
        row = tl.load(rows_ptr + i)
        length = tl.load(len_ptr + i)
        cached = tl.load(cached_ptr + i)
    else:  # a live row's slots all count as cached
        row = tl.load(others_ptr + other)
        length = tl.load(other_lens_ptr + other)
        cached = length
    used = j < length
    slot = tl.load(table_ptr + row * stride_row + j, mask=used, other=0)
    in_pool = (slot >= 0) & (slot < num_slots)
    bad = used & ~in_pool
    if PS > 1:
        first = tl.load(table_ptr + row * stride_row + (j // PS) * PS, mask=used, other=0)
        bad = bad | (used & ((slot % PS != j % PS) | (slot // PS != first // PS)))
    tl.atomic_max(flag_ptr, tl.max((bad & batch).to(tl.int32), axis=0))
    tl.store(hits_ptr + slot, 2, mask=used & in_pool & (j < cached))
    written = used & (j >= cached) & batch
    tl.atomic_add(hits_ptr + slot, 1, mask=written & in_pool)
    tl.store(out_ptr + tl.load(starts_ptr + tl.minimum(i, n_batch - 1)) + j - cached, slot, mask=written)


@triton.jit
def _slot_count_kernel(
    table_ptr, stride_row, rows_ptr, cached_ptr, len_ptr, hits_ptr, flag_ptr, num_slots, BLOCK: tl.constexpr
):
    """Flag a written slot counted more than once: cached (2) or written twice (1 + 1), in whatever order the
    marks landed."""
    i = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    written = (j < tl.load(len_ptr + i)) & (j >= tl.load(cached_ptr + i))
    slot = tl.load(table_ptr + row * stride_row + j, mask=written, other=-1)
    written = written & (slot >= 0) & (slot < num_slots)
    hits = tl.load(hits_ptr + slot, mask=written, other=0)
    tl.atomic_max(flag_ptr, tl.max((hits > 1).to(tl.int32), axis=0))


@triton.jit
def _slot_redirect_kernel(
    out_ptr, table_rows_ptr, rows_ptr, len_ptr, flag_ptr, n_tokens, n_batch, dummy_slot, dummy_row,
    PADDED: tl.constexpr, BLOCK: tl.constexpr,
):
    """After the verdict: a refused batch writes only the dummy page and reads only the dummy row; padding rows
    (device_len 0, one token each) write the dummy page."""
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    refused = tl.load(flag_ptr) > 0
    tok = k < n_tokens
    to_dummy = refused
    if PADDED:
        to_dummy = to_dummy | (tl.load(len_ptr + k, mask=tok, other=1) == 0)
    loc = tl.load(out_ptr + k, mask=tok, other=0)
    tl.store(out_ptr + k, tl.where(to_dummy, dummy_slot, loc), mask=tok)
    req = k < n_batch
    rows = tl.load(rows_ptr + k, mask=req, other=0)
    tl.store(table_rows_ptr + k, tl.where(refused, dummy_row, rows), mask=req)


def slot_check(
    page_table: torch.Tensor, q: SlotQuery, num_slots: int, page_size: int, dummy_row: int, padded: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """validate.redirected_slots's results (out_loc int32 [tokens], table_rows int64 [requests], refused bool [])
    in three launches after two fills."""
    device = page_table.device
    n, m, t = len(q.rows), len(q.others), len(q.positions)
    hits = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    out_loc = torch.empty(t, dtype=torch.int32, device=device)
    table_rows = torch.empty(n, dtype=torch.int64, device=device)
    blocks = triton.cdiv(max(q.max_len, q.max_other_len), SLOT_BLOCK)
    stride = page_table.stride(0)
    _slot_mark_kernel[(n + m, blocks)](
        page_table, stride, q.rows, q.cached, q.device_len, q.starts, q.others, q.other_lens, n, hits, flag, out_loc,
        num_slots, PS=page_size, BLOCK=SLOT_BLOCK,
    )
    _slot_count_kernel[(n, triton.cdiv(q.max_len, SLOT_BLOCK))](
        page_table, stride, q.rows, q.cached, q.device_len, hits, flag, num_slots, BLOCK=SLOT_BLOCK
    )
    _slot_redirect_kernel[(triton.cdiv(max(t, n), SLOT_BLOCK),)](
        out_loc, table_rows, q.rows, q.device_len, flag, t, n, num_slots, dummy_row, PADDED=padded, BLOCK=SLOT_BLOCK
    )
    return out_loc, table_rows, flag[0] > 0


# ---- a captured decode step's page ids for FlashInfer (flashinfer_backend.graph_page_ids states them) -------------
PAGE_BLOCK = 256


@triton.jit
def _page_ids_kernel(table_ptr, stride_row, rows_ptr, indptr_ptr, out_ptr, PS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(indptr_ptr + b)
    used = p < tl.load(indptr_ptr + b + 1) - start
    row = tl.load(rows_ptr + b)
    slot = tl.load(table_ptr + row * stride_row + p * PS, mask=used, other=0)
    tl.store(out_ptr + start + p, (slot // PS).to(tl.int32), mask=used)


def page_ids(
    page_table: torch.Tensor, table_rows: torch.Tensor, kv_indptr: torch.Tensor, max_pages: int, page_size: int,
    out: torch.Tensor,
) -> None:
    bs = table_rows.shape[0]
    _page_ids_kernel[(bs, triton.cdiv(max_pages, PAGE_BLOCK))](
        page_table, page_table.stride(0), table_rows, kv_indptr, out, PS=page_size, BLOCK=PAGE_BLOCK
    )


# ---- a captured decode step's greedy tokens (engine/sample.py's rule) and what the engine keeps of them ----------
ARGMAX_BLOCK = 2048
ARGMAX_SPLITS = 16


@triton.jit
def _argmax_part_kernel(logits_ptr, stride_row, vocab, chunk, max_ptr, idx_ptr, nan_ptr, BLOCK: tl.constexpr):
    """Row r, split s: the largest non-NaN logit of the split's chunk, its first index, and whether a NaN is in it."""
    r = tl.program_id(0)
    s = tl.program_id(1)
    splits = tl.num_programs(1)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, vocab)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2**31 - 1, tl.int32)
    nan = tl.zeros([BLOCK], tl.int32)
    start = lo
    while start < hi:
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + r * stride_row + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        nan = nan | is_nan.to(tl.int32)
        x = tl.where(is_nan, float("-inf"), x)
        take = x > best  # strictly: an equal value later in the lane keeps the earlier index
        best_idx = tl.where(take, offs, best_idx)
        best = tl.where(take, x, best)
        start += BLOCK
    m = tl.max(best, axis=0)
    # A row (or split) of -inf only: its first index, as torch's argmax gives.
    first = tl.min(tl.where((best == m) & (best_idx < hi), best_idx, 2**31 - 1), axis=0)
    first = tl.where(first == 2**31 - 1, lo, first)
    tl.store(max_ptr + r * splits + s, m)
    tl.store(idx_ptr + r * splits + s, first)
    tl.store(nan_ptr + r * splits + s, tl.max(nan, axis=0))


@triton.jit
def _greedy_keep_kernel(
    max_ptr, idx_ptr, nan_ptr, last_ptr, rows_ptr, flag_ptr, tokens_ptr, payload_ptr, bs, splits,
    S_PAD: tl.constexpr,
):
    """Row r: merge the splits into its token (-1 when nothing to sample), keep it as its row's last token (0 for
    -1) and write the payload: tokens, slot verdict, the rows' last tokens before."""
    r = tl.program_id(0)
    s = tl.arange(0, S_PAD)
    ok = s < splits
    vals = tl.load(max_ptr + r * splits + s, mask=ok, other=float("-inf"))
    idxs = tl.load(idx_ptr + r * splits + s, mask=ok, other=2**31 - 1)
    nan = tl.max(tl.load(nan_ptr + r * splits + s, mask=ok, other=0), axis=0)
    m = tl.max(vals, axis=0)
    first = tl.min(tl.where(vals == m, idxs, 2**31 - 1), axis=0)
    bad = (nan > 0) | (m == float("inf")) | (m == float("-inf"))
    token = tl.where(bad, -1, first)
    row = tl.load(rows_ptr + r)
    before = tl.load(last_ptr + row)
    tl.store(last_ptr + row, tl.maximum(token, 0))
    tl.store(tokens_ptr + r, token)
    tl.store(payload_ptr + r, token)
    tl.store(payload_ptr + bs + 1 + r, before)
    if r == 0:
        tl.store(payload_ptr + bs, tl.load(flag_ptr).to(tl.int32))


def greedy_step(
    logits: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """LayerKernels.greedy_step in two launches."""
    bs, vocab = logits.shape
    splits = min(ARGMAX_SPLITS, triton.cdiv(vocab, ARGMAX_BLOCK))
    chunk = triton.cdiv(vocab, splits)
    part_max = torch.empty(bs, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(bs, splits, dtype=torch.int32, device=logits.device)
    part_nan = torch.empty(bs, splits, dtype=torch.int32, device=logits.device)
    _argmax_part_kernel[(bs, splits)](
        logits, logits.stride(0), vocab, chunk, part_max, part_idx, part_nan, BLOCK=ARGMAX_BLOCK, num_warps=8
    )
    tokens = torch.empty(bs, dtype=torch.int32, device=logits.device)
    payload = torch.empty(2 * bs + 1, dtype=torch.int32, device=logits.device)
    _greedy_keep_kernel[(bs,)](
        part_max, part_idx, part_nan, last_tokens, rows, flags, tokens, payload, bs, splits,
        S_PAD=triton.next_power_of_2(splits),
    )
    return tokens, payload


# ---- small-batch matrix products: one program per BLOCK_N output features, the whole K in-program -----------------
GEMV_MAX_ROWS = 8
GEMV_DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_xm, stride_wn, stride_om, K: tl.constexpr,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) in float32, rounded once. GATED: x rows are a merged
    [gate | up] of width 2K and the input is SiLU(gate) * up, rounded as _silu_and_mul_kernel rounds it."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x_mask = (rm[:, None] < M) & k_ok[None, :]
        x_at = x_ptr + rm[:, None] * stride_xm + rk[None, :]
        x = tl.load(x_at, mask=x_mask, other=0.0)
        if GATED:
            up = tl.load(x_at + K, mask=x_mask, other=0.0)
            g = x.to(tl.float32)
            x = _round(_round(g / (1.0 + tl.exp(-g)), up.dtype) * up.to(tl.float32), up.dtype)
        else:
            x = x.to(tl.float32)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc += x[:, None, :] * w.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2)
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & n_ok[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, gated: bool = False) -> bool:
    """Whether gemv serves this product (row-major weights of the input's dtype, int32 offsets): every single-row
    product, and narrowing ones (o_proj, down_proj) up to GEMV_MAX_ROWS rows; elsewhere cuBLAS is as fast or
    faster (RESULTS.md, H200)."""
    n, k = weight.shape
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (
        (rows == 1 or 0 < rows <= GEMV_MAX_ROWS and k > n)
        and x.shape[-1] == (2 * k if gated else k)
        and weight.stride(-1) == 1
        and weight.numel() < 2**31
        and weight.dtype == x.dtype
        and x.dtype in GEMV_DTYPES
    )


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
    """F.linear(x, weight, bias), or F.linear(SiLU(gate) * up, weight) of a merged x when gated, for the few rows
    gemv_fits accepts."""
    rows = _rows(x)
    m = rows.shape[0]
    n, k = weight.shape
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_m = triton.next_power_of_2(m)
    # Measured best on an H200 for the Qwen3-0.6B projections (RESULTS.md): 4 rows a program, long K chunks.
    block_n = max(1, min(4, triton.next_power_of_2(max(1, n // 256))))
    block_k = min(triton.next_power_of_2(k), 2048 if k % 2048 == 0 else 1024, 8192 // (block_m * block_n))
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        rows, weight, weight if bias is None else bias, out, m, n, rows.stride(0), weight.stride(0),
        out.stride(0), K=k, HAS_BIAS=bias is not None, GATED=gated, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=2 if k <= 1024 and m == 1 else 4,
    )
    return out.view(*x.shape[:-1], n)
