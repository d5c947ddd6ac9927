"""The sampler's full-vocabulary row passes on CUDA (engine/sample_rows.py states what each computes): a row is
cut into fixed chunks of CHUNK tokens, so a row of one request or of sixty-four keeps many programs busy, and a
row's chunks depend on the vocabulary alone: its result is the same bits whatever its batch (the seeded contract).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 4096


@triton.jit
def _chunk_max_sum_kernel(x_ptr, max_ptr, sum_ptr, stride, n, CHUNK: tl.constexpr):
    """Per (row, chunk): the chunk's max and its sum of exp(x - max) (0 for a chunk of -inf only)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    m = tl.max(x, axis=0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    at = row * tl.num_programs(1) + c
    tl.store(max_ptr + at, m)
    tl.store(sum_ptr + at, tl.sum(tl.exp(x - shift), axis=0))


@triton.jit
def _row_max_sum(max_ptr, sum_ptr, row, chunks, C_PAD: tl.constexpr):
    """The row's max and sum of exp(x - max) from its chunks' pairs, combined in one fixed order."""
    c = tl.arange(0, C_PAD)
    ok = c < chunks
    m = tl.load(max_ptr + row * chunks + c, mask=ok, other=float("-inf"))
    s = tl.load(sum_ptr + row * chunks + c, mask=ok, other=0.0)
    top = tl.max(m, axis=0)  # finite: every row has a finite max
    return top, tl.sum(s * tl.exp(m - top), axis=0)  # an empty chunk adds 0 * 0


@triton.jit
def _chunk_softmax(x_ptr, max_ptr, sum_ptr, stride, n, CHUNK: tl.constexpr, C_PAD: tl.constexpr):
    """This program's row, chunk columns, x there and its softmax; and the row's top probability by the same formula."""
    row = tl.program_id(0)
    top, total = _row_max_sum(max_ptr, sum_ptr, row, tl.num_programs(1), C_PAD)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    return row, cols, x, tl.exp(x - top) / total, tl.exp(top - top) / total


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, max_ptr, sum_ptr, stride, out_stride, n, CHUNK: tl.constexpr,
                    C_PAD: tl.constexpr):
    row, cols, _, p, _ = _chunk_softmax(x_ptr, max_ptr, sum_ptr, stride, n, CHUNK, C_PAD)
    tl.store(out_ptr + row * out_stride + cols, p, mask=cols < n)


@triton.jit
def _min_p_mask_kernel(x_ptr, out_ptr, min_p_ptr, max_ptr, sum_ptr, stride, out_stride, n, CHUNK: tl.constexpr,
                       C_PAD: tl.constexpr):
    """x with -inf where its softmax is under min_p x the row's top probability."""
    row, cols, x, p, top_p = _chunk_softmax(x_ptr, max_ptr, sum_ptr, stride, n, CHUNK, C_PAD)
    dropped = p < tl.load(min_p_ptr + row) * top_p
    tl.store(out_ptr + row * out_stride + cols, tl.where(dropped, float("-inf"), x), mask=cols < n)


