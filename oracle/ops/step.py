"""Op-level checks of the decode step's kernels (StepKernels): the input ids, the greedy step (argmax, the rows' last
tokens, the host payload), a sampled step's keep (the same last tokens and payload), a replay's hand-out and the slot
checks with their redirect. Every contract is exact: integers, compared bitwise with the harness's own statement of the
rules (not the engine's torch reference, so a bug there shows too)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from engine.step.slots import SlotQuery
from engine.validate import Limits

from ..strategies import seeds
from . import references as ref
from .bench import Bench
from .compare import assert_bitwise, describe
from .guard import Guarded, assert_untouched, guarded
from .strategies import BLOCK_EDGES, edge_sizes, gaps, random_tensor, seq_lengths

ROW_KINDS = ("plain", "tie", "last", "nan", "posinf", "all_neginf", "some_neginf", "subnormal")
# The Triton argmax splits a row into 2048-wide chunks, up to 128 programs a batch, 16 chunks a row at least.
ARGMAX_EDGES = (*BLOCK_EDGES, 32768, 65536)


ID_KINDS = ("all", "some", "some", "none")
ID_EDGES = (1024, 2048)  # the Triton kernel's blocks of tokens
ID_RANGES = (50, 151936, 2**31 - 1)  # vocabularies: the last puts ids at int32's top


@dataclass(frozen=True)
class InputIdsCase:
    ids: torch.Tensor  # int64 [tokens]: the packed ids
    pending: torch.Tensor  # int64 [tokens] (kind 'some') or [0]: nonzero where the id comes from last_tokens
    rows: torch.Tensor  # int64 [requests]
    token_req: torch.Tensor  # int64 [tokens], nondecreasing: each token's request
    last_tokens: torch.Tensor  # int32 [max_rows + 1]
    kind: str


@st.composite
def input_ids_cases(draw: st.DrawFn) -> InputIdsCase:
    """Tokens each side of the kernel's blocks; kind 'all' one token per request (a decode batch), else requests of
    several tokens with any tokens pending; rows repeat, as padding rows repeat the dummy row."""
    kind = draw(st.sampled_from(ID_KINDS))
    tokens = draw(edge_sizes(ID_EDGES, 1, 2100))
    gen = torch.Generator().manual_seed(draw(seeds))
    requests = tokens if kind == "all" else draw(st.integers(1, min(tokens, 40)))
    cuts = torch.randperm(tokens - 1, generator=gen)[: requests - 1] + 1
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), cuts.sort().values])
    token_req = torch.zeros(tokens, dtype=torch.int64)
    token_req[starts[1:]] = 1
    token_req = token_req.cumsum(0)
    max_rows = draw(st.integers(requests - 1, 3000))  # an engine has a row for each request of a batch
    vocab = draw(st.sampled_from(ID_RANGES))
    share = draw(st.sampled_from((0.1, 0.5, 0.0, 0.1, 0.5, 1.0)))  # mostly a mix of pending and packed
    pending = torch.zeros(0, dtype=torch.int64)
    if kind == "some":
        pending = (torch.rand(tokens, generator=gen) < share).long()
    return InputIdsCase(
        torch.randint(0, vocab, (tokens,), generator=gen), pending,
        torch.randint(0, max_rows + 1, (requests,), generator=gen), token_req,
        torch.randint(0, vocab, (max_rows + 1,), generator=gen, dtype=torch.int32), kind,
    )


def expected_ids(case: InputIdsCase) -> torch.Tensor:
    """int32 [tokens] by the rule, token by token: a pending token's id is its request's row's last token."""
    rows, last, n = case.rows.tolist(), case.last_tokens.tolist(), len(case.ids)
    pending = [bool(p) for p in case.pending.tolist()] if case.kind == "some" else [case.kind == "all"] * n
    out = [last[rows[r]] if p else i for i, r, p in zip(case.ids.tolist(), case.token_req.tolist(), pending)]
    return torch.tensor(out, dtype=torch.int32)


def check_input_ids(bench: Bench, case: InputIdsCase) -> None:
    dev = bench.device
    ins = [guarded(name, t.to(dev)) for name, t in (("ids", case.ids), ("pending", case.pending), ("rows", case.rows),
                                                     ("token_req", case.token_req), ("last_tokens", case.last_tokens))]
    call = describe({g.name: g.view for g in ins}, kind=case.kind)
    out = bench.run_step_kernel("input_ids", "input_ids", *(g.view for g in ins), case.kind)
    assert isinstance(out, torch.Tensor)
    assert_bitwise("input_ids", call, "ids", out, expected_ids(case))
    assert_untouched("input_ids", ins)


