"""Triton kernels of the decode step on CUDA: the input ids (StepKernels.input_ids states the rule), the slot checks
and their redirect (engine/step/slots.py states the rule), a captured step's greedy tokens (engine/sample.py's
rule) with what the engine keeps of them, what it keeps of a sampled step's tokens (StepKernels.keep_tokens), and a
replay's hand-out (StepKernels.hand_out) in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .slots import SlotQuery

SLOT_BLOCK = 256
IDS_BLOCK = 1024


@triton.jit
def _input_ids_kernel(
    ids_ptr, pending_ptr, rows_ptr, token_req_ptr, last_ptr, out_ptr, n, ALL: tl.constexpr, SOME: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """A block of tokens: the packed id, or its request's last token where the token is pending."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = t < n
    if ALL:
        ids = tl.load(last_ptr + tl.load(rows_ptr + t, mask=ok, other=0), mask=ok, other=0)
    else:
        ids = tl.load(ids_ptr + t, mask=ok, other=0).to(tl.int32)
        if SOME:
            pending = ok & (tl.load(pending_ptr + t, mask=ok, other=0) != 0)
            row = tl.load(rows_ptr + tl.load(token_req_ptr + t, mask=pending, other=0), mask=pending, other=0)
            ids = tl.where(pending, tl.load(last_ptr + row, mask=pending, other=0), ids)
    tl.store(out_ptr + t, ids, mask=ok)


def input_ids(
    ids: torch.Tensor, pending: torch.Tensor, rows: torch.Tensor, token_req: torch.Tensor, last_tokens: torch.Tensor,
    kind: str,
) -> torch.Tensor:
    """StepKernels.input_ids in one launch."""
    n = len(rows) if kind == "all" else len(ids)
    out = torch.empty(n, dtype=torch.int32, device=ids.device)
    if n:
        _input_ids_kernel[(triton.cdiv(n, IDS_BLOCK),)](
            ids, pending, rows, token_req, last_tokens, out, n, ALL=kind == "all", SOME=kind == "some",
            BLOCK=IDS_BLOCK,
        )
    return out


@triton.jit
def _checked_row(i, n_batch, rows_ptr, cached_ptr, len_ptr, others_ptr, other_lens_ptr):
    """Row i of a slot check's grid (the batch's rows, then the live rows): its page-table row, length and cached
    length."""
    if i < n_batch:
        row = tl.load(rows_ptr + i)
        length = tl.load(len_ptr + i)
        cached = tl.load(cached_ptr + i)
    else:  # a live row's slots all count as cached
        row = tl.load(others_ptr + tl.maximum(i - n_batch, 0))
        length = tl.load(other_lens_ptr + tl.maximum(i - n_batch, 0))
        cached = length
    return row, length, cached


