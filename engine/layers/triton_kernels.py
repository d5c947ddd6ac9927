"""Triton kernels for the decoder layers on CUDA, each one of HF's op sequences in a single launch, rounding every
intermediate HF rounds (``_round``), so only the order of a sum of squares differs from HF.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rotary import RotaryEmbedding
from .triton_pdl import pdl_on, pdl_release, pdl_wait


@triton.jit
def _round(x, dt: tl.constexpr):
    """float32 x rounded to dt and widened back; bfloat16 on the bits, as a cast pair could be fused into an FMA."""
    if dt == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dt).to(tl.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, sum_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_s, stride_o, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl_release(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dt = x.dtype
    h = x.to(tl.float32)
    if HAS_RESIDUAL:  # HF rounds the sum and keeps it as the next residual
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        h = _round(h + r.to(tl.float32), dt)
        tl.store(sum_ptr + row * stride_s + cols, h.to(dt), mask=mask)
    inv_rms = tl.math.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    normed = _round(h * inv_rms, dt)  # HF casts back before the weight multiply
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, (w.to(tl.float32) * normed).to(dt), mask=mask)


@triton.jit
def _rope_factors(pos, cos_ptr, sin_ptr, w_ptr, stride_table, HAS_NORM: tl.constexpr, HALF: tl.constexpr):
    """What _norm_rope_rows multiplies by, loaded apart so a kernel can load it before its PDL wait (weights and
    tables): the norm weight's halves (unread without a norm) and the cos/sin rows at pos, float32 [1, HALF] each."""
    offs = tl.arange(0, HALF)[None, :]
    if HAS_NORM:
        w1 = tl.load(w_ptr + offs).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)
    else:
        w1 = tl.full([1, HALF], 1.0, tl.float32)
        w2 = w1
    # The tables come already in the model dtype: a cast here gets folded away.
    c1 = tl.load(cos_ptr + pos * stride_table + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * stride_table + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * stride_table + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * stride_table + HALF + offs).to(tl.float32)
    return w1, w2, c1, c2, s1, s2


@triton.jit
def _norm_rope_rows(src, rows_mask, w1, w2, c1, c2, s1, s2, eps, HAS_NORM: tl.constexpr, HALF: tl.constexpr):
    """Head rows at src ([R, 1] pointers; masked rows give zeros), normed (HAS_NORM) and rotated by _rope_factors'
    values: their two halves [R, HALF], in the rows' dtype."""
    offs = tl.arange(0, HALF)[None, :]
    x1 = tl.load(src + offs, mask=rows_mask, other=0.0)
    x2 = tl.load(src + HALF + offs, mask=rows_mask, other=0.0)
    dt = x1.dtype
    if HAS_NORM:
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        inv_rms = tl.math.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / (2 * HALF) + eps)[:, None]
        x1 = _round(w1 * _round(a * inv_rms, dt), dt)
        x2 = _round(w2 * _round(b * inv_rms, dt), dt)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    o1 = (_round(f1 * c1, dt) + _round(-f2 * s1, dt)).to(dt)
    o2 = (_round(f2 * c2, dt) + _round(f1 * s2, dt)).to(dt)
    return o1, o2


@triton.jit
def _norm_rope_row(src, pos, cos_ptr, sin_ptr, w_ptr, stride_table, eps, HAS_NORM: tl.constexpr, HALF: tl.constexpr):
    """One head's row at src, normed (HAS_NORM) and rotated to pos: its two halves, [HALF] each."""
    one = tl.full([1, 1], 0, tl.int32)
    w1, w2, c1, c2, s1, s2 = _rope_factors(pos, cos_ptr, sin_ptr, w_ptr, stride_table, HAS_NORM, HALF)
    o1, o2 = _norm_rope_rows(src + one, one == 0, w1, w2, c1, c2, s1, s2, eps, HAS_NORM, HALF)
    return tl.reshape(o1, [HALF]), tl.reshape(o2, [HALF])


@triton.jit
def _norm_rope_kernel(
    x_ptr, out_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, stride_xt, stride_xh, stride_ot, stride_oh, stride_table, eps,
    HAS_NORM: tl.constexpr, HALF: tl.constexpr, PDL: tl.constexpr,
):
    pdl_release(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    head = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    o1, o2 = _norm_rope_row(
        x_ptr + t * stride_xt + head * stride_xh, pos, cos_ptr, sin_ptr, w_ptr, stride_table, eps, HAS_NORM, HALF
    )
    offs = tl.arange(0, HALF)
    dst = out_ptr + t * stride_ot + head * stride_oh
    tl.store(dst + offs, o1)
    tl.store(dst + HALF + offs, o2)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_release(PDL)
    pdl_wait(PDL)
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
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PDL: tl.constexpr,
):
    pdl_release(PDL)
    pdl_wait(PDL)
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
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _norm_warps(n_cols: int) -> int:
    return 4 if n_cols <= 2048 else 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    rows = _rows(x)
    out = torch.empty_like(rows)
    n = rows.shape[1]
    if rows.shape[0]:
        pdl = pdl_on(rows)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, rows, rows, weight, out, rows.stride(0), 0, 0, out.stride(0), n, eps,
            HAS_RESIDUAL=False, BLOCK=triton.next_power_of_2(n), PDL=pdl, launch_pdl=pdl, num_warps=_norm_warps(n),
        )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, res = _rows(x), _rows(residual)
    out, total = torch.empty_like(rows), torch.empty_like(rows)
    n = rows.shape[1]
    if rows.shape[0]:
        pdl = pdl_on(rows)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res, total, weight, out, rows.stride(0), res.stride(0), total.stride(0), out.stride(0), n, eps,
            HAS_RESIDUAL=True, BLOCK=triton.next_power_of_2(n), PDL=pdl, launch_pdl=pdl, num_warps=_norm_warps(n),
        )
    return out.view(x.shape), total.view(x.shape)