@dataclass(frozen=True)
class GreedyCase:
    logits: torch.Tensor  # float32 or bfloat16 (a captured step's) [bs, vocab]
    last_tokens: torch.Tensor  # int32 [max_rows + 1]
    rows: torch.Tensor  # int64 [bs], distinct
    refused: bool
    kinds: tuple[str, ...]
    gap: int


@st.composite
def greedy_cases(draw: st.DrawFn) -> GreedyCase:
    bs = draw(edge_sizes((8,), 1, 9))
    vocab = draw(edge_sizes(ARGMAX_EDGES, 2, 70000))
    max_rows = draw(st.integers(bs, bs + 8))
    seed = draw(seeds)
    dtype = draw(st.sampled_from((torch.float32, torch.bfloat16)))
    logits = random_tensor((bs, vocab), torch.float32, draw(st.sampled_from((1.0, 30.0, 1e30))), seed)
    gen = torch.Generator().manual_seed(seed)
    kinds = tuple(draw(st.sampled_from(ROW_KINDS)) for _ in range(bs))
    for row, kind in zip(logits, kinds):
        spot = int(torch.randint(vocab, (1,), generator=gen))
        if kind == "tie":  # the max again at another index: the first must win
            row[spot] = row.max()
        elif kind == "last":
            row[-1] = row.max() + 1
        elif kind in ("nan", "posinf"):
            row[spot] = float("nan") if kind == "nan" else float("inf")
        elif kind == "all_neginf":
            row.fill_(float("-inf"))
        elif kind == "some_neginf":
            row[torch.rand(vocab, generator=gen) < 0.5] = float("-inf")
        elif kind == "subnormal":
            row.mul_(1e-39)
    rows = draw(st.lists(st.integers(0, max_rows), min_size=bs, max_size=bs, unique=True))
    last = torch.randint(0, vocab, (max_rows + 1,), generator=gen, dtype=torch.int32)
    return GreedyCase(logits.to(dtype), last, torch.tensor(rows), draw(st.booleans()), kinds, draw(gaps))


def check_greedy_step(bench: Bench, case: GreedyCase) -> None:
    dev = bench.device
    logits = guarded("logits", case.logits.to(dev), case.gap)
    last, rows, flags = _keep_inputs(dev, case.last_tokens, case.rows, case.refused)
    call = describe({"logits": logits.view, "last_tokens": last.view, "rows": rows.view}, kinds=case.kinds)
    out = bench.run_step_kernel("greedy_step", "greedy_step", logits.view, last.view, rows.view, flags.view)
    assert isinstance(out, tuple)
    tokens, payload = out
    want = ref.first_argmax(case.logits)
    assert_bitwise("greedy_step", call, "tokens", tokens, want)
    _assert_kept("greedy_step", call, want, case.last_tokens, case.rows, case.refused, last, payload)
    assert_untouched("greedy_step", [logits, rows, flags], outputs=(last,))


def _keep_inputs(
    dev: torch.device, last_tokens: torch.Tensor, rows: torch.Tensor, refused: bool
) -> tuple[Guarded, Guarded, Guarded]:
    """A step end's last tokens (written in place), rows and slot-check flag, guarded on the bench's device."""
    flags = torch.tensor([refused], device=dev)
    return guarded("last_tokens", last_tokens.to(dev)), guarded("rows", rows.to(dev)), guarded("flags", flags)


def _assert_kept(
    op: str, call: str, tokens: torch.Tensor, last_before: torch.Tensor, rows: torch.Tensor, refused: bool,
    last: Guarded, payload: torch.Tensor,
) -> None:
    """What a step keeps of its tokens: each row's token as its last token (-1 as 0), the rest untouched, and the host
    payload (the tokens, the slot check's verdict, the rows' last tokens before)."""
    want_last = last_before.clone()
    want_last[rows] = tokens.clamp(min=0)
    want_payload = torch.cat([tokens, torch.tensor([int(refused)], dtype=torch.int32), last_before[rows]])
    assert_bitwise(op, call, "last_tokens (kept tokens; other rows untouched)", last.view, want_last)
    assert_bitwise(op, call, "payload (tokens, verdict, last tokens before)", payload, want_payload)


