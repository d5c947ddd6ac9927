"""Paged decode attention in Triton through the token-granular page table: rows, lengths and the split-KV split are
read on the device, so a graph replays it with no host planning. The products are dots of a kv head's query rows
(padded to a dot's 16) with 64-token tiles; for 16-bit K/V they run on tensor cores, the probabilities rounded to
V's dtype as FlashInfer does (`tensor_core_products`), else in float32; the rest is float32, the output rounded
once. One launch, under programmatic dependent launch: the last split of a (request, kv head) to finish merges them.
Given NewTokens, the same launch also does the layer's q/k norm, RoPE and KV store (norm_rope_store's arithmetic).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..layers.triton_kernels import _norm_rope_rows, _rope_factors
from ..layers.triton_pdl import interpreted, pdl_on, pdl_release, pdl_wait

MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 64
NUM_WARPS = 4  # with block_n's tiles, the fastest B 1 configuration measured (RESULTS.md, eighth part)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, lens_ptr, out_ptr, lse_ptr, stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_vs, stride_vh, stride_table, scale, merged_ptr, arrivals_ptr,
    new_k_ptr, new_v_ptr, loc_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, stride_nk, stride_nkh, stride_nv, stride_nvh,
    stride_rope, q_eps, k_eps,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, S_PAD: tl.constexpr, PDL: tl.constexpr, TC: tl.constexpr, LEN_OFFSET: tl.constexpr,
    FUSED: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr, EARLY: tl.constexpr,
):
    """One (request, kv head, split): all GROUP query heads over the split's tokens; SPLIT: the last split of a
    (request, kv head) to finish merges them all. FUSED: q and the newest token's k come unnormed and unrotated
    (norm_rope_store's inputs), and the split holding that token stores its k and v at loc. EARLY: read what
    paged_decode's `early` allows before the PDL wait."""
    pdl_release(PDL)
    if not EARLY:
        pdl_wait(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * GROUP
    num_splits = tl.num_programs(2)
    # With EARLY, before the wait (engine/layers/triton_pdl.py): rows, lengths, page table and the earlier tokens'
    # K/V; only the newest token's K/V is written in this layer.
    row = tl.load(rows_ptr + b).to(tl.int64)
    seq_len = tl.load(lens_ptr + b).to(tl.int32) + LEN_OFFSET
    newest = seq_len - 1
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)
    holds_newest = (lo <= newest) & (newest < hi)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    table_row = table_ptr + row * stride_table
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    k, v = _earlier_tokens(table_row, k_base, v_base, stride_ks, stride_vs, lo, hi, newest, d, BLOCK_N)
    if FUSED:  # the norm weights and RoPE rows too
        q_factors = _rope_factors(newest, cos_ptr, sin_ptr, qw_ptr, stride_rope, Q_NORM, HEAD_DIM // 2)
        k_factors = _rope_factors(newest, cos_ptr, sin_ptr, kw_ptr, stride_rope, K_NORM, HEAD_DIM // 2)
    if EARLY:
        pdl_wait(PDL)

    if FUSED:
        q = _rotated_rows(q_ptr + b * stride_qb + heads[:, None] * stride_qh, g_mask[:, None], q_factors, q_eps,
                          Q_NORM, G_PAD, HEAD_DIM)
        one = tl.full([1], 0, tl.int32)
        k_new = _rotated_rows(new_k_ptr + b * stride_nk + kv_head * stride_nkh + one[:, None], holds_newest,
                              k_factors, k_eps, K_NORM, 1, HEAD_DIM)
        v_new = tl.load(new_v_ptr + b * stride_nv + kv_head * stride_nvh + d[None, :], mask=holds_newest, other=0.0)
        k_new, v_new = k_new.to(k_ptr.dtype.element_ty), v_new.to(v_ptr.dtype.element_ty)
        if holds_newest:
            slot = tl.load(loc_ptr + b).to(tl.int64)  # slot * stride passes 2**31 elements in large pools
            tl.store(k_base + slot * stride_ks + d[None, :], k_new)
            tl.store(v_base + slot * stride_vs + d[None, :], v_new)
    else:
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                    mask=g_mask[:, None], other=0.0)
        slot = tl.load(table_row + newest, mask=holds_newest, other=0).to(tl.int64)
        k_new = tl.load(k_base + slot * stride_ks + d[None, :], mask=holds_newest, other=0.0)
        v_new = tl.load(v_base + slot * stride_vs + d[None, :], mask=holds_newest, other=0.0)
    if not TC:
        q = q.to(tl.float32)
    # Finite, so an all-masked row gives exp(-inf) = 0, never NaN.
    m = tl.full([G_PAD], -1.0e30, tl.float32)
    total = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    start = lo
    while start < hi:  # not `for ... in range`: the interpreter can't take loaded values as bounds (numpy 2.4)
        tokens = start + tl.arange(0, BLOCK_N)
        t_mask = tokens < hi
        is_new = (tokens == newest)[:, None]
        k_tile = tl.where(is_new, k_new, k)
        v_tile = tl.where(is_new, v_new, v)
        start += BLOCK_N
        k, v = _earlier_tokens(table_row, k_base, v_base, stride_ks, stride_vs, start, hi, newest, d, BLOCK_N)
        if TC:  # exact 16-bit products, summed in float32
            s = tl.dot(q, tl.trans(k_tile)) * scale
        else:
            s = tl.dot(q, tl.trans(k_tile.to(tl.float32)), input_precision="ieee") * scale
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if TC:
            acc = acc * alpha[:, None] + tl.dot(p.to(v_tile.dtype), v_tile)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v_tile.to(tl.float32), input_precision="ieee")
        m = m_new

    # An empty split stores lse = -inf: no weight in the merge.
    o = acc / tl.where(total > 0, total, 1.0)[:, None]
    out_rows = (b * num_q_heads + heads) * num_splits + split
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=g_mask[:, None])
    if SPLIT:
        tl.store(lse_ptr + out_rows, m + tl.log(total), mask=g_mask)
        # Every thread's stores are issued before the release; the acquire makes the other splits' visible.
        tl.debug_barrier()
        counter = arrivals_ptr + b * tl.num_programs(1) + kv_head
        if tl.atomic_add(counter, 1, sem="acq_rel") == num_splits - 1:
            tl.debug_barrier()
            _merge_splits(out_ptr, lse_ptr, merged_ptr, (b * num_q_heads + heads) * num_splits, b * num_q_heads + heads,
                          g_mask, num_splits, S_PAD, HEAD_DIM)
            tl.atomic_xchg(counter, 0)  # ready for the next launch


