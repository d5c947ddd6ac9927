"""Property: invalid calls mixed into a valid workload are rejected with the engine's own errors and change nothing.

Each example draws a tiny model, a page size and layout, and a sequence of operations on one StaticDriver: valid
greedy requests, steps and aborts, mixed with invalid calls (bad SamplingParams, bad prompts, prompts too long,
bad chunkings, unknown uids, and hand-built batches through prepare_batch/forward_batch with bad rows, token ids,
lengths, phases, page-table slots, or a new token aimed at a live request's cached KV). The pool is small, so
valid requests also hit CapacityError.

Vacuity floors: 75% of the rejected calls meet live KV (a running request with cached tokens: the first invalid
call follows the prefill of 1-2 requests that are still decoding), and 60% of the batches aimed at a free row or at
a live request's KV find one (else they fall back to an out-of-range row).

Checks:
* every invalid call raises the expected EngineError subclass, never anything else (no IndexError from torch);
  a SamplingParams error names the offending field;
* after every rejected call the whole KV pool and page table are bitwise unchanged (so is the KV of every live
  request), and so is the driver's bookkeeping (rows, free pages, reservations, uids, request lengths);
* every request that ran to completion equals HF greedy generation (float64) on the same model, under the
  vLLM near-tie rule of oracle.tolerance; so the batches after each rejection were computed correctly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import (
    CapacityError,
    EngineError,
    InvalidRequestError,
    Req,
    SamplingParams,
)
from engine.driver import StaticDriver
from oracle.budget import examples
from oracle.checks import compare_greedy
from oracle.coverage import exercised
from oracle.drive import MAX_SEQ_LEN, TINY_VOCAB, EnginePool, continuous_archs
from oracle.hf import HFOracle
from oracle.strategies import layouts, prefix_splits, prompts, sampling_params
from oracle.tolerance import logit_tolerance

ROWS = 3  # max_running_req: small, so rows run out
POOL_SLOTS = 48  # KV slots in the pool: a few requests fill it, so pages run out too
FUZZ_PAGE_SIZES = (1, 2, 4)  # small pages: the pool of POOL_SLOTS slots still has many

Op = tuple[Any, ...]

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


@st.composite
def add_operations(draw: st.DrawFn, page_size: int, min_tokens: int = 1) -> Op:
    prompt = draw(prompts(TINY_VOCAB, 20, page_size))
    params = draw(sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(min_tokens, 8)))
    chunks = draw(st.one_of(st.just(()), prefix_splits(len(prompt))))
    return ("add", prompt, params, chunks)


INVALID_KINDS = ("bad params", "bad prompt", "too long", "bad chunks", "unknown uid", *["bad batch"] * 3)
OPERATION_KINDS = ("add", "add", "step", "step", "abort", *INVALID_KINDS)


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
    return ("step",)


# ---- state and rejection -------------------------------------------------------------------------------------
def _state(driver: StaticDriver) -> tuple[Any, ...]:
    engine, alloc = driver.engine, driver.allocator
    lengths = {u: (s.req.cached_len, s.req.device_len, len(s.req.input_ids), tuple(s.pages), tuple(s.chunks))
               for u, s in driver.running.items()}
    bookkeeping = (list(driver.free_rows), list(alloc.free), alloc.reserved, driver._next_uid, lengths,
                   sorted(driver.finished))
    return engine.kv_cache.buffer.clone(), engine.page_table.clone(), bookkeeping


def _rejects(driver: StaticDriver, error: type[EngineError], call: Callable[[], object], needle: str = "") -> None:
    live = any(s.req.cached_len > 0 for s in driver.running.values())
    exercised("a rejected call meets live KV (a running request with cached tokens)", live, floor=0.75)
    before = _state(driver)
    try:
        call()
    except EngineError as e:
        assert isinstance(e, error), f"{type(e).__name__} instead of {error.__name__}: {e}"
        assert needle in str(e), f"{needle!r} not named in: {e}"
    except Exception as e:  # noqa: BLE001 - anything but the engine's own errors is the failure under test
        raise AssertionError(f"{type(e).__name__} escaped instead of {error.__name__}: {e}") from e
    else:
        raise AssertionError(f"accepted instead of raising {error.__name__}")
    after = _state(driver)
    assert torch.equal(before[0], after[0]), "a rejected call changed the KV pool"
    assert torch.equal(before[1], after[1]), "a rejected call changed the page table"
    assert before[2] == after[2], "a rejected call changed the driver's bookkeeping"


def _bad_batch(driver: StaticDriver, kind: str, rnd: Any) -> None:
    """Build and submit one invalid hand-made batch (page-table writes of ours land in free rows only)."""
    engine = driver.engine
    tokens = [rnd.randrange(TINY_VOCAB) for _ in range(rnd.randint(1, 6))]
    row = rnd.randrange(ROWS)  # any row, live ones too: a missed check would then corrupt a live request
    params: Any = SamplingParams()
    phase: Any = "prefill"
    cached = 0
    free = list(driver.free_rows)
    decoding = [s for s in driver.running.values() if s.output_ids]
    if kind in ("bad slot", "new token over live KV"):
        runs = bool(free) if kind == "bad slot" else bool(free and decoding)
        exercised("a batch aimed at a free row or live KV finds one (else: row out of range)", runs, floor=0.6)
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
        copy = Req(live.input_ids.clone(), live.table_idx, live.cached_len, 1, live.uid, SamplingParams())
        victim = int(engine.page_table[live.table_idx, rnd.randrange(live.cached_len)])
        engine.page_table[free[0], 0] = victim
        reqs, phase = [copy, Req(torch.tensor([tokens[0]], dtype=torch.int32), free[0], 0, 1, 997, params)], "decode"
    try:
        _rejects(driver, InvalidRequestError, lambda: engine.forward_batch(*engine.prepare_batch(reqs, phase)))
    finally:
        if saved_rows is not None:
            engine.page_table[free] = saved_rows


def _apply(driver: StaticDriver, op: Op, added: dict[int, tuple[list[int], int]]) -> None:
    kind = op[0]
    if kind == "add":
        _, prompt, params, chunks = op
        try:
            uid = driver.add(prompt, params, chunks)
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
        _bad_batch(driver, op[1], op[2])
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
def test_invalid_calls_are_rejected_and_change_nothing(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    page_sizes = [p for p in engines.target.page_sizes if p in FUZZ_PAGE_SIZES] or [min(engines.target.page_sizes)]
    layout = data.draw(layouts(TINY_VOCAB, page_sizes, max_churn=0), label="layout")
    page_size = layout.page_size
    engine = engines.get(tiny_models[arch], page_size, max_running_req=ROWS, num_pages=POOL_SLOTS // page_size)
    # A few valid requests are prefilled first, and still decode after that step, with a row left free, so the
    # invalid call that follows (and most later ones) meets live KV; then anything goes.
    first = data.draw(st.lists(add_operations(page_size, 2), min_size=1, max_size=ROWS - 1), label="first requests")
    invalid = data.draw(operations(page_size, INVALID_KINDS), label="first invalid call")
    ops = [invalid, *data.draw(st.lists(operations(page_size), min_size=1, max_size=15), label="operations")]
    driver = StaticDriver(engine, layout.layout, record_logits=True)
    added: dict[int, tuple[list[int], int]] = {}
    for op in [*first, ("step",), *ops]:
        _apply(driver, op, added)
    driver.run()
    ref = oracle(tiny_models[arch])
    tol = logit_tolerance(engine.dtype)
    event(f"requests checked against HF: {min(len(added), 3)}{'+' if len(added) >= 3 else ''}")
    for uid, (prompt, n) in added.items():
        gen = driver.result(uid)
        expected, ref_rows = _hf_greedy(ref, prompt, n)
        result = compare_greedy(gen.output_ids, gen.logits, expected, ref_rows, tol)
        assert result.ok, f"request {uid}, prompt {prompt}: {result.failure}"