@triton.jit
def _read_slots(table_ptr, stride_row, row, j, used, num_slots, PS: tl.constexpr):
    """The row's slots at columns j (where used), whether each lies in the pool, and whether each breaks the read
    rule (outside the pool or, with pages, off its position's offset of its block's page)."""
    slot = tl.load(table_ptr + row * stride_row + j, mask=used, other=0)
    in_pool = (slot >= 0) & (slot < num_slots)
    bad = used & ~in_pool
    if PS > 1:
        first = tl.load(table_ptr + row * stride_row + (j // PS) * PS, mask=used, other=0)
        bad = bad | (used & ((slot % PS != j % PS) | (slot // PS != first // PS)))
    return slot, in_pool, bad


@triton.jit
def _slot_mark_kernel(
    table_ptr, stride_row, rows_ptr, cached_ptr, len_ptr, starts_ptr, others_ptr, other_lens_ptr, n_batch, hits_ptr,
    flag_ptr, out_ptr, num_slots, PS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Row i (batch rows, then live rows), a block of columns: flag bad read slots, mark cached 2, written +1."""
    i = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    batch = i < n_batch
    row, length, cached = _checked_row(i, n_batch, rows_ptr, cached_ptr, len_ptr, others_ptr, other_lens_ptr)
    used = j < length
    slot, in_pool, bad = _read_slots(table_ptr, stride_row, row, j, used, num_slots, PS)
    tl.atomic_max(flag_ptr, tl.max((bad & batch).to(tl.int32), axis=0))
    tl.store(hits_ptr + slot, 2, mask=used & in_pool & (j < cached))
    written = used & (j >= cached) & batch
    tl.atomic_add(hits_ptr + slot, 1, mask=written & in_pool)
    tl.store(out_ptr + tl.load(starts_ptr + tl.minimum(i, n_batch - 1)) + j - cached, slot, mask=written)


@triton.jit
def _slot_count_kernel(
    table_ptr, stride_row, rows_ptr, cached_ptr, len_ptr, hits_ptr, flag_ptr, num_slots, BLOCK: tl.constexpr
):
    """Flag a written slot counted more than once."""
    i = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + i)
    written = (j < tl.load(len_ptr + i)) & (j >= tl.load(cached_ptr + i))
    slot = tl.load(table_ptr + row * stride_row + j, mask=written, other=-1)
    written = written & (slot >= 0) & (slot < num_slots)
    hits = tl.load(hits_ptr + slot, mask=written, other=0)
    tl.atomic_max(flag_ptr, tl.max((hits > 1).to(tl.int32), axis=0))


@triton.jit
def _slot_one_each_kernel(
    table_ptr, stride_row, rows_ptr, cached_ptr, len_ptr, others_ptr, other_lens_ptr, n_batch, flag_ptr, out_ptr,
    num_slots, PS: tl.constexpr, BLOCK: tl.constexpr, N_PAD: tl.constexpr,
):
    """SlotQuery.one_each, up to N_PAD requests: row i (batch rows, then live rows), a block of columns, the rule
    checked against the batch's written slots, gathered here (no hits array to clear): a cached slot that one is
    written to, or a written slot another request writes too, flags the batch."""
    i = tl.program_id(0)
    first_col = tl.program_id(1) * BLOCK
    batch = i < n_batch
    # Every request's newest token, loaded beside the row's own: its row, position and whether it writes one.
    k = tl.arange(0, N_PAD)
    k_valid = k < n_batch
    k_cached = tl.load(cached_ptr + k, mask=k_valid, other=0)
    k_writes = k_valid & (tl.load(len_ptr + k, mask=k_valid, other=0) > k_cached)
    k_row = tl.load(rows_ptr + k, mask=k_valid, other=0)
    row, length, cached = _checked_row(i, n_batch, rows_ptr, cached_ptr, len_ptr, others_ptr, other_lens_ptr)
    if first_col < length:
        j = first_col + tl.arange(0, BLOCK)
        used = j < length
        slot, in_pool, bad = _read_slots(table_ptr, stride_row, row, j, used, num_slots, PS)
        # -1 where a request writes nothing: no slot in the pool equals it.
        k_slot = tl.load(table_ptr + k_row * stride_row + k_cached, mask=k_writes, other=-1)
        bad = bad & batch
        held = used & in_pool & (j < cached)
        written = used & in_pool & (j >= cached) & batch
        tl.store(out_ptr + i + j - cached, slot, mask=used & (j >= cached) & batch)
        same = slot[:, None] == k_slot[None, :]
        clash = same & (held[:, None] | (written[:, None] & (k[None, :] != i)))
        verdict = tl.maximum(tl.max(bad.to(tl.int32), axis=0), tl.max(tl.max(clash.to(tl.int32), axis=1), axis=0))
        if verdict > 0:
            tl.atomic_max(flag_ptr, verdict)


@triton.jit
def _slot_redirect_kernel(
    out_ptr, table_rows_ptr, rows_ptr, len_ptr, flag_ptr, refused_ptr, n_tokens, n_batch, dummy_slot, dummy_row,
    PADDED: tl.constexpr, RESET: tl.constexpr, BLOCK: tl.constexpr,
):
    """After the verdict: a refused batch (and padding) goes to the dummy page and row; program 0 writes the
    verdict. RESET (one program): the flag is cleared for the next check after every read of it."""
    refused = tl.load(flag_ptr) > 0
    if tl.program_id(0) == 0:
        tl.store(refused_ptr, refused)
    start = tl.program_id(0) * BLOCK
    while start < tl.maximum(n_tokens, n_batch):
        k = start + tl.arange(0, BLOCK)
        start += tl.num_programs(0) * BLOCK
        tok = k < n_tokens
        to_dummy = refused
        if PADDED:
            to_dummy = to_dummy | (tl.load(len_ptr + k, mask=tok, other=1) == 0)
        loc = tl.load(out_ptr + k, mask=tok, other=0)
        tl.store(out_ptr + k, tl.where(to_dummy, dummy_slot, loc), mask=tok)
        req = k < n_batch
        rows = tl.load(rows_ptr + k, mask=req, other=0)
        tl.store(table_rows_ptr + k, tl.where(refused, dummy_row, rows), mask=req)
    if RESET:
        tl.debug_barrier()  # every thread has read the flag
        tl.store(flag_ptr, 0)


ONE_EACH_MAX = 32  # every slot against every written one: past this, slower than the hits (RESULTS.md, 16th part)


def slot_check(
    page_table: torch.Tensor, q: SlotQuery, num_slots: int, page_size: int, dummy_row: int, padded: bool,
    flag: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """slots.redirected_slots in two launches (SlotQuery.one_each, up to ONE_EACH_MAX requests), else in three after a
    fill. flag: the caller's int32 zero, zero again when a two-launch check returns."""
    device = page_table.device
    n, m, t = len(q.rows), len(q.others), len(q.positions)
    refused = torch.empty(1, dtype=torch.bool, device=device)
    out_loc = torch.empty(t, dtype=torch.int32, device=device)
    table_rows = torch.empty(n, dtype=torch.int64, device=device)
    blocks = triton.cdiv(max(q.max_len, q.max_other_len), SLOT_BLOCK)
    stride = page_table.stride(0)
    one_each = q.one_each and n <= ONE_EACH_MAX
    if one_each:
        _slot_one_each_kernel[(n + m, blocks)](
            page_table, stride, q.rows, q.cached, q.device_len, q.others, q.other_lens, n, flag, out_loc, num_slots,
            PS=page_size, BLOCK=SLOT_BLOCK, N_PAD=ONE_EACH_MAX,
        )
    else:
        zeroed = torch.zeros(num_slots + 2, dtype=torch.int32, device=device)  # one fill: the hits, then the flag
        hits, flag = zeroed[: num_slots + 1], zeroed[num_slots + 1 :]
        _slot_mark_kernel[(n + m, blocks)](
            page_table, stride, q.rows, q.cached, q.device_len, q.starts, q.others, q.other_lens, n, hits, flag,
            out_loc, num_slots, PS=page_size, BLOCK=SLOT_BLOCK,
        )
        _slot_count_kernel[(n, triton.cdiv(q.max_len, SLOT_BLOCK))](
            page_table, stride, q.rows, q.cached, q.device_len, hits, flag, num_slots, BLOCK=SLOT_BLOCK
        )
    _slot_redirect_kernel[(1 if one_each else triton.cdiv(max(t, n), SLOT_BLOCK),)](
        out_loc, table_rows, q.rows, q.device_len, flag, refused, t, n, num_slots, dummy_row, PADDED=padded,
        RESET=one_each, BLOCK=SLOT_BLOCK,
    )
    return out_loc, table_rows, refused[0]


ARGMAX_BLOCK = 2048
ARGMAX_PROGRAMS = 128  # a small batch splits its rows further, so its few rows still fill the GPU
ARGMAX_SPLITS = 16  # the fewest splits of a row


@triton.jit
def _argmax_part_kernel(logits_ptr, stride_row, vocab, chunk, max_ptr, idx_ptr, nan_ptr, BLOCK: tl.constexpr):
    """Row r, split s: the largest non-NaN logit, its first index, and whether a NaN is in the chunk."""
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
    """Row r: merge the splits into its token, keep it as the row's last token and write the payload."""
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
    tl.store(tokens_ptr + r, token)
    _kept(token, r, last_ptr, rows_ptr, flag_ptr, payload_ptr, bs)


@triton.jit
def _kept(token, r, last_ptr, rows_ptr, flag_ptr, payload_ptr, bs):
    """keep_tokens for batch row r: its token kept as its row's last token (-1 as 0), its payload entries (the
    token, the last token before), and from row 0 the slot check's verdict."""
    row = tl.load(rows_ptr + r)
    before = tl.load(last_ptr + row)
    tl.store(last_ptr + row, tl.maximum(token, 0))
    tl.store(payload_ptr + r, token)
    tl.store(payload_ptr + bs + 1 + r, before)
    if r == 0:
        tl.store(payload_ptr + bs, tl.load(flag_ptr).to(tl.int32))


@triton.jit
def _keep_kernel(tokens_ptr, stride, last_ptr, rows_ptr, flag_ptr, payload_ptr, bs):
    r = tl.program_id(0)
    _kept(tl.load(tokens_ptr + r * stride), r, last_ptr, rows_ptr, flag_ptr, payload_ptr, bs)


def greedy_step(
    logits: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    bs, vocab = logits.shape
    splits = min(max(ARGMAX_SPLITS, ARGMAX_PROGRAMS // bs), triton.cdiv(vocab, ARGMAX_BLOCK))
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


def keep_tokens(
    tokens: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
) -> torch.Tensor:
    """StepKernels.keep_tokens in one launch."""
    bs = tokens.shape[0]
    payload = torch.empty(2 * bs + 1, dtype=torch.int32, device=tokens.device)
    _keep_kernel[(bs,)](tokens, tokens.stride(0), last_tokens, rows, flags, payload, bs)
    return payload


HAND_OUT_BLOCK = 4096
TOKENS_BLOCK = 1024


@triton.jit
def _hand_out_kernel(
    logits_ptr, stride_row, out_ptr, vocab, tokens_ptr, tokens_out_ptr, n, TOKENS: tl.constexpr,
    BLOCK: tl.constexpr, T_BLOCK: tl.constexpr,
):
    """Row r, a block of the vocabulary: the logits upcast; program (0, 0) copies the tokens too."""
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < vocab
    x = tl.load(logits_ptr + r.to(tl.int64) * stride_row + c, mask=ok)
    if logits_ptr.dtype.element_ty == tl.bfloat16:  # by its bits: exact for subnormals whatever flushes them
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    tl.store(out_ptr + r.to(tl.int64) * vocab + c, x.to(tl.float32), mask=ok)
    if TOKENS:
        start = tl.where((r == 0) & (tl.program_id(1) == 0), 0, n)  # program (0, 0) alone
        while start < n:
            t = start + tl.arange(0, T_BLOCK)
            tl.store(tokens_out_ptr + t, tl.load(tokens_ptr + t, mask=t < n), mask=t < n)
            start += T_BLOCK


def hand_out(logits: torch.Tensor, tokens: torch.Tensor | None, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """StepKernels.hand_out in one launch."""
    vocab = logits.shape[1]
    out = torch.empty(n, vocab, dtype=torch.float32, device=logits.device)
    tokens_out = None if tokens is None else torch.empty(n, dtype=tokens.dtype, device=tokens.device)
    if n:
        _hand_out_kernel[(n, triton.cdiv(vocab, HAND_OUT_BLOCK))](
            logits, logits.stride(0), out, vocab, out if tokens is None else tokens,
            out if tokens_out is None else tokens_out, n, TOKENS=tokens is not None, BLOCK=HAND_OUT_BLOCK,
            T_BLOCK=TOKENS_BLOCK,
        )
    return out, tokens_out