@triton.jit
def _earlier_tokens(table_row, k_base, v_base, stride_ks, stride_vs, start, hi, newest, d, BLOCK_N: tl.constexpr):
    """The K and V tiles of tokens [start, start + BLOCK_N) below hi, zeros at the newest token (read apart)."""
    tokens = start + tl.arange(0, BLOCK_N)
    t_mask = tokens < hi
    slots = tl.load(table_row + tokens, mask=t_mask, other=0).to(tl.int64)
    earlier = (t_mask & (tokens != newest))[:, None]
    k = tl.load(k_base + slots[:, None] * stride_ks + d[None, :], mask=earlier, other=0.0)
    v = tl.load(v_base + slots[:, None] * stride_vs + d[None, :], mask=earlier, other=0.0)
    return k, v


@triton.jit
def _rotated_rows(src, rows_mask, factors, eps, HAS_NORM: tl.constexpr, R: tl.constexpr, HEAD_DIM: tl.constexpr):
    """_norm_rope_rows' halves of R rows, by _rope_factors' values, joined back into [R, HEAD_DIM]."""
    w1, w2, c1, c2, s1, s2 = factors
    o1, o2 = _norm_rope_rows(src, rows_mask, w1, w2, c1, c2, s1, s2, eps, HAS_NORM, HEAD_DIM // 2)
    return tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), [R, HEAD_DIM])


@triton.jit
def _merge_splits(parts_ptr, lse_ptr, out_ptr, first_rows, out_rows, g_mask, num_splits, S_PAD: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """The splits of each row, in split order, weighted by their log-sum-exp: the same sums whoever merges."""
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, HEAD_DIM)
    at = first_rows[:, None] + s[None, :]
    mask = g_mask[:, None] & (s < num_splits)[None, :]
    lse = tl.where(g_mask[:, None], tl.load(lse_ptr + at, mask=mask, other=float("-inf")), 0.0)  # no NaN lanes
    parts = tl.load(parts_ptr + at[:, :, None] * HEAD_DIM + d[None, None, :], mask=mask[:, :, None], other=0.0)
    w = tl.exp(lse - tl.max(lse, axis=1)[:, None])  # split 0 is never empty: the max is finite
    o = tl.sum(w[:, :, None] * parts, axis=1) / tl.sum(w, axis=1)[:, None]
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=g_mask[:, None])


def block_n(group: int, head_dim: int) -> int:
    """Tokens per tile: 64 (faster at B 1 than 16, 32 or 128, RESULTS.md eighth part), 32 past head_dim 128."""
    return 64 if head_dim <= 128 else 32


def tensor_core_products(q: torch.Tensor, k_slots: torch.Tensor) -> bool:
    """Whether q k^T and P V run on tensor cores (16-bit q and K/V of one dtype, P rounded to it); never in Triton's
    interpreter, whose 16-bit dot is wrong."""
    same_16_bit = q.dtype in (torch.bfloat16, torch.float16) and k_slots.dtype == q.dtype
    return same_16_bit and not interpreted()


