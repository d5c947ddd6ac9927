"""Property: invalid calls mixed into a valid workload are rejected with the engine's own errors and change nothing.

Each example draws a tiny model, a page size and layout, and a sequence of operations on one StaticDriver: valid
greedy requests (some given as NumPy arrays, NumPy scalars and Fractions, which must behave exactly like the Python
ones), steps, aborts and valid hand-built batches, mixed with invalid calls: bad SamplingParams, bad prompts, prompts
too long, bad chunkings, unknown uids; generate() with a bad prompt or SamplingParams after good ones, or with bad
params; a second StaticDriver while requests run; bad StaticDriver or PageLayout arguments; and hand-built batches
through prepare_batch/forward_batch with bad rows, token ids, lengths, phases, page-table slots, or a new token aimed
at a live request's cached KV, with that request in the batch or outside it. The pool is small, so valid requests
also hit CapacityError.

A valid hand-built batch runs a fresh request (prefill, then 0-2 decode steps) in a free page-table row whose slots
are taken from pages the driver's allocator has free (their stale KV is never read: a request writes each slot
before reading it), then releases the row (engine.release_rows) and restores it, so the driver never sees it.

Vacuity floors: 75% of the rejected calls meet live KV (a running request with cached tokens: the first 1-3 calls
follow the prefill of 1-2 requests that are still decoding, with a row free). The calls of rarer kinds are judged per
example (an example without one counts as a miss, so a strategy that stops drawing a kind fails): a batch aimed at a
free row or at a live request's KV finds one (else it falls back to an out-of-range row), in 2% of the examples; a
new token aimed at the KV of a live request outside the batch finds a free row and such a request (same fallback),
12%; a valid hand-built batch finds a free row and slots beside a live row, 14%; a second driver meets running
requests (else it becomes a bad constructor argument), 10%; a generate() refused at a later prompt has a row and
pages for the earlier ones (so an eager admission would show), 6%. Each is about half its share under `ci` (5%, 24%,
28%, 22%, 12%): an example draws up to 18 calls of some 20 kinds, so most examples make no call of a given rare kind.

Checks:
* every invalid call raises the expected EngineError subclass, never anything else (no IndexError from torch),
  naming the field, the prompt index ("prompt 2: ...") or the request and page-table row it is about;
* after every rejected call the whole KV pool and page table are bitwise unchanged (so is the KV of every live
  request), and so are the engine's live rows and the driver's bookkeeping (rows, free pages, reservations, uids,
  request lengths): a refused generate() admitted nothing, a refused second driver took nothing over;
* NumPy and Fraction SamplingParams are stored as the Python ones (equal, with Python types);
* a valid hand-built batch changes no KV slot but its own, leaves the driver's page table, live rows and
  bookkeeping as they were once its row is released, and its tokens equal HF greedy generation;
* every request that ran to completion equals HF greedy generation (float64) on the same model, under the
  vLLM near-tie rule of oracle.tolerance; so the batches after each rejection were computed correctly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import (
    CapacityError,
    ConfigError,
    EngineBusyError,
    EngineError,
    InvalidRequestError,
    Req,
    SamplingParams,
)
from engine.driver import PageLayout, StaticDriver
from oracle.budget import examples
from oracle.checks import NUMERICS_LAW, compare_greedy
from oracle.coverage import exercised, floors
from oracle.drive import MAX_SEQ_LEN, TINY_VOCAB, EnginePool, continuous_archs, kv_slot_view
from oracle.hf import HFOracle
from oracle.rejection import assert_same_state, engine_state, expect
from oracle.strategies import layouts, prefix_splits, prompts, sampling_params
from oracle.tolerance import logit_tolerance

ROWS = 3  # max_running_req: small, so rows run out
POOL_SLOTS = 48  # KV slots in the pool: a few requests fill it, so pages run out too
FUZZ_PAGE_SIZES = (1, 2, 4)  # small pages: the pool of POOL_SLOTS slots still has many
HAND_UID = 990  # uids of hand-built requests (the driver's count from 0 and never get this far)

Op = tuple[Any, ...]
HandRun = tuple[list[int], list[int], list[torch.Tensor]]  # a valid hand-built request: prompt, tokens, logits

# ---- invalid inputs ------------------------------------------------------------------------------------------
_BAD_PARAM_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.one_of(
        st.floats(max_value=-1e-12), st.sampled_from([math.nan, math.inf, 1e-45, 0.0 + 5e-324, "0.5", None])
    ),
    "top_p": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0, exclude_min=True), st.just(math.nan)),
    "top_k": st.one_of(st.just(0), st.integers(max_value=-2), st.sampled_from([1.5, "3", True])),
    "min_p": st.one_of(
        st.floats(max_value=0.0, exclude_max=True), st.floats(min_value=1.0, exclude_min=True), st.just(math.nan)
    ),
    "max_tokens": st.one_of(st.integers(max_value=0), st.sampled_from([2.0, "4", True])),
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.sampled_from([1.5, "7", True])),
    "ignore_eos": st.sampled_from(["no", 1, None]),
}
bad_param_kwargs = st.sampled_from(sorted(_BAD_PARAM_VALUES)).flatmap(
    lambda name: _BAD_PARAM_VALUES[name].map(lambda value: {name: value})
)

_ids = st.lists(st.integers(0, TINY_VOCAB - 1), max_size=8)
bad_prompts = st.one_of(
    st.just([]),
    st.tuples(_ids, st.one_of(st.integers(min_value=TINY_VOCAB), st.integers(max_value=-1)), _ids).map(
        lambda t: [*t[0], t[1], *t[2]]
    ),
    st.lists(st.floats(), min_size=1, max_size=4),  # would truncate to ints
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.text(max_size=4),
    st.lists(_ids.filter(bool), min_size=1, max_size=3),  # nested
    _ids.filter(bool).map(lambda ids: torch.tensor(ids, dtype=torch.float32)),
    st.integers(1, 4).map(lambda n: torch.zeros(2, n, dtype=torch.int64)),
    st.integers(2**31, 2**62).map(lambda v: torch.tensor([v], dtype=torch.int64)),  # would wrap around in int32
    st.none(),
)

# StaticDriver and PageLayout arguments that are refused with ConfigError, each naming its field.
_BAD_DRIVER_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "layout": st.sampled_from(["shuffled", 3, {"kind": "shuffled"}]),
    "max_prefill_tokens": st.one_of(st.integers(max_value=0), st.sampled_from([1.5, True, "4", math.nan])),
    "record_logits": st.sampled_from(["yes", None, 1, 0]),
    "eos_token_ids": st.sampled_from([5, "12", b"\x01", ["a"], [1.0], [True], [None]]),
}
_BAD_LAYOUT_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "kind": st.sampled_from(["shuffle", "Contiguous", "", None, 3]),
    "seed": st.sampled_from(["1", 1.5, True, None, math.inf]),
}
bad_driver_args = st.sampled_from(
    [("driver", name) for name in sorted(_BAD_DRIVER_ARGS)] + [("layout", name) for name in sorted(_BAD_LAYOUT_ARGS)]
).flatmap(
    lambda where: (_BAD_DRIVER_ARGS if where[0] == "driver" else _BAD_LAYOUT_ARGS)[where[1]].map(
        lambda value: (where[0], {where[1]: value})
    )
)

_NOT_PARAMS = st.sampled_from([None, 0.7, 3, {"max_tokens": 2}, "greedy"])
GENERATE_KINDS = (
    "later prompt bad",
    "later prompt too long",
    "later prompt never fits",
    "later params not SamplingParams",
    "params not SamplingParams",
    "params of the wrong length",
    "prompts not a list",
)


@st.composite
def bad_generate_calls(draw: st.DrawFn, page_size: int) -> Op:
    """("bad generate", prompts, params, error, needles, later): a generate() call that must be refused before it
    admits anything; `later` says the bad entry comes after good prompts, which an eager admission would take."""
    kind = draw(st.sampled_from(GENERATE_KINDS))
    # Short good prompts: an eager admission of the first would usually find its pages in the small pool.
    good = draw(st.lists(prompts(TINY_VOCAB, 4, page_size), min_size=1, max_size=3))
    tail = draw(st.lists(prompts(TINY_VOCAB, 4, page_size), max_size=2))
    i, params = len(good), SamplingParams(max_tokens=2, ignore_eos=True)
    bad: Any
    if kind == "later prompt bad":
        bad = draw(bad_prompts)
        return ("bad generate", [*good, bad, *tail], params, InvalidRequestError, (f"prompt {i}:",), True)
    if kind == "later prompt too long":  # + max_tokens 2 > MAX_SEQ_LEN
        bad = [1] * draw(st.integers(MAX_SEQ_LEN - 1, MAX_SEQ_LEN + 4))
        return ("bad generate", [*good, bad, *tail], params, InvalidRequestError, (f"prompt {i}:", "max_seq_len"), True)
    if kind == "later prompt never fits":  # fits max_seq_len, but needs more pages than the pool holds
        bad = [2] * draw(st.integers(POOL_SLOTS - 1, MAX_SEQ_LEN - 2))
        return ("bad generate", [*good, bad, *tail], params, CapacityError, (f"prompt {i}:", "never fit"), True)
    all_prompts = [*good, *tail]
    if kind == "later params not SamplingParams":
        all_prompts.insert(i, draw(prompts(TINY_VOCAB, 4, page_size)))
        plist: list[Any] = [params] * len(all_prompts)
        plist[i] = draw(_NOT_PARAMS)
        needles: tuple[str, ...] = (f"prompt {i}:", "SamplingParams", type(plist[i]).__name__)
        return ("bad generate", all_prompts, plist, InvalidRequestError, needles, True)
    if kind == "params not SamplingParams":
        bad = draw(_NOT_PARAMS)
        return ("bad generate", all_prompts, bad, InvalidRequestError, ("params", type(bad).__name__), False)
    if kind == "params of the wrong length":
        n = draw(st.integers(0, len(all_prompts) + 1))
        n += n >= len(all_prompts)  # any length but the right one
        needles = (f"{len(all_prompts)} prompts but {n} SamplingParams",)
        return ("bad generate", all_prompts, [params] * n, InvalidRequestError, needles, False)
    bad = draw(st.sampled_from(["hello", None, 5, b"\x01\x02"]) | st.just(torch.tensor(good[0])))
    return ("bad generate", bad, params, InvalidRequestError, ("prompts must be a list", type(bad).__name__), False)


@st.composite
def bad_chunks(draw: st.DrawFn, length: int) -> tuple[Any, ...]:
    chunks = draw(
        st.one_of(
            st.lists(st.integers(-3, length + 3), min_size=1, max_size=4).filter(
                lambda c: sum(c) != length or min(c) <= 0
            ),
            st.just([length / 2, length / 2]),
        )
    )
    return tuple(chunks)


BATCH_KINDS = (
    "row out of range",
    "token out of vocab",
    "cached_len >= device_len",
    "decode of several tokens",
    "longer than max_seq_len",
    "float input_ids",
    "row twice",
    "bad phase",
    "params not SamplingParams",
    "not a Req",
    "empty batch",
    "bad slot",
    "new token over live KV",
)

# A valid request may come in other number types: its prompt as a NumPy array or a list of NumPy ints, its chunk
# sizes as NumPy ints, its SamplingParams as NumPy scalars and a Fraction. It must behave exactly like the Python one.
NUMBER_FORMS = ("python", "python", "numpy array", "numpy ints")


@st.composite
def add_operations(draw: st.DrawFn, page_size: int, min_tokens: int = 1) -> Op:
    prompt = draw(prompts(TINY_VOCAB, 20, page_size))
    params = draw(sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(min_tokens, 8)))
    chunks = draw(st.one_of(st.just(()), prefix_splits(len(prompt))))
    return ("add", prompt, params, chunks, draw(st.sampled_from(NUMBER_FORMS)))


INVALID_KINDS = (
    "bad params",
    "bad prompt",
    "too long",
    "bad chunks",
    "unknown uid",
    *["bad batch"] * 3,
    "alias outside the batch",
    "bad generate",
    "bad generate",
    "second driver",
    "bad driver args",
)
LIVE_KV = "a rejected call meets live KV (a running request with cached tokens)"
AIMED = "a batch aimed at a free row or live KV finds one (else: row out of range)"
OUTSIDE = "a new token aimed at KV outside the batch finds a live request (else: row out of range)"
HAND = "a valid hand-built batch finds a free row and slots, beside a live row"
SECOND = "a second StaticDriver meets running requests (else: a bad constructor argument)"
ROOM = "a generate() refused at a later prompt has room for the earlier ones"
PER_EXAMPLE = (AIMED, OUTSIDE, HAND, SECOND, ROOM)  # an example hits one if any of its calls of that kind did

OPERATION_KINDS = ("add", "add", "add", "step", "step", "step", "abort", "hand batch", *INVALID_KINDS)
# The first 1-3 calls meet the requests just prefilled, most of them still decoding, with a row free: invalid calls
# and valid hand-built batches, all of which leave that state as they found it. Those that need a free row beside
# live KV come more often here, where they find one (later, three running requests may hold every row).
FIRST_KINDS = (*INVALID_KINDS, *["bad batch"] * 4, *["alias outside the batch"] * 2, *["hand batch"] * 2)


@st.composite
def operations(draw: st.DrawFn, page_size: int, kinds: Sequence[str] = OPERATION_KINDS) -> Op:
    kind = draw(st.sampled_from(kinds))
    if kind == "add":
        return draw(add_operations(page_size))
    if kind == "abort":
        return ("abort", draw(st.integers(0, ROWS - 1)))
    if kind == "bad params":
        return ("bad params", draw(bad_param_kwargs))
    if kind == "bad prompt":
        return ("bad prompt", draw(bad_prompts))
    if kind == "too long":
        length = draw(st.integers(1, MAX_SEQ_LEN))
        return ("too long", [1] * length, draw(st.integers(MAX_SEQ_LEN + 1 - length, MAX_SEQ_LEN + 8 - length)))
    if kind == "bad chunks":
        prompt = draw(prompts(TINY_VOCAB, 12))
        return ("bad chunks", prompt, draw(bad_chunks(len(prompt))))
    if kind == "unknown uid":
        return ("unknown uid", draw(st.sampled_from(["abort", "result"])), draw(st.integers(1000, 10**6)))
    if kind == "bad batch":
        return ("bad batch", draw(st.sampled_from(BATCH_KINDS)), draw(st.randoms(use_true_random=False)))
    if kind in ("alias outside the batch", "hand batch"):
        return (kind, draw(st.randoms(use_true_random=False)))
    if kind == "bad generate":
        return draw(bad_generate_calls(page_size))
    if kind in ("second driver", "bad driver args"):
        return (kind, draw(bad_driver_args))
    return ("step",)


# ---- rejection -----------------------------------------------------------------------------------------------
def _rejects(driver: StaticDriver, error: type[EngineError], call: Callable[[], object], *needles: str) -> None:
    """call() raises `error` naming every needle (oracle.rejection.expect) and changes no state: KV pool, page
    table, live rows, the driver's bookkeeping."""
    live = any(s.req.cached_len > 0 for s in driver.running.values())
    exercised(LIVE_KV, live)
    before = engine_state(driver.engine, driver)
    expect(error, call, *needles)
    assert_same_state(before, engine_state(driver.engine, driver))


