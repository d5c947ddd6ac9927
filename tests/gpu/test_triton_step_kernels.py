"""The Triton step kernels (engine/step/triton.py, engine/attention/page_ids.py) against their torch statements:
the input ids, the slot check, the greedy step, a sampled step's keep, the hand-out and the graph's page ids, bit for
bit.

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs them in Triton's interpreter, and
tools/sm90_compile.py compiles their launches.
"""

from __future__ import annotations

import random

import pytest
import torch
from gpu_support import KERNEL_DEVICE as DEVICE
from gpu_support import needs_kernel_device
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from engine.step.kernels import STEP_KERNELS, TORCH_STEP_KERNELS  # noqa: E402
from engine.step.slots import SlotQuery  # noqa: E402
from engine.step.triton import ARGMAX_BLOCK, ONE_EACH_MAX  # noqa: E402
from engine.validate import Limits  # noqa: E402
from oracle.ops import step as step_ops  # noqa: E402

pytestmark = needs_kernel_device
SPECIALS = ("nan", "+inf", "-inf row", "tie", "tie a tile apart")
_SHARED_TRITON = STEP_KERNELS.factory("triton")()  # the slot test's: its flag lives across examples


@settings(max_examples=150, deadline=None)
@given(
    page_size=st.sampled_from((1, 2, 4, 16)),
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 39)), min_size=1, max_size=5),
    live=st.lists(st.integers(1, 40), max_size=3),
    faults=st.lists(st.tuples(st.sampled_from(["out", "negative", "alias", "twice", "offset"]), st.integers(0, 10**6)),
                    max_size=2),
    seed=st.integers(0, 2**32 - 1),
    pads=st.integers(0, 2),
)
def test_the_triton_slot_check_is_the_torch_one(
    page_size: int, lengths: list[tuple[int, int]], live: list[int], faults: list[tuple[str, int]], seed: int,
    pads: int,
) -> None:
    """Random batches over a shuffled, page-structured page table, with faults that must be refused (slots out
    of the pool, a write over cached or live KV, two tokens on one slot, a slot off its page offset), padded as a
    graph pads them (requests of device_len 0 on the dummy row): the same out_loc for every new token, the same
    rows to read and the same verdict as engine/step/slots.py's torch reference. One instance checks every example,
    as an engine's does every step: a refused decode batch must leave nothing that refuses the next."""
    rnd = random.Random(seed)
    num_pages, width = 64, 48
    limits = Limits(max_rows=8, max_seq_len=width, vocab=512, num_slots=num_pages * page_size, page_size=page_size)
    table = torch.zeros(9, width, dtype=torch.int32)
    free = list(range(num_pages))
    rnd.shuffle(free)
    reqs = [(device_len, min(cached, device_len - 1)) for device_len, cached in lengths]
    if pads:  # a graph's layout: decode, one token per request
        reqs = [(device_len, device_len - 1) for device_len, _ in reqs]
    rows = list(range(len(reqs) + len(live)))
    for row, n in zip(rows, [d for d, _ in reqs] + live):
        for start in range(0, n, page_size):
            if not free:
                return
            page = free.pop()
            table[row, start : start + page_size] = page * page_size + torch.arange(page_size)[: width - start]
    for kind, pick in faults:
        r = pick % len(reqs)
        device_len, cached = reqs[r]
        col = cached + pick % (device_len - cached)  # a written column
        if kind == "out":
            table[r, pick % device_len] = limits.num_slots + pick % 7
        elif kind == "negative":
            table[r, pick % device_len] = -1 - pick % 5
        elif kind == "alias" and (cached or live):
            src = (len(reqs), pick % live[0]) if live and pick % 2 else (r, pick % max(cached, 1))
            table[r, col] = table[src]
        elif kind == "twice" and len(reqs) > 1:
            other = (r + 1) % len(reqs)
            table[r, col] = table[other, reqs[other][1]]
        elif kind == "offset" and page_size > 1:
            table[r, col] = table[r, col] + 1
    device = torch.device(DEVICE)
    extend = [d - c for d, c in reqs]
    starts = [0]
    for e in extend[:-1]:
        starts.append(starts[-1] + e)
    token_req = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor(extend))
    positions = torch.cat([torch.arange(c, d) for d, c in reqs])
    table[limits.max_rows] = limits.num_slots + torch.arange(width) % page_size  # the dummy row
    n = len(reqs)
    starts += list(range(sum(extend), sum(extend) + pads))
    token_req = torch.cat([token_req, torch.arange(n, n + pads)])
    positions = torch.cat([positions, torch.zeros(pads, dtype=torch.int64)])
    reqs += [(0, 0)] * pads
    rows = rows[:n] + [limits.max_rows] * pads + rows[n:]

    def dev(values: list[int] | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(device)

    query = SlotQuery(
        dev(rows[: len(reqs)]), dev([c for _, c in reqs]), dev([d for d, _ in reqs]), dev(starts), dev(token_req),
        dev(positions), dev(rows[len(reqs):]), dev(live), max(d for d, _ in reqs), max(live, default=0),
        one_each=all(d - c <= 1 for d, c in reqs),
    )
    table = table.to(device)
    want_loc, want_rows, want = TORCH_STEP_KERNELS.slot_check(table, query, limits, pads > 0)
    got_loc, got_rows, got = _SHARED_TRITON.slot_check(table, query, limits, pads > 0)
    assert bool(got) == bool(want)
    assert torch.equal(got_loc, want_loc) and torch.equal(got_rows, want_rows)
    assert (got_loc[len(got_loc) - pads :] == limits.num_slots).all(), "padding writes the dummy page"


@pytest.mark.parametrize("clash", ["none", "last two write one slot", "last writes over the first's KV"])
@pytest.mark.parametrize("n", [ONE_EACH_MAX - 1, ONE_EACH_MAX, ONE_EACH_MAX + 1])
def test_the_decode_check_sees_every_request_up_to_its_cap(n: int, clash: str) -> None:
    """Decode batches each side of ONE_EACH_MAX requests (two launches up to it, the hits past it), the fault at the
    batch's far end: refused as the torch rule has it, and a clean batch passes."""
    width, limits = 8, Limits(max_rows=n, max_seq_len=8, vocab=512, num_slots=(n + 1) * 8, page_size=1)
    table = (torch.arange(n + 1)[:, None] * width + torch.arange(width)).to(torch.int32)
    lens = [5 + r % 3 for r in range(n)]
    if clash == "last two write one slot":
        table[n - 1, lens[-1] - 1] = table[n - 2, lens[-2] - 1]
    elif clash != "none":
        table[n - 1, lens[-1] - 1] = table[0, 0]
    table = table.to(DEVICE)

    def dev(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=DEVICE)

    cached = [d - 1 for d in lens]
    query = SlotQuery(dev(list(range(n))), dev(cached), dev(lens), dev(list(range(n))), dev(list(range(n))),
                      dev(cached), dev([]), dev([]), max(lens), 0, one_each=True)
    want_loc, want_rows, want = TORCH_STEP_KERNELS.slot_check(table, query, limits, False)
    got_loc, got_rows, got = _SHARED_TRITON.slot_check(table, query, limits, False)
    assert bool(got) == bool(want) == (clash != "none")
    assert torch.equal(got_loc, want_loc) and torch.equal(got_rows, want_rows)


def _strided(tokens: torch.Tensor, gap: int) -> torch.Tensor:
    """tokens on DEVICE in a view `gap` elements apart, as a sampler plugin's may be."""
    view = tokens.new_zeros(len(tokens) * (1 + gap)).to(DEVICE)[:: 1 + gap]
    return view.copy_(tokens)


@settings(max_examples=40, deadline=None)
@given(case=step_ops.hand_out_cases())
def test_hand_out_is_the_torch_one(case: step_ops.HandOutCase) -> None:
    """A replay's hand-out, vocabularies each side of the kernel's blocks, padding rows, with and without tokens
    (contiguous or strided): the same float32 rows and tokens as StepKernels' torch statement, bit for bit (NaN for
    NaN)."""
    logits = case.logits.to(DEVICE)
    tokens = None if case.tokens is None else _strided(case.tokens, case.tokens_gap)
    want_logits, want_tokens = TORCH_STEP_KERNELS.hand_out(logits, tokens, case.n)
    got_logits, got_tokens = STEP_KERNELS.factory("triton")().hand_out(logits, tokens, case.n)
    assert got_logits.dtype == torch.float32 and got_logits.shape == want_logits.shape
    assert torch.equal(got_logits.nan_to_num(7.0), want_logits.nan_to_num(7.0))
    assert (got_tokens is None) == (want_tokens is None)
    assert got_tokens is None or torch.equal(got_tokens, want_tokens)


@settings(max_examples=40, deadline=None)
@given(case=step_ops.keep_cases())
def test_keep_tokens_is_the_torch_one(case: step_ops.KeepCase) -> None:
    """A sampled step's end, -1 tokens among them, contiguous or strided: the same last tokens and payload as
    StepKernels' torch statement."""
    tokens = _strided(case.tokens, case.tokens_gap)
    rows, flags = case.rows.to(DEVICE), torch.tensor([case.refused], device=DEVICE)
    want_last, got_last = case.last_tokens.to(DEVICE), case.last_tokens.to(DEVICE, copy=True)
    want = TORCH_STEP_KERNELS.keep_tokens(tokens, want_last, rows, flags)
    got = STEP_KERNELS.factory("triton")().keep_tokens(tokens, got_last, rows, flags)
    assert got.dtype == want.dtype == torch.int32 and torch.equal(got, want) and torch.equal(got_last, want_last)


@settings(max_examples=60, deadline=None)
@given(case=step_ops.input_ids_cases())
def test_input_ids_are_the_torch_ones(case: step_ops.InputIdsCase) -> None:
    """Decode batches (every id pending), mixed ones (some pending) and prefills, counts each side of the kernel's
    1024-token blocks: the same int32 ids as StepKernels' torch statement."""
    args = [t.to(DEVICE) for t in (case.ids, case.pending, case.rows, case.token_req, case.last_tokens)]
    want = TORCH_STEP_KERNELS.input_ids(*args, case.kind)  # type: ignore[arg-type]
    got = STEP_KERNELS.factory("triton")().input_ids(*args, case.kind)  # type: ignore[arg-type]
    assert got.dtype == want.dtype == torch.int32 and torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(
    bs=st.integers(1, 9),
    vocab=st.sampled_from((7, 2048, 4097, 151936)),
    specials=st.lists(st.tuples(st.integers(0, 8), st.sampled_from(SPECIALS), st.integers(0, 10**6)), max_size=3),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from((torch.float32, torch.bfloat16)),
)
@example(bs=2, vocab=151936, specials=[(1, "tie a tile apart", 100)], seed=0, dtype=torch.float32)  # drawn rarely
def test_greedy_step_is_the_torch_one(
    bs: int, vocab: int, specials: list[tuple[int, str, int]], seed: int, dtype: torch.dtype
) -> None:
    """A captured step's greedy tokens, last tokens and payload: the same as engine/sample.py's greedy_tokens and
    keep_tokens, with rows of NaN, +inf, all -inf (-1, kept as 0) and exact ties at the maximum (first index), also
    two a tile apart in one lane; on float32 logits and on bfloat16 ones (what a captured step now hands it)."""
    logits = torch.randn(bs, vocab, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
    for row, kind, pick in specials:
        row %= bs
        if kind == "nan":
            logits[row, pick % vocab] = float("nan")
        elif kind == "+inf":
            logits[row, pick % vocab] = float("inf")
        elif kind == "-inf row":
            logits[row] = float("-inf")
        elif kind == "tie":
            top = logits[row].max() + 1
            logits[row, pick % vocab] = top
            logits[row, (pick * 7 + 1) % vocab] = top
        else:  # in one lane of the argmax's tiles, where only a strict compare keeps the first
            top = logits[row].max() + 1
            at = pick % max(1, vocab - ARGMAX_BLOCK)
            logits[row, at] = top
            logits[row, min(at + ARGMAX_BLOCK, vocab - 1)] = top
    rows = torch.randperm(12, generator=torch.Generator().manual_seed(seed))[:bs].to(DEVICE)
    flags = torch.tensor([seed % 2 == 0], device=DEVICE)
    last = torch.arange(100, 112, dtype=torch.int32, device=DEVICE)
    want_last, got_last = last.clone(), last.clone()
    want = TORCH_STEP_KERNELS.greedy_step(logits, want_last, rows, flags)
    got = STEP_KERNELS.factory("triton")().greedy_step(logits, got_last, rows, flags)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got_last, want_last)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_graph_page_ids_in_one_launch(page_size: int) -> None:
    """attention/page_ids.py's page_ids writes what flashinfer_backend.graph_page_ids (its torch statement) writes."""
    from engine.attention.flashinfer_backend import graph_page_ids
    from engine.attention.page_ids import page_ids

    width, bs = 96, 5
    table = torch.randint(0, 4000, (bs + 2, width), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    pages = torch.tensor([1, 0, 24, 7, 3])[:bs] if page_size == 4 else torch.tensor([1, 0, 6, 2, 3])
    pages = pages.clamp(max=-(-width // page_size))
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).to(torch.int32).to(DEVICE)
    rows = torch.tensor([6, 0, 3, 2, 5]).to(DEVICE)
    max_pages = -(-width // page_size)
    want = torch.full((bs * max_pages + 1,), -7, dtype=torch.int32, device=DEVICE)
    got = want.clone()
    table = table.to(DEVICE)
    graph_page_ids(table, rows, indptr, torch.arange(max_pages, device=DEVICE), page_size, want)
    page_ids(table, rows, indptr, max_pages, page_size, got)
    assert torch.equal(got[:-1], want[:-1])