def choose_splits(bs: int, num_kv_heads: int, max_len: int, num_sms: int) -> int:
    """Splits per request for about 2 programs per SM, each at least MIN_SPLIT_TOKENS long."""
    wanted = triton.cdiv(2 * num_sms, bs * num_kv_heads)
    return max(1, min(MAX_SPLITS, wanted, max_len // MIN_SPLIT_TOKENS))


class NewTokens(NamedTuple):
    """What norm_rope_store would take, for a decode that norms, rotates and stores the newest tokens itself: k and v
    [bs, Hkv, D] unrotated, their slots, the RoPE tables (model dtype) and the q/k norm weights (None: no norm)."""

    k: torch.Tensor
    v: torch.Tensor
    loc: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_weight: torch.Tensor | None
    q_eps: float
    k_weight: torch.Tensor | None
    k_eps: float


def fuses_new_tokens(q: torch.Tensor, new: NewTokens, k_slots: torch.Tensor, v_slots: torch.Tensor) -> bool:
    """Whether paged_decode can take `new` (unit inner strides, q and k of one dtype, tables as wide as a head)."""
    same = q.dtype == new.k.dtype and new.cos.shape[-1] == q.shape[-1]
    units = all(x.stride(-1) == 1 for x in (q, new.k, new.v, k_slots, v_slots, new.cos, new.sin))
    return same and units


def paged_decode(
    q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, page_table: torch.Tensor,
    table_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float, num_splits: int,
    arrivals: torch.Tensor | None = None, new: NewTokens | None = None, early: bool = False, len_offset: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale) v, q [bs, Hq, D], over the first seq_lens[i] + len_offset slots of row table_rows[i] →
    [bs, Hq, D]. len_offset is added in the kernel (1: the newest tokens' positions stand for the lengths, with no add
    kernel before). arrivals: int32 zeros, at least bs * Hkv, that the split merge counts on and leaves zero (None:
    made here). new: q and each request's newest k (the last of its slots) unnormed and unrotated, stored here
    (fuses_new_tokens). early: every row's tokens but its newest were stored before the step's layers ran (a decode
    batch, one new token per request; not a query of a prefill chunk, whose chunk-mates this layer stores), so the
    kernel reads them before its PDL wait, while the kernel before it runs."""
    bs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_slots.shape[1]
    assert num_q_heads % num_kv_heads == 0 and num_splits >= 1
    assert k_slots.stride(2) == 1 and v_slots.stride(2) == 1 and page_table.stride(1) == 1
    assert new is None or fuses_new_tokens(q, new, k_slots, v_slots)
    group = num_q_heads // num_kv_heads
    g_pad = max(16, triton.next_power_of_2(group))  # a dot's fewest rows
    tokens = block_n(group, head_dim)
    out = torch.empty(bs, num_q_heads, head_dim, dtype=q.dtype, device=q.device)
    parts, lse = out, out  # one split: the output, and no log-sum-exp
    if num_splits > 1:
        parts = torch.empty(bs, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(bs, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        if arrivals is None:
            arrivals = torch.zeros(bs * num_kv_heads, dtype=torch.int32, device=q.device)
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= bs * num_kv_heads
    fused = new if new is not None else NewTokens(q, q, seq_lens, q, q, None, 0.0, None, 0.0)  # unread stand-ins
    pdl = pdl_on(q)
    _decode_kernel[(bs, num_kv_heads, num_splits)](
        q, k_slots, v_slots, page_table, table_rows, seq_lens, parts, lse, q.stride(0), q.stride(1), q.stride(2),
        k_slots.stride(0), k_slots.stride(1), v_slots.stride(0), v_slots.stride(1), page_table.stride(0), scale,
        out, out if arrivals is None else arrivals,
        fused.k, fused.v, fused.loc, fused.cos, fused.sin,
        q if fused.q_weight is None else fused.q_weight, q if fused.k_weight is None else fused.k_weight,
        fused.k.stride(0), fused.k.stride(1), fused.v.stride(0), fused.v.stride(1), fused.cos.stride(0),
        fused.q_eps, fused.k_eps,
        GROUP=group, G_PAD=g_pad, HEAD_DIM=head_dim, BLOCK_N=tokens, SPLIT=num_splits > 1,
        S_PAD=triton.next_power_of_2(num_splits), PDL=pdl, launch_pdl=pdl, TC=tensor_core_products(q, k_slots),
        LEN_OFFSET=len_offset,
        FUSED=new is not None, Q_NORM=fused.q_weight is not None, K_NORM=fused.k_weight is not None, EARLY=early,
        num_warps=NUM_WARPS,
    )
    return out