def _free_slots(driver: StaticDriver) -> list[int]:
    """The KV slots of the pages the driver's allocator has free (reserved ones too: they are not mapped yet)."""
    ps = driver.page_size
    return [page * ps + offset for page in driver.pages.allocator.free for offset in range(ps)]


def _page_slots(pages: list[int], page_size: int, n: int) -> list[int]:
    """The slots of positions [0, n) on these pages in order: the page structure the engine requires."""
    return [page * page_size + offset for page in pages for offset in range(page_size)][:n]


def _bad_batch(driver: StaticDriver, kind: str, rnd: Any, found: set[str]) -> None:
    """Build and submit one invalid hand-made batch (page-table writes of ours land in free rows only)."""
    engine = driver.engine
    tokens = [rnd.randrange(TINY_VOCAB) for _ in range(rnd.randint(1, 6))]
    row = rnd.randrange(ROWS)  # any row, live ones too: a missed check would then corrupt a live request
    params: Any = SamplingParams()
    phase: Any = "prefill"
    cached = 0
    free = list(driver.requests.free_rows)
    decoding = [s for s in driver.running.values() if s.output_ids]
    if kind in ("bad slot", "new token over live KV"):
        runs = bool(free) if kind == "bad slot" else bool(free and decoding)
        found |= {AIMED} if runs else set()
        kind = kind if runs else "row out of range"
    if kind == "row out of range":
        row = rnd.choice([ROWS, -1, 10**6])  # ROWS is the dummy row
    elif kind == "token out of vocab":
        tokens[rnd.randrange(len(tokens))] = rnd.choice([TINY_VOCAB, TINY_VOCAB + 7, -1, -(2**20)])
    elif kind == "cached_len >= device_len":
        cached = len(tokens) + rnd.randint(0, 3)
    elif kind == "decode of several tokens":
        tokens, phase = tokens + [0], "decode"
    elif kind == "longer than max_seq_len":
        tokens = [1] * (MAX_SEQ_LEN + rnd.randint(1, 5))
    elif kind == "bad phase":
        phase = rnd.choice(["extend", "", None])
    elif kind == "params not SamplingParams":
        params = rnd.choice([None, {"temperature": 0.0}])
    ids = torch.tensor(tokens, dtype=torch.float32 if kind == "float input_ids" else torch.int32)
    if kind == "float input_ids":  # refused as the Req is built: it keeps its tokens as a list of ints
        _rejects(driver, InvalidRequestError, lambda: Req(ids, row, cached, 1, 999, params), "input_ids", "float32")
        return
    reqs: list[Any] = [Req(ids, row, cached, 1, 999, params)]
    if kind == "row twice":
        reqs.append(Req(ids.clone(), row, 0, 1, 998, SamplingParams()))
    elif kind == "not a Req":
        reqs.append(rnd.choice([None, 3, "req"]))
    elif kind == "empty batch":
        reqs = []
    saved_rows = engine.page_table[free].clone() if free else None
    if kind == "bad slot":
        row = reqs[0].table_idx = free[0]
        limit = engine.num_pages * engine.config.page_size
        engine.page_table[row, : len(tokens)] = torch.randperm(limit)[: len(tokens)].to(torch.int32)
        engine.page_table[row, rnd.randrange(len(tokens))] = rnd.choice([-1, limit, limit + 5, 2**31 - 1])
    elif kind == "new token over live KV":
        live = rnd.choice(decoding).req
        copy = Req(list(live.token_ids), live.table_idx, live.cached_len, 1, live.uid, SamplingParams())
        victim = int(engine.page_table[live.table_idx, rnd.randrange(live.cached_len)])
        engine.page_table[free[0], 0] = victim
        reqs, phase = [copy, Req(torch.tensor([tokens[0]], dtype=torch.int32), free[0], 0, 1, 997, params)], "decode"
    try:
        _rejects(driver, InvalidRequestError, lambda: engine.forward_batch(*engine.prepare_batch(reqs, phase)).result())
    finally:
        if saved_rows is not None:
            engine.page_table[free] = saved_rows