@dataclass(frozen=True)
class KeepCase:
    tokens: torch.Tensor  # int32 [bs], -1 where a row had nothing to sample
    last_tokens: torch.Tensor  # int32 [max_rows + 1]
    rows: torch.Tensor  # int64 [bs], distinct
    refused: bool
    tokens_gap: int  # a sampler plugin's tokens may be a strided view


@st.composite
def keep_cases(draw: st.DrawFn) -> KeepCase:
    bs = draw(edge_sizes((8,), 1, 9))
    max_rows = draw(st.integers(bs, bs + 8))
    gen = torch.Generator().manual_seed(draw(seeds))
    tokens = torch.randint(0, draw(st.sampled_from(ID_RANGES)), (bs,), generator=gen, dtype=torch.int32)
    tokens[draw(st.lists(st.integers(0, bs - 1), max_size=2))] = -1
    rows = draw(st.lists(st.integers(0, max_rows), min_size=bs, max_size=bs, unique=True))
    last = torch.randint(0, 2**31 - 1, (max_rows + 1,), generator=gen, dtype=torch.int32)
    return KeepCase(tokens, last, torch.tensor(rows), draw(st.booleans()), draw(st.sampled_from((0, 2, 2))))


def check_keep_tokens(bench: Bench, case: KeepCase) -> None:
    """A sampled step's end: its tokens kept and the payload written, as the greedy step's end does."""
    dev = bench.device
    tokens = guarded("tokens", case.tokens.to(dev), case.tokens_gap)
    last, rows, flags = _keep_inputs(dev, case.last_tokens, case.rows, case.refused)
    call = describe({"tokens": tokens.view, "last_tokens": last.view, "rows": rows.view}, refused=case.refused)
    payload = bench.run_step_kernel("keep_tokens", "keep_tokens", tokens.view, last.view, rows.view, flags.view)
    assert isinstance(payload, torch.Tensor)
    _assert_kept("keep_tokens", call, case.tokens, case.last_tokens, case.rows, case.refused, last, payload)
    assert_untouched("keep_tokens", [tokens, rows, flags], outputs=(last,))


# ---- a replay's hand-out -----------------------------------------------------------------------------------------

HAND_OUT_EDGES = (4096, 8192)  # the Triton kernel's blocks of the vocabulary
SPECIAL_VALUES = (float("nan"), float("inf"), float("-inf"), 1e-40)


@dataclass(frozen=True)
class HandOutCase:
    logits: torch.Tensor  # [rows, vocab]: a captured step's, the model's dtype (float32 on a float32 engine)
    tokens: torch.Tensor | None  # int32 [rows], -1 where nothing was sampled; None in logits mode
    n: int  # the batch's rows; the rest pad it to the graph's size
    gap: int
    tokens_gap: int  # a sampler plugin's tokens may be a strided view


@st.composite
def hand_out_cases(draw: st.DrawFn) -> HandOutCase:
    rows = draw(edge_sizes((8,), 1, 9))
    # Each side of the blocks; past one block off its multiples (the tail) in a branch of its own; Qwen's vocabulary.
    past = st.integers(HAND_OUT_EDGES[0] + 1, 20000).filter(lambda v: v % HAND_OUT_EDGES[0] != 0)
    vocab = draw(past | edge_sizes(HAND_OUT_EDGES, 1, 20000) | st.just(151936))
    dtype = draw(st.sampled_from((torch.bfloat16, torch.bfloat16, torch.float16, torch.float32)))
    seed = draw(seeds)
    logits = random_tensor((rows, vocab), torch.float32, draw(st.sampled_from((1.0, 30.0, 1e30))), seed)
    gen = torch.Generator().manual_seed(seed)
    spots = torch.randint(rows * vocab, (draw(st.integers(0, 4)),), generator=gen)
    logits.view(-1)[spots] = torch.tensor([SPECIAL_VALUES[int(i) % 4] for i in range(len(spots))])
    tokens = None
    if draw(st.booleans()):
        tokens = torch.randint(-1, vocab, (rows,), generator=gen, dtype=torch.int32)
    return HandOutCase(logits.to(dtype), tokens, draw(st.integers(1, rows)), draw(gaps),
                       draw(st.sampled_from((0, 0, 0, 2))))