def norm_rope(
    x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, weight: torch.Tensor | None, eps: float
) -> torch.Tensor:
    tokens, heads, head_dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=x.device)
    cos, sin = rotary.tables_in(x.dtype)
    if tokens:
        pdl = pdl_on(x)
        _norm_rope_kernel[(tokens, heads)](
            x, out, positions, cos, sin, x if weight is None else weight,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos.stride(0), eps,
            HAS_NORM=weight is not None, HALF=head_dim // 2, PDL=pdl, launch_pdl=pdl, num_warps=1,
        )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows = _rows(x)
    n = rows.shape[1] // 2
    out = torch.empty((rows.shape[0], n), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    if rows.shape[0]:
        pdl = pdl_on(rows)
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(n, block))](
            rows, out, rows.stride(0), out.stride(0), n, BLOCK=block, PDL=pdl, launch_pdl=pdl, num_warps=4
        )
    return out.view(*x.shape[:-1], n)


def store_kv_fits(k_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    heads = k.shape[1]
    return not heads & (heads - 1) and k.stride(-1) == 1 and v.stride(-1) == 1 and k_slots.is_contiguous()


def store_kv(
    k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor
) -> None:
    tokens, heads, head_dim = k.shape
    if tokens:
        pdl = pdl_on(k)
        _store_kv_kernel[(tokens,)](
            k, v, k_slots, v_slots, loc, k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_slots.stride(0),
            HEADS=heads, HEAD_DIM=head_dim, PDL=pdl, launch_pdl=pdl, num_warps=4,
        )


@triton.jit
def _norm_rope_store_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, k_cache_ptr, v_cache_ptr, loc_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_ks, stride_kh_slot, stride_vs, stride_vh_slot, stride_table, q_eps, k_eps, q_heads,
    Q_NORM: tl.constexpr, K_NORM: tl.constexpr, HALF: tl.constexpr, PDL: tl.constexpr,
):
    """Program (t, h): q head h of token t normed and rotated into out; past the q heads, k head h - q_heads normed
    and rotated, and its v head, stored at slot loc[t]."""
    pdl_release(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0)
    head = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    offs = tl.arange(0, HALF)
    if head < q_heads:
        o1, o2 = _norm_rope_row(
            q_ptr + t * stride_qt + head * stride_qh, pos, cos_ptr, sin_ptr, qw_ptr, stride_table, q_eps, Q_NORM, HALF
        )
        dst = out_ptr + t * stride_ot + head * stride_oh
        tl.store(dst + offs, o1)
        tl.store(dst + HALF + offs, o2)
    else:
        kv = head - q_heads
        slot = tl.load(loc_ptr + t).to(tl.int64)  # slot * stride passes 2**31 elements in large pools
        o1, o2 = _norm_rope_row(
            k_ptr + t * stride_kt + kv * stride_kh, pos, cos_ptr, sin_ptr, kw_ptr, stride_table, k_eps, K_NORM, HALF
        )
        k_dst = k_cache_ptr + slot * stride_ks + kv * stride_kh_slot
        tl.store(k_dst + offs, o1.to(k_cache_ptr.dtype.element_ty))
        tl.store(k_dst + HALF + offs, o2.to(k_cache_ptr.dtype.element_ty))
        dims = tl.arange(0, 2 * HALF)
        v = tl.load(v_ptr + t * stride_vt + kv * stride_vh + dims)
        tl.store(v_cache_ptr + slot * stride_vs + kv * stride_vh_slot + dims, v.to(v_cache_ptr.dtype.element_ty))


def norm_rope_store_fits(q: torch.Tensor, k: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor) -> bool:
    return q.dtype == k.dtype and k_slots.stride(-1) == 1 and v_slots.stride(-1) == 1


def norm_rope_store(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding,
    q_weight: torch.Tensor | None, q_eps: float, k_weight: torch.Tensor | None, k_eps: float,
    k_slots: torch.Tensor, v_slots: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    """norm_rope of q and of k and store_kv of the rotated k and v, in one launch of tokens x (q + kv heads)."""
    tokens, q_heads, head_dim = q.shape
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty((tokens, q_heads, head_dim), dtype=q.dtype, device=q.device)
    cos, sin = rotary.tables_in(q.dtype)
    if tokens:
        pdl = pdl_on(q)
        _norm_rope_store_kernel[(tokens, q_heads + k.shape[1])](
            q, k, v, out, k_slots, v_slots, loc, positions, cos, sin,
            q if q_weight is None else q_weight, k if k_weight is None else k_weight,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
            out.stride(1), k_slots.stride(0), k_slots.stride(1), v_slots.stride(0), v_slots.stride(1), cos.stride(0),
            q_eps, k_eps, q_heads, Q_NORM=q_weight is not None, K_NORM=k_weight is not None, HALF=head_dim // 2,
            PDL=pdl, launch_pdl=pdl, num_warps=1,
        )
    return out