@triton.jit
def _sorted_weights(v_ptr, kth_ptr, row, stride, n, c, CHUNK: tl.constexpr, HAS_KTH: tl.constexpr):
    """exp(v - the row's last (largest) value) over a chunk of an ascending row; 0 below the row's k-th value."""
    cols = c * CHUNK + tl.arange(0, CHUNK)
    v = tl.load(v_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    top = tl.load(v_ptr + row * stride + n - 1)
    w = tl.exp(v - top)
    if HAS_KTH:
        w = tl.where(v < tl.load(kth_ptr + row), 0.0, w)
    return cols, w


@triton.jit
def _sorted_sum_kernel(v_ptr, kth_ptr, sum_ptr, stride, n, CHUNK: tl.constexpr, HAS_KTH: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    _, w = _sorted_weights(v_ptr, kth_ptr, row, stride, n, c, CHUNK, HAS_KTH)
    tl.store(sum_ptr + row * tl.num_programs(1) + c, tl.sum(w, axis=0))


@triton.jit
def _top_p_count_kernel(v_ptr, kth_ptr, sum_ptr, cut_ptr, count_ptr, stride, n, CHUNK: tl.constexpr,
                        C_PAD: tl.constexpr, HAS_KTH: tl.constexpr):
    """Per (row, chunk): how many of the chunk's tokens, all but the row's last, have a cumulative mass <= the cut."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    k = tl.arange(0, C_PAD)
    sums = tl.load(sum_ptr + row * chunks + k, mask=k < chunks, other=0.0)
    total = tl.sum(sums, axis=0)
    before = tl.sum(tl.where(k < c, sums, 0.0), axis=0)
    cols, w = _sorted_weights(v_ptr, kth_ptr, row, stride, n, c, CHUNK, HAS_KTH)
    cumulative = (before + tl.cumsum(w, axis=0)) / total
    removed = (cumulative <= tl.load(cut_ptr + row)) & (cols < n - 1)
    tl.store(count_ptr + row * chunks + c, tl.sum(removed.to(tl.int32), axis=0))


@triton.jit
def _keep_from_kernel(x_ptr, out_ptr, value_ptr, index_ptr, stride, out_stride, n, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=0.0)
    value = tl.load(value_ptr + row)
    kept = (x > value) | ((x == value) & (cols >= tl.load(index_ptr + row)))
    tl.store(out_ptr + row * out_stride + cols, tl.where(kept, x, float("-inf")), mask=cols < n)


@triton.jit
def _tempered_stats_kernel(x_ptr, t_ptr, max_ptr, sum_ptr, arg_ptr, nan_ptr, stride, n, CHUNK: tl.constexpr):
    """Per (row, chunk) of x / t: the max, its first index, the sum of exp(. - max), and whether x holds a NaN."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    s = tl.math.div_rn(x, tl.load(t_ptr + row))  # IEEE division, as torch's: Triton's / is approximate
    m = tl.max(s, axis=0)
    shift = tl.where(tl.abs(m) < float("inf"), m, 0.0)
    at = row * tl.num_programs(1) + c
    tl.store(max_ptr + at, m)
    tl.store(arg_ptr + at, c * CHUNK + tl.argmax(s, axis=0, tie_break_left=True))
    tl.store(sum_ptr + at, tl.sum(tl.exp(s - shift), axis=0))
    tl.store(nan_ptr + at, tl.max((x != x).to(tl.int32), axis=0))


@triton.jit
def _tempered_softmax_kernel(x_ptr, t_ptr, out_ptr, max_ptr, sum_ptr, arg_ptr, nan_ptr, argmax_ptr, finite_ptr,
                             stride, out_stride, n, CHUNK: tl.constexpr, C_PAD: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    k = tl.arange(0, C_PAD)
    ok = k < chunks
    m = tl.load(max_ptr + row * chunks + k, mask=ok, other=float("-inf"))
    top = tl.max(m, axis=0)
    finite = (tl.abs(top) < float("inf")) & (tl.max(tl.load(nan_ptr + row * chunks + k, mask=ok, other=0), axis=0) == 0)
    shift = tl.where(finite, top, 0.0)
    total = tl.sum(tl.load(sum_ptr + row * chunks + k, mask=ok, other=0.0) * tl.exp(m - shift), axis=0)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < n, other=float("-inf"))
    p = tl.exp(tl.math.div_rn(x, tl.load(t_ptr + row)) - shift) / total
    p = tl.where(finite, p, tl.where(cols == 0, 1.0, 0.0))
    tl.store(out_ptr + row * out_stride + cols, p, mask=cols < n)
    if c == 0:  # the first chunk holding the row's max has its first index
        first = tl.min(tl.where(ok & (m == top), k, C_PAD), axis=0)
        arg = tl.load(arg_ptr + row * chunks + first, mask=first < chunks, other=0)
        tl.store(argmax_ptr + row, arg.to(tl.int32))
        tl.store(finite_ptr + row, finite)


@triton.jit
def _min_p_sum_kernel(p_ptr, min_p_ptr, top_ptr, sum_ptr, stride, n, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    p = tl.load(p_ptr + row * stride + cols, mask=cols < n, other=0.0)
    kept = p >= tl.load(min_p_ptr + row) * tl.load(top_ptr + row)
    tl.store(sum_ptr + row * tl.num_programs(1) + c, tl.sum(tl.where(kept, p, 0.0), axis=0))


@triton.jit
def _min_p_write_kernel(p_ptr, min_p_ptr, top_ptr, sum_ptr, out_ptr, mass_ptr, stride, out_stride, n,
                        CHUNK: tl.constexpr, C_PAD: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    chunks = tl.num_programs(1)
    k = tl.arange(0, C_PAD)
    mass = tl.sum(tl.load(sum_ptr + row * chunks + k, mask=k < chunks, other=0.0), axis=0)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    p = tl.load(p_ptr + row * stride + cols, mask=cols < n, other=0.0)
    kept = p >= tl.load(min_p_ptr + row) * tl.load(top_ptr + row)
    tl.store(out_ptr + row * out_stride + cols, tl.math.div_rn(tl.where(kept, p, 0.0), mass), mask=cols < n)
    if c == 0:
        tl.store(mass_ptr + row, mass)


def _grid(x: torch.Tensor) -> tuple[int, int]:
    """(rows, chunks) of a float32 [bs, vocab] tensor with unit column stride, the layout every pass reads."""
    assert x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1
    return x.shape[0], triton.cdiv(x.shape[1], CHUNK)


def _chunk_stats(x: torch.Tensor) -> tuple[tuple[int, int], torch.Tensor, torch.Tensor]:
    """The grid, and each (row, chunk)'s max and sum of exp(x - max)."""
    grid = _grid(x)
    maxes = torch.empty(grid, dtype=torch.float32, device=x.device)
    sums = torch.empty_like(maxes)
    _chunk_max_sum_kernel[grid](x, maxes, sums, x.stride(0), x.shape[1], CHUNK=CHUNK)
    return grid, maxes, sums


def softmax(x: torch.Tensor) -> torch.Tensor:
    grid, maxes, sums = _chunk_stats(x)
    out = torch.empty_like(x)
    _softmax_kernel[grid](x, out, maxes, sums, x.stride(0), out.stride(0), x.shape[1], CHUNK=CHUNK,
                          C_PAD=triton.next_power_of_2(grid[1]))
    return out


def top_p_removed(values: torch.Tensor, kth: torch.Tensor | None, cut: torch.Tensor) -> torch.Tensor:
    grid = _grid(values)
    sums = torch.empty(grid, dtype=torch.float32, device=values.device)
    counts = torch.empty(grid, dtype=torch.int32, device=values.device)
    kth_arg = values if kth is None else kth.contiguous()
    _sorted_sum_kernel[grid](values, kth_arg, sums, values.stride(0), values.shape[1], CHUNK=CHUNK,
                             HAS_KTH=kth is not None)
    _top_p_count_kernel[grid](values, kth_arg, sums, cut.contiguous(), counts, values.stride(0), values.shape[1],
                              CHUNK=CHUNK, C_PAD=triton.next_power_of_2(grid[1]), HAS_KTH=kth is not None)
    return counts.sum(dim=1)


def keep_from(scores: torch.Tensor, value: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(scores)
    _keep_from_kernel[_grid(scores)](scores, out, value.contiguous(), index.contiguous(), scores.stride(0),
                                     out.stride(0), scores.shape[1], CHUNK=CHUNK)
    return out


def tempered_softmax(
    logits: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grid = _grid(logits)
    maxes = torch.empty(grid, dtype=torch.float32, device=logits.device)
    sums = torch.empty_like(maxes)
    args = torch.empty(grid, dtype=torch.int64, device=logits.device)
    nans = torch.empty(grid, dtype=torch.int32, device=logits.device)
    probs = torch.empty_like(logits)
    argmax = torch.empty(grid[0], dtype=torch.int32, device=logits.device)
    finite = torch.empty(grid[0], dtype=torch.bool, device=logits.device)
    t = temperature.contiguous()
    _tempered_stats_kernel[grid](logits, t, maxes, sums, args, nans, logits.stride(0), logits.shape[1], CHUNK=CHUNK)
    _tempered_softmax_kernel[grid](logits, t, probs, maxes, sums, args, nans, argmax, finite, logits.stride(0),
                                   probs.stride(0), logits.shape[1], CHUNK=CHUNK,
                                   C_PAD=triton.next_power_of_2(grid[1]))
    return probs, argmax, finite


def min_p_renorm(probs: torch.Tensor, min_p: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grid = _grid(probs)
    sums = torch.empty(grid, dtype=torch.float32, device=probs.device)
    out = torch.empty_like(probs)
    mass = torch.empty(grid[0], dtype=torch.float32, device=probs.device)
    min_p, top = min_p.contiguous(), top.contiguous()
    _min_p_sum_kernel[grid](probs, min_p, top, sums, probs.stride(0), probs.shape[1], CHUNK=CHUNK)
    _min_p_write_kernel[grid](probs, min_p, top, sums, out, mass, probs.stride(0), out.stride(0), probs.shape[1],
                              CHUNK=CHUNK, C_PAD=triton.next_power_of_2(grid[1]))
    return out, mass


def min_p_mask(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    grid, maxes, sums = _chunk_stats(scores)
    out = torch.empty_like(scores)
    _min_p_mask_kernel[grid](scores, out, min_p.contiguous(), maxes, sums, scores.stride(0), out.stride(0),
                             scores.shape[1], CHUNK=CHUNK, C_PAD=triton.next_power_of_2(grid[1]))
    return out