def check_hand_out(bench: Bench, case: HandOutCase) -> None:
    """The first n rows, the logits upcast exactly (float32 holds every 16-bit value), in tensors of their own."""
    dev = bench.device
    logits = guarded("logits", case.logits.to(dev), case.gap)
    tokens = None if case.tokens is None else guarded("tokens", case.tokens.to(dev), case.tokens_gap)
    views = {"logits": logits.view} | ({} if tokens is None else {"tokens": tokens.view})
    call = describe(views, n=case.n)
    out = bench.run_step_kernel("hand_out", "hand_out", logits.view, None if tokens is None else tokens.view, case.n)
    assert isinstance(out, tuple)
    got_logits, got_tokens = out
    assert_bitwise("hand_out", call, "logits (the batch's rows, float32)", got_logits, case.logits[: case.n].float())
    if case.tokens is None:
        assert got_tokens is None, f"op hand_out at {call}: tokens came back without tokens to hand out"
    else:
        assert_bitwise("hand_out", call, "tokens (the batch's rows)", got_tokens, case.tokens[: case.n])
    inputs = [logits] if tokens is None else [logits, tokens]
    shared = {g.buffer.untyped_storage().data_ptr() for g in inputs}
    for name, t in (("logits", got_logits), ("tokens", got_tokens)):
        assert t is None or t.untyped_storage().data_ptr() not in shared, (
            f"op hand_out at {call}: the {name} handed out share the graph's buffer (the next replay overwrites them)"
        )
    assert_untouched("hand_out", inputs)


# ---- slot checks -------------------------------------------------------------------------------------------------

FAULTS = ("none", "duplicate", "duplicate", "duplicate", "over_cached", "over_live", "out_of_pool", "off_page")


@dataclass(frozen=True)
class SlotCase:
    table: torch.Tensor  # int32 [max_rows + 1, width]
    rows: tuple[int, ...]
    cached: tuple[int, ...]
    device_len: tuple[int, ...]
    others: tuple[int, ...]
    other_lens: tuple[int, ...]
    pad: int  # padding requests (device_len 0) after the batch's
    limits: Limits
    fault: str