def _alias_outside_the_batch(driver: StaticDriver, rnd: Any, found: set[str]) -> None:
    """A hand-built request in a free row, its slots fresh but one: that one holds cached KV of a live request that
    is not in the batch. The engine knows the row is live (engine.live_rows) and must refuse, naming it."""
    engine = driver.engine
    free = list(driver.requests.free_rows)
    live = [s.req for s in driver.running.values() if s.req.cached_len > 0]
    for req in live:  # the engine's view of the driver's requests: what the guard relies on
        assert engine.live_rows.get(req.table_idx) == (req.cached_len, req.uid), (
            f"engine.live_rows[{req.table_idx}] = {engine.live_rows.get(req.table_idx)} but request {req.uid} there "
            f"has {req.cached_len} cached tokens"
        )
    runs = bool(free and live)
    found |= {OUTSIDE} if runs else set()
    if not runs:
        _bad_batch(driver, "row out of range", rnd, found)
        return
    target = rnd.choice(live)
    victim = int(engine.page_table[target.table_idx, rnd.randrange(target.cached_len)])
    row, ps = rnd.choice(free), driver.page_size
    # Whole pages, as the engine requires: one block of the row is the victim's page, the rest are free pages.
    n = rnd.randint(1, min(6, (len(driver.pages.allocator.free) + 1) * ps))
    blocks = -(-n // ps)
    pages = rnd.sample(list(driver.pages.allocator.free), blocks - 1)
    pages.insert(rnd.randrange(blocks), victim // ps)
    slots = _page_slots(pages, ps, n)
    if victim not in slots:  # the victim's offset lies past the row's end: end the row there
        n = slots.index(victim - victim % ps) + victim % ps + 1
        slots = _page_slots(pages, ps, n)
    phase = "decode" if n == 1 and rnd.random() < 0.5 else "prefill"  # a lone token at cached_len 0 may be either
    req = Req(torch.tensor([rnd.randrange(TINY_VOCAB) for _ in range(n)], dtype=torch.int32), row, 0, 1,
              HAND_UID + 1, SamplingParams())
    saved = engine.page_table[row].clone()
    engine.page_table[row, :n] = torch.tensor(slots, dtype=torch.int32)
    try:
        _rejects(
            driver, InvalidRequestError, lambda: engine.forward_batch(*engine.prepare_batch([req], phase)).result(),
            f"request {req.uid}:", f"would overwrite cached KV of request {target.uid} in page-table row "
            f"{target.table_idx}",
        )
    finally:
        engine.page_table[row] = saved


def _hand_batch(driver: StaticDriver, rnd: Any, hand_runs: list[HandRun], found: set[str]) -> None:
    """A valid hand-built request in a free row, on slots of free pages: a prefill and 0-2 decode steps through
    prepare_batch/forward_batch, beside the driver's live requests; then its row is released and restored. It may
    write its own slots only; its tokens are checked against HF at the end of the example."""
    engine = driver.engine
    free, free_pages, ps = list(driver.requests.free_rows), list(driver.pages.allocator.free), driver.page_size
    steps = rnd.randint(0, 2)
    runs = bool(free) and len(free_pages) * ps >= steps + 1
    found |= {HAND} if runs and engine.live_rows else set()
    if not runs:
        event("hand batch: no free row or slots")
        return
    row = rnd.choice(free)
    n = rnd.randint(1, min(8, len(free_pages) * ps - steps))
    prompt = [rnd.randrange(TINY_VOCAB) for _ in range(n)]
    slots = _page_slots(rnd.sample(free_pages, -(-(n + steps) // ps)), ps, n + steps)
    uid = HAND_UID
    req = Req(torch.tensor(prompt, dtype=torch.int32), row, 0, steps + 1, uid, SamplingParams(max_tokens=steps + 1))
    before, live_before = engine_state(engine, driver), dict(engine.live_rows)
    saved = engine.page_table[row].clone()
    engine.page_table[row, : n + steps] = torch.tensor(slots, dtype=torch.int32)
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    try:
        for phase in ["prefill"] + ["decode"] * steps:
            if tokens:
                req.append_host(tokens[-1])
            out = engine.forward_batch(*engine.prepare_batch([req], phase))  # type: ignore[arg-type]
            out.copy_done_event.synchronize()
            tokens.append(int(out.next_tokens_cpu[0]))
            logits.append(out.logits[0].detach().to("cpu", torch.float32))
            assert engine.live_rows.get(row) == (req.cached_len, uid), (
                f"after a {phase}, engine.live_rows[{row}] = {engine.live_rows.get(row)}, not {(req.cached_len, uid)}"
            )
    finally:
        engine.release_rows([row])
        engine.page_table[row] = saved
    assert engine.live_rows == live_before, "a hand-built batch changed the live rows of others"
    after = engine_state(engine, driver)
    assert torch.equal(before[1], after[1]) and before[3:] == after[3:], "a hand-built batch changed the driver's state"
    real = engine.num_pages * engine.config.page_size  # engine_state leaves the dummy page out
    others = torch.ones(real, dtype=torch.bool)
    others[slots] = False
    kv_before = before[0].view(kv_slot_view(engine)[:, :, :real].shape)
    assert torch.equal(kv_before[:, :, others], kv_slot_view(engine)[:, :, :real][:, :, others]), (
        "a hand-built batch wrote KV outside its own slots"
    )
    hand_runs.append((prompt, tokens, logits))


def _second_driver(driver: StaticDriver, fallback: tuple[str, dict[str, Any]], found: set[str]) -> None:
    """While the driver has running requests, a second StaticDriver on its engine is refused and takes nothing."""
    running = sorted(driver.running)
    if not running:
        _bad_driver_args(driver, fallback)
        return
    _rejects(driver, EngineBusyError, lambda: StaticDriver(driver.engine), "another StaticDriver",
             f"{len(running)} running request", f"uids {running[:8]}")
    found.add(SECOND)
    assert driver.engine.claimed_by is driver.claim, "a refused StaticDriver took the engine over"


def _bad_driver_args(driver: StaticDriver, args: tuple[str, dict[str, Any]]) -> None:
    where, kwargs = args
    name = next(iter(kwargs))
    if where == "driver":
        _rejects(driver, ConfigError, lambda: StaticDriver(driver.engine, **kwargs), f"{name}=")
    else:
        _rejects(driver, ConfigError, lambda: StaticDriver(driver.engine, PageLayout(**kwargs)), "PageLayout",
                 f"{name}=")


def _pages(driver: StaticDriver, tokens: int) -> int:
    return -(-tokens // driver.page_size)


def _bad_generate(driver: StaticDriver, op: Op, found: set[str]) -> None:
    _, prompt_list, params, error, needles, later = op
    if later:  # an eager admission of the good prompts before the bad one would have had a row and their pages
        first = len(prompt_list[0]) + 2
        room = bool(driver.requests.free_rows) and driver.pages.allocator.available >= _pages(driver, first)
        found |= {ROOM} if room else set()
    event(f"bad generate: {'later' if later else 'at once'}")
    _rejects(driver, error, lambda: driver.generate(prompt_list, params), *needles)


def _in_other_types(prompt: list[int], params: SamplingParams, chunks: tuple[int, ...], form: str) -> tuple[Any, ...]:
    """The same request as NumPy scalars and arrays and a Fraction; SamplingParams must normalize them to Python's."""
    given = SamplingParams(
        temperature=np.float32(params.temperature),
        top_k=np.int64(params.top_k),
        top_p=np.float64(params.top_p),
        min_p=Fraction(params.min_p),
        max_tokens=np.int64(params.max_tokens),
        ignore_eos=params.ignore_eos,
        seed=None if params.seed is None else np.uint64(params.seed),
    )
    for field in dataclasses.fields(SamplingParams):
        ours, theirs = getattr(given, field.name), getattr(params, field.name)
        assert ours == theirs and type(ours) is type(theirs), (
            f"SamplingParams.{field.name} from NumPy/Fraction is {ours!r} ({type(ours).__name__}), "
            f"not {theirs!r} ({type(theirs).__name__})"
        )
    ids: Any = np.array(prompt, dtype=np.int64) if form == "numpy array" else [np.int32(t) for t in prompt]
    return ids, given, tuple(np.int64(c) for c in chunks)


def _apply(
    driver: StaticDriver, op: Op, added: dict[int, tuple[list[int], int]], hand_runs: list[HandRun], found: set[str]
) -> None:
    kind = op[0]
    if kind == "add":
        _, prompt, params, chunks, form = op
        given = (prompt, params, chunks) if form == "python" else _in_other_types(prompt, params, chunks, form)
        event(f"add: {form}")
        try:
            uid = driver.add(*given)
        except CapacityError:
            event("CapacityError on a valid request")
            return
        added[uid] = (prompt, params.max_tokens)
    elif kind == "step":
        driver.step()
    elif kind == "abort":
        if driver.running:
            uid = sorted(driver.running)[op[1] % len(driver.running)]
            driver.abort(uid)
            del added[uid]
    elif kind == "bad params":
        name = next(iter(op[1]))
        _rejects(driver, InvalidRequestError, lambda: driver.add([1, 2], SamplingParams(**op[1])), f"{name}=")
    elif kind == "bad prompt":
        _rejects(driver, InvalidRequestError, lambda: driver.add(op[1], SamplingParams(max_tokens=2)))
    elif kind == "too long":
        _rejects(driver, InvalidRequestError, lambda: driver.add(op[1], SamplingParams(max_tokens=op[2])), "max_seq")
    elif kind == "bad chunks":
        _rejects(driver, InvalidRequestError, lambda: driver.add(op[1], SamplingParams(), op[2]), "chunk_sizes")
    elif kind == "unknown uid":
        call = driver.abort if op[1] == "abort" else driver.result
        _rejects(driver, InvalidRequestError, lambda: call(op[2]), f"uid {op[2]}")
    elif kind == "bad batch":
        event(f"bad batch: {op[1]}")
        _bad_batch(driver, op[1], op[2], found)
    elif kind == "alias outside the batch":
        _alias_outside_the_batch(driver, op[1], found)
    elif kind == "hand batch":
        _hand_batch(driver, op[1], hand_runs, found)
    elif kind == "bad generate":
        _bad_generate(driver, op, found)
    elif kind == "second driver":
        _second_driver(driver, op[1], found)
    elif kind == "bad driver args":
        _bad_driver_args(driver, op[1])
    else:
        raise AssertionError(f"unknown operation {op}")


def _hf_greedy(ref: HFOracle, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """n greedy tokens of the HF model by full forward passes, and the rows they were taken from.

    Not HFOracle.greedy: HF generate stops at the model's EOS token even with eos_token_id=None (transformers
    fills it in from generation_config.json), and the tiny models' EOS id 1 is an ordinary token here.
    """
    tokens, rows = list(prompt), []
    for _ in range(n):
        rows.append(ref.teacher_forced_logits(tokens)[-1])
        tokens.append(int(rows[-1].argmax()))
    return tokens[len(prompt) :], rows


@settings(max_examples=examples(8.0))  # cheap examples (tiny models, short requests): 200 under ci
@given(data=st.data())
@floors({LIVE_KV: 0.75, AIMED: 0.02, OUTSIDE: 0.12, HAND: 0.14, SECOND: 0.1, ROOM: 0.06})
def test_invalid_calls_are_rejected_and_change_nothing(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    page_sizes = [p for p in engines.target.page_sizes if p in FUZZ_PAGE_SIZES] or [min(engines.target.page_sizes)]
    layout = data.draw(layouts(TINY_VOCAB, page_sizes, max_churn=0), label="layout")
    page_size = layout.page_size
    engine = engines.get(tiny_models[arch], page_size, max_running_req=ROWS, num_pages=POOL_SLOTS // page_size)
    # A few valid requests are prefilled first, and still decode after that step, with a row left free, so the
    # calls that follow (and most later ones) meet live KV; then anything goes.
    first = data.draw(st.lists(add_operations(page_size, 2), min_size=1, max_size=ROWS - 1), label="first requests")
    ops = [
        *data.draw(st.lists(operations(page_size, FIRST_KINDS), min_size=1, max_size=3), label="first calls"),
        *data.draw(st.lists(operations(page_size), min_size=1, max_size=15), label="operations"),
    ]
    driver = StaticDriver(engine, layout.layout, record_logits=True)
    added: dict[int, tuple[list[int], int]] = {}
    hand_runs: list[HandRun] = []
    found: set[str] = set()
    for op in [*first, ("step",), *ops]:
        _apply(driver, op, added, hand_runs, found)
    for label in PER_EXAMPLE:
        exercised(label, label in found)
    driver.run()
    ref = oracle(tiny_models[arch])
    tol = logit_tolerance(engine.dtype)
    event(f"requests checked against HF: {min(len(added), 3)}{'+' if len(added) >= 3 else ''}")
    for uid, (prompt, n) in added.items():
        gen = driver.result(uid)
        expected, ref_rows = _hf_greedy(ref, prompt, n)
        result = compare_greedy(gen.output_ids, gen.logits, expected, ref_rows, tol)
        assert result.ok, f"request {uid}, prompt {prompt}: {result.failure}\n{NUMERICS_LAW}"
    for prompt, tokens, logits in hand_runs:
        expected, ref_rows = _hf_greedy(ref, prompt, len(tokens))
        result = compare_greedy(tokens, logits, expected, ref_rows, tol)
        assert result.ok, f"hand-built request, prompt {prompt}: {result.failure}\n{NUMERICS_LAW}"
