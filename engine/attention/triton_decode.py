"""Paged decode attention in Triton through the token-granular page table: rows, lengths and the split-KV split are
read on the device, so a graph replays it with no host planning. The products are dots of a kv head's query rows
(padded to a dot's 16) with 64-token tiles; for 16-bit K/V they run on tensor cores, the probabilities rounded to
V's dtype as FlashInfer does (`tensor_core_products`), else in float32; the rest is float32, the output rounded
once. One launch, under programmatic dependent launch: the last split of a (request, kv head) to finish merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layers.triton_pdl import interpreted, pdl_on, pdl_release, pdl_wait

MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 64
NUM_WARPS = 4  # with block_n's tiles, the fastest B 1 configuration measured (RESULTS.md, eighth part)


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, rows_ptr, lens_ptr, out_ptr, lse_ptr, stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kh, stride_vs, stride_vh, stride_table, scale, merged_ptr, arrivals_ptr,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, S_PAD: tl.constexpr, PDL: tl.constexpr, TC: tl.constexpr,
):
    """One (request, kv head, split): all GROUP query heads over the split's tokens; SPLIT: the last split of a
    (request, kv head) to finish merges them all."""
    pdl_release(PDL)
    pdl_wait(PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * GROUP
    num_splits = tl.num_programs(2)
    row = tl.load(rows_ptr + b).to(tl.int64)
    seq_len = tl.load(lens_ptr + b).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd,
                mask=g_mask[:, None], other=0.0)
    if not TC:
        q = q.to(tl.float32)
    # Finite, so an all-masked row gives exp(-inf) = 0, never NaN.
    m = tl.full([G_PAD], -1.0e30, tl.float32)
    total = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], tl.float32)
    k_base = k_ptr + kv_head * stride_kh
    v_base = v_ptr + kv_head * stride_vh
    start = lo
    while start < hi:  # not `for ... in range`: the interpreter can't take loaded values as bounds (numpy 2.4)
        tokens = start + tl.arange(0, BLOCK_N)
        t_mask = tokens < hi
        slots = tl.load(table_ptr + row * stride_table + tokens, mask=t_mask, other=0).to(tl.int64)
        k = tl.load(k_base + slots[:, None] * stride_ks + d[None, :], mask=t_mask[:, None], other=0.0)
        v = tl.load(v_base + slots[:, None] * stride_vs + d[None, :], mask=t_mask[:, None], other=0.0)
        if TC:  # exact 16-bit products, summed in float32
            s = tl.dot(q, tl.trans(k)) * scale
        else:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if TC:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m = m_new
        start += BLOCK_N

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


def paged_decode(
    q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, page_table: torch.Tensor,
    table_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float, num_splits: int,
    arrivals: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * scale) v, q [bs, Hq, D], over the first seq_lens[i] slots of row table_rows[i] → [bs, Hq, D].
    arrivals: int32 zeros, at least bs * Hkv, that the split merge counts on and leaves zero (None: made here)."""
    bs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_slots.shape[1]
    assert num_q_heads % num_kv_heads == 0 and num_splits >= 1
    assert k_slots.stride(2) == 1 and v_slots.stride(2) == 1 and page_table.stride(1) == 1
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
    pdl = pdl_on(q)
    _decode_kernel[(bs, num_kv_heads, num_splits)](
        q, k_slots, v_slots, page_table, table_rows, seq_lens, parts, lse, q.stride(0), q.stride(1), q.stride(2),
        k_slots.stride(0), k_slots.stride(1), v_slots.stride(0), v_slots.stride(1), page_table.stride(0), scale,
        out, out if arrivals is None else arrivals, GROUP=group, G_PAD=g_pad, HEAD_DIM=head_dim, BLOCK_N=tokens,
        SPLIT=num_splits > 1, S_PAD=triton.next_power_of_2(num_splits), PDL=pdl, launch_pdl=pdl,
        TC=tensor_core_products(q, k_slots), num_warps=NUM_WARPS,
    )
    return out