@st.composite
def slot_cases(draw: st.DrawFn, page_sizes: tuple[int, ...]) -> SlotCase:
    """A page-structured table for a batch (and live rows beside it), then at most one planted fault."""
    ps = draw(st.sampled_from(page_sizes))
    width = draw(edge_sizes((64, 256), 2, 300))
    max_rows = draw(st.integers(1, 6))
    n = draw(st.integers(1, max_rows))
    fault = draw(st.sampled_from(FAULTS))
    # One new token each (the Triton kernels' two-launch path); a duplicate there needs two requests.
    decode = draw(st.booleans()) and (fault != "duplicate" or n > 1)
    order = draw(st.permutations(range(max_rows)))
    rows, others = order[:n], order[n : draw(st.integers(n, max_rows))]
    lens = [draw(seq_lengths(width, ps)) for _ in rows]
    if fault == "duplicate" and n == 1:
        lens[0] = min(width, max(lens[0], ps + 1))
    if fault == "duplicate" and decode:  # the last two requests' newest tokens at one page offset
        lens[-1] -= (lens[-1] - lens[-2]) % ps
        lens[-1] = lens[-1] if lens[-1] > 0 else lens[-2]
    cached = [d - 1 if decode else 0 if fault == "duplicate" else draw(st.integers(0, d - 1)) for d in lens]
    other_lens = [draw(st.integers(1, width)) for _ in others]
    pages_per_row = -(-width // ps)
    num_pages = max_rows * pages_per_row + draw(st.integers(0, 3))
    page_order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(draw(seeds)))
    table = torch.full((max_rows + 1, pages_per_row * ps), -1, dtype=torch.int32)
    for r in range(max_rows):
        pages = page_order[r * pages_per_row : (r + 1) * pages_per_row]
        table[r] = (pages[:, None] * ps + torch.arange(ps)).flatten().to(torch.int32)
    table = table[:, :width].contiguous()
    i = n - 2 if fault == "duplicate" and decode else draw(st.integers(0, n - 1))
    row, new = rows[i], list(range(cached[i], lens[i]))
    j = draw(st.sampled_from(new))
    if fault == "duplicate":  # two new tokens, maybe of two requests, one slot: a whole page mapped twice
        k = n - 1 if decode else draw(st.integers(0, n - 1))
        spots = [p for p in range(cached[k], lens[k]) if p % ps == j % ps and (rows[k], p // ps) != (row, j // ps)]
        if spots:
            p = draw(st.sampled_from(spots))
            block, page = p - p % ps, int(table[row, j]) // ps
            end = min(block + ps, width)
            table[rows[k], block:end] = torch.arange(page * ps, page * ps + end - block, dtype=torch.int32)
    elif fault == "over_cached":
        k = draw(st.integers(0, n - 1))
        if cached[k]:
            table[row, j] = table[rows[k], draw(st.integers(0, cached[k] - 1))]
    elif fault == "over_live" and others:
        k = draw(st.integers(0, len(others) - 1))
        table[row, j] = table[others[k], draw(st.integers(0, other_lens[k] - 1))]
    elif fault == "out_of_pool":
        table[row, draw(st.integers(0, lens[i] - 1))] = draw(st.sampled_from((-1, num_pages * ps, 2**31 - 1)))
    elif fault == "off_page" and ps > 1:
        p = draw(st.integers(0, lens[i] - 1))
        table[row, p] = (int(table[row, p]) + draw(st.sampled_from((1, ps)))) % (num_pages * ps)
    pad = draw(st.integers(0, 2)) if decode else 0
    limits = Limits(max_rows, width, 1, num_pages * ps, ps)
    return SlotCase(table, tuple(rows), tuple(cached), tuple(lens), tuple(others), tuple(other_lens), pad, limits,
                    fault)


def expected_slots(case: SlotCase) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(out_loc, table_rows, refused) by the rules, stated on the host: every slot a request reads lies in the pool
    and, with pages, at its position's offset of the page of its block's first position; every slot written is
    written once and holds no cached KV of the batch or of a live row outside it."""
    table, lim = case.table.tolist(), case.limits
    ps, num_slots = lim.page_size, lim.num_slots
    refused, written, held = False, [], set()
    for row, cached, length in zip(case.rows, case.cached, case.device_len):
        for p in range(length):
            slot = table[row][p]
            first = table[row][p - p % ps]
            if not 0 <= slot < num_slots or (ps > 1 and (slot % ps != p % ps or slot // ps != first // ps)):
                refused = True
            if p < cached:
                held.add(slot)
            else:
                written.append(slot)
    for row, length in zip(case.others, case.other_lens):
        held.update(s for s in table[row][:length] if 0 <= s < num_slots)
    if len(set(written)) < len(written) or held & set(written):
        refused = True
    out_loc = [num_slots] * (len(written) + case.pad) if refused else written + [num_slots] * case.pad
    table_rows = [lim.max_rows] * (len(case.rows) + case.pad) if refused else [*case.rows, *[lim.max_rows] * case.pad]
    return torch.tensor(out_loc, dtype=torch.int32), torch.tensor(table_rows), refused


def slot_query(case: SlotCase, device: torch.device) -> SlotQuery:
    """The query the engine's inputs build (engine/step/inputs.py), padding rows as a graph pads: the dummy row,
    device_len 0, one token at position 0."""
    rows = [*case.rows, *[case.limits.max_rows] * case.pad]
    cached = [*case.cached, *[0] * case.pad]
    lens = [*case.device_len, *[0] * case.pad]
    extend = [max(1, d - c) for c, d in zip(cached, lens)]
    starts = [sum(extend[:i]) for i in range(len(rows))]
    token_req = [i for i, e in enumerate(extend) for _ in range(e)]
    positions = [c + j for c, e in zip(cached, extend) for j in range(e)]

    def t(values: list[int] | tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=device)

    return SlotQuery(t(rows), t(cached), t(lens), t(starts), t(token_req), t(positions), t(case.others),
                     t(case.other_lens), max(lens), max(case.other_lens, default=0),
                     one_each=all(d - c <= 1 for c, d in zip(cached, lens)))


def check_slot_check(bench: Bench, case: SlotCase) -> None:
    table = guarded("page_table", case.table.to(bench.device))
    query = slot_query(case, bench.device)
    call = describe({"page_table": table.view}, rows=case.rows, cached=case.cached, device_len=case.device_len,
                    live=dict(zip(case.others, case.other_lens)), pad=case.pad, page_size=case.limits.page_size,
                    num_slots=case.limits.num_slots, fault=case.fault)
    out = bench.run_step_kernel("slot_check", "slot_check", table.view, query, case.limits, case.pad > 0)
    assert isinstance(out, tuple)
    out_loc, table_rows, refused = out
    want_loc, want_rows, want_refused = expected_slots(case)
    assert_bitwise("slot_check", call, "the verdict (refused)", refused.reshape(()).cpu(), torch.tensor(want_refused))
    assert_bitwise("slot_check", call, "out_loc", out_loc, want_loc)
    assert_bitwise("slot_check", call, "table_rows", table_rows, want_rows)
    assert_untouched("slot_check", [table])


# ---- a captured decode step's FlashInfer page ids ----------------------------------------------------------------


@dataclass(frozen=True)
class PageIdsCase:
    table: torch.Tensor  # int32 [max_rows + 1, width], page-structured
    rows: tuple[int, ...]  # the rows the step reads (padding rows repeat the dummy row)
    counts: tuple[int, ...]  # pages of each row's request
    page_size: int


@st.composite
def page_ids_cases(draw: st.DrawFn, page_sizes: tuple[int, ...]) -> PageIdsCase:
    ps = draw(st.sampled_from(page_sizes))
    pages_per_row = draw(st.sampled_from((255, 256, 257, 300)) | edge_sizes((64,), 1, 300))  # a block: 256 pages
    width = pages_per_row * ps
    max_rows = draw(st.integers(1, 8))
    num_pages = (max_rows + 1) * pages_per_row
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(draw(seeds)))
    table = (order.view(max_rows + 1, pages_per_row, 1) * ps + torch.arange(ps)).flatten(1)[:, :width]
    bs = draw(st.integers(1, 9))
    rows = tuple(draw(st.lists(st.integers(0, max_rows), min_size=bs, max_size=bs)))
    counts = tuple(draw(st.just(pages_per_row) | edge_sizes((64, 256), 1, pages_per_row)) for _ in rows)
    return PageIdsCase(table.to(torch.int32).contiguous(), rows, counts, ps)


def check_page_ids(bench: Bench, case: PageIdsCase) -> None:
    """The FlashInfer backend's in-graph page ids (Triton where the target's kernels are, else its torch statement
    graph_page_ids): out[indptr[i] + p] = table[rows[i], p * page_size] // page_size for each row's pages; nothing
    else written but the spare last entry."""
    from engine.attention.flashinfer_backend import graph_page_ids

    dev, ps = bench.device, case.page_size
    max_pages = -(-case.table.shape[1] // ps)
    indptr = torch.tensor([0, *torch.tensor(case.counts).cumsum(0).tolist()], dtype=torch.int32)
    table = guarded("page_table", case.table.to(dev))
    rows = guarded("table_rows", torch.tensor(case.rows, device=dev))
    kv_indptr = guarded("kv_indptr", indptr.to(dev))
    out = guarded("out", torch.full((len(case.rows) * max_pages + 1,), -3, dtype=torch.int32, device=dev))
    triton = bench.kernel_impl("rms_norm") != "kernels=torch"  # the backend's kernel comes with the Triton kernels
    call = describe({"page_table": table.view, "out": out.view}, rows=case.rows, pages=case.counts, page_size=ps)
    if triton:
        from engine.attention.page_ids import page_ids

        def run() -> None:
            page_ids(table.view, rows.view, kv_indptr.view, max_pages, ps, out.view)
    else:
        cols = torch.arange(max_pages, device=dev)

        def run() -> None:
            graph_page_ids(table.view, rows.view, kv_indptr.view, cols, ps, out.view)
    bench.traced("page_ids", "kernels=triton" if triton else "kernels=torch", None, run)
    want = torch.full((len(case.rows) * max_pages + 1,), -3, dtype=torch.int32)
    for i, (row, count) in enumerate(zip(case.rows, case.counts)):
        want[int(indptr[i]) : int(indptr[i]) + count] = case.table[row, : count * ps : ps] // ps
    got = out.view.cpu()
    assert_bitwise("page_ids", call, "out (every request's pages; the spare last entry aside)", got[:-1], want[:-1])
    assert_untouched("page_ids", [table, rows, kv_indptr], outputs=(out,))
