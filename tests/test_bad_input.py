"""The bad-input catalogue, engine part: SamplingParams, the hand-driven Req/Batch path (prepare_batch and
forward_batch, the seed's style), the sampler's inputs and the engine's lifecycle. The driver, configuration,
model directories and CLIs have catalogues of their own (tests/test_bad_*.py).

Every case asserts the typed error, that its message names the field or request, that a rejected call changes no
state (KV pool, page table), and that a valid generation afterwards is bitwise equal to one before
(oracle.rejection.Contract).

Sampler policy (see engine/sample.py): a row with NaN or +inf logits, with every logit -inf, or whose
logits / temperature overflow float32 raises NonFiniteLogitsError naming the rows and request uids, before any
random draw, so the other rows, run again without it, get exactly the tokens they would have got.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import (
    Batch,
    Engine,
    EngineClosedError,
    EngineConfig,
    InvalidRequestError,
    NonFiniteLogitsError,
    Req,
    SamplingParams,
)
from engine.device import cpu_threads_for
from engine.driver import PageLayout, StaticDriver
from engine.sample import Sampler
from oracle.hf import HFOracle
from oracle.rejection import Contract, assert_same_state, engine_state, expect
from oracle.tolerance import logit_tolerance, logits_error

REPO = Path(__file__).resolve().parent.parent
VOCAB = 512  # every tiny model's vocabulary
ROWS = 4  # max_running_req of the test engine
ROW_SLOTS = 16  # row r of the page table maps positions [0, 16) to slots [16 r, 16 r + 16)
GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def cpu_config(model: Path, **kwargs: Any) -> EngineConfig:
    """The tests pin the CPU: on a GPU machine "auto" would pick CUDA and bfloat16, where HF parity is not exact."""
    return EngineConfig(str(model), **{"device": "cpu", **kwargs})


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _map_rows(engine: Engine) -> None:
    for r in range(ROWS):
        engine.page_table[r, :ROW_SLOTS] = r * ROW_SLOTS + torch.arange(ROW_SLOTS, dtype=torch.int32)


@pytest.fixture
def contract(qwen3: Path) -> Iterator[Contract]:
    """A fresh engine whose witness generation is taken first; then row r maps to its own ROW_SLOTS slots."""
    engine = Engine(
        cpu_config(qwen3, num_page_override=ROWS * ROW_SLOTS, max_running_req=ROWS, max_seq_len_override=64),
        sampler_seed=0,
    )
    contract = Contract.of(engine)
    _map_rows(engine)
    yield contract
    engine.shutdown()


@pytest.fixture(scope="module")
def idle(qwen3: Path) -> Iterator[Contract]:
    """An engine for calls that never reach one (SamplingParams): its generation must not change either."""
    engine = Engine(cpu_config(qwen3, num_page_override=64, max_running_req=4, max_seq_len_override=64))
    yield Contract.of(engine)
    engine.shutdown()


def make_req(ids: Any = (5, 6, 7), table_idx: Any = 0, cached_len: Any = 0, params: Any = GREEDY, uid: int = 0) -> Req:
    return Req(ids, table_idx, cached_len, 4, uid, params)


def run_batch(engine: Engine, reqs: list[Req], phase: Any = "prefill") -> torch.Tensor:
    batch, args = engine.prepare_batch(reqs, phase)
    return engine.forward_batch(batch, args).next_tokens_cpu


# ---- SamplingParams ------------------------------------------------------------------------------------------
SAMPLING_CASES: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"temperature": -0.5}, ("temperature=-0.5",)),
    ({"temperature": math.nan}, ("temperature=nan",)),
    ({"temperature": math.inf}, ("temperature=inf",)),
    ({"temperature": 1e-45}, ("temperature=1e-45", "use 0 for greedy")),  # a float32 subnormal: logits / T overflow
    ({"temperature": "0.7"}, ("temperature='0.7'",)),
    ({"temperature": None}, ("temperature=None",)),
    ({"temperature": True}, ("temperature=True",)),
    ({"temperature": 10**400}, ("temperature=1000",)),  # beyond float range
    ({"temperature": 1j}, ("temperature=1j",)),
    ({"temperature": torch.tensor(0.5)}, ("temperature=tensor(0.5000)",)),
    ({"temperature": np.float32(-1)}, ("temperature=",)),
    ({"top_p": 0.0}, ("top_p=0.0",)),
    ({"top_p": 1.5}, ("top_p=1.5",)),
    ({"top_p": math.nan}, ("top_p=nan",)),
    ({"top_p": "0.9"}, ("top_p='0.9'",)),
    ({"top_p": np.float64(-0.5)}, ("top_p=",)),
    ({"top_k": 0}, ("top_k=0", "-1 to disable")),
    ({"top_k": -2}, ("top_k=-2", "-1 to disable")),
    ({"top_k": 2.5}, ("top_k=2.5",)),
    ({"top_k": 3.0}, ("top_k=3.0",)),  # a float, even a whole one, is not a count
    ({"top_k": True}, ("top_k=True",)),
    ({"top_k": np.float32(3)}, ("top_k=",)),
    ({"top_k": np.int64(0)}, ("top_k=",)),
    ({"min_p": -0.1}, ("min_p=-0.1",)),
    ({"min_p": 1.5}, ("min_p=1.5",)),
    ({"min_p": None}, ("min_p=None",)),
    ({"min_p": math.nan}, ("min_p=nan",)),
    ({"max_tokens": 0}, ("max_tokens=0",)),
    ({"max_tokens": -3}, ("max_tokens=-3",)),
    ({"max_tokens": 2.0}, ("max_tokens=2.0",)),
    ({"max_tokens": "4"}, ("max_tokens='4'",)),
    ({"max_tokens": False}, ("max_tokens=False",)),
    ({"seed": "42"}, ("seed='42'",)),
    ({"seed": 1.5}, ("seed=1.5",)),
    ({"seed": -1}, ("seed=-1",)),
    ({"seed": 2**63}, (f"seed={2**63}",)),
    ({"seed": True}, ("seed=True",)),
    ({"ignore_eos": "yes"}, ("ignore_eos='yes'",)),
    ({"ignore_eos": 1}, ("ignore_eos=1",)),
    ({"ignore_eos": None}, ("ignore_eos=None",)),
    ({"ignore_eos": np.bool_(True)}, ("ignore_eos=",)),
]


@pytest.mark.parametrize("kwargs,needles", SAMPLING_CASES, ids=[repr(k) for k, _ in SAMPLING_CASES])
def test_sampling_params_rejected(idle: Contract, kwargs: dict[str, Any], needles: tuple[str, ...]) -> None:
    error = idle.rejects(InvalidRequestError, lambda: SamplingParams(**kwargs), *needles, "is invalid")
    assert isinstance(error, ValueError)  # callers that catch ValueError keep working


NUMPY_PARAMS = [
    ({"temperature": np.float32(0.7)}, {"temperature": float(np.float32(0.7))}),
    ({"temperature": np.float16(1.5), "top_k": np.int64(20)}, {"temperature": 1.5, "top_k": 20}),
    ({"top_p": np.float64(0.9), "min_p": Fraction(1, 20)}, {"top_p": 0.9, "min_p": 0.05}),
    ({"seed": np.uint32(7), "max_tokens": np.int8(3)}, {"seed": 7, "max_tokens": 3}),
    ({"temperature": 1, "top_k": np.int32(5), "seed": np.int64(2**62)},
     {"temperature": 1.0, "top_k": 5, "seed": 2**62}),
]


@pytest.mark.parametrize("given,plain", NUMPY_PARAMS, ids=[repr(g) for g, _ in NUMPY_PARAMS])
def test_numpy_and_fraction_params_are_accepted_as_python_numbers(
    idle: Contract, given: dict[str, Any], plain: dict[str, Any]
) -> None:
    base = {"temperature": 0.8, "max_tokens": 4, "ignore_eos": True, "seed": 5}
    odd, expected = SamplingParams(**{**base, **given}), SamplingParams(**{**base, **plain})
    assert odd == expected
    assert all(type(getattr(odd, k)) is type(getattr(expected, k)) for k in plain)
    driver = StaticDriver(idle.engine)
    (a,), (b,) = driver.generate([[3, 1, 4]], odd), driver.generate([[3, 1, 4]], expected)
    assert a.output_ids == b.output_ids


# ---- requests, by hand through prepare_batch -----------------------------------------------------------------
def _long_prompt_req(engine: Engine) -> list[Req]:
    engine.page_table[0, :] = torch.arange(engine.max_seq_len, dtype=torch.int32)
    return [make_req(list(range(engine.max_seq_len + 1)))]


REQUEST_CASES: list[tuple[str, Callable[[Engine], list[Req]], str, tuple[str, ...]]] = [
    ("empty prompt", lambda e: [make_req(torch.zeros(0, dtype=torch.int32))], "prefill", ("empty",)),
    ("token id = vocab", lambda e: [make_req((5, VOCAB, 7))], "prefill", (f"token id {VOCAB}", "[0, 512)")),
    ("negative token id", lambda e: [make_req((5, -1, 7))], "prefill", ("token id -1",)),
    ("table_idx = max_running_req", lambda e: [make_req(table_idx=ROWS)], "prefill", ("table_idx=4", "[0, 4)")),
    ("negative table_idx", lambda e: [make_req(table_idx=-1)], "prefill", ("table_idx=-1",)),
    ("float table_idx", lambda e: [make_req(table_idx=1.5)], "prefill", ("table_idx=1.5",)),
    ("bool table_idx", lambda e: [make_req(table_idx=True)], "prefill", ("table_idx=True",)),
    ("None table_idx", lambda e: [make_req(table_idx=None)], "prefill", ("table_idx=None",)),
    ("table_idx twice", lambda e: [make_req(uid=1), make_req(uid=2)], "prefill", ("table_idx=0", "twice")),
    ("cached_len > device_len", lambda e: [make_req(cached_len=5)], "prefill", ("cached_len=5", "device_len=3")),
    ("cached_len = device_len", lambda e: [make_req(cached_len=3)], "prefill", ("cached_len=3",)),
    ("negative cached_len", lambda e: [make_req(cached_len=-1)], "prefill", ("cached_len=-1",)),
    ("float cached_len", lambda e: [make_req(cached_len=0.0)], "prefill", ("cached_len=0.0",)),
    ("prompt > max_seq_len", _long_prompt_req, "prefill", ("65 tokens", "max_seq_len=64")),
    ("decode of 3 tokens", lambda e: [make_req()], "decode", ("extend_len=3",)),
    ("bad phase", lambda e: [make_req()], "extend", ("phase='extend'",)),
    ("phase None", lambda e: [make_req()], None, ("phase=None",)),
    ("no requests", lambda e: [], "prefill", ("at least one request",)),
    ("not a Req", lambda e: [None], "prefill", ("batch entry 0", "NoneType")),  # type: ignore[list-item]
    ("a later entry not a Req", lambda e: [make_req(), "req"], "prefill", ("batch entry 1", "str")),  # type: ignore[list-item]
    ("reqs a generator", lambda e: (r for r in [make_req()]), "prefill", ("list or tuple", "generator")),  # type: ignore[return-value]
    ("params not SamplingParams", lambda e: [make_req(params={"temperature": 0})], "prefill", ("sampling_params",)),
    ("params None", lambda e: [make_req(params=None)], "prefill", ("sampling_params", "NoneType")),
]


@pytest.mark.parametrize("name,build,phase,needles", REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_bad_request_rejected_before_any_write(
    contract: Contract, name: str, build: Callable[[Engine], list[Req]], phase: str, needles: tuple[str, ...]
) -> None:
    reqs = build(contract.engine)
    lens = [(r.cached_len, r.device_len) for r in reqs if isinstance(r, Req)] if isinstance(reqs, list) else []
    contract.rejects(InvalidRequestError, lambda: run_batch(contract.engine, reqs, phase), *needles)
    if isinstance(reqs, list):
        assert [(r.cached_len, r.device_len) for r in reqs if isinstance(r, Req)] == lens


BAD_IDS = [
    ("float tensor", torch.tensor([5.0, 6.0]), ("request 0: input_ids", "torch.float32")),
    ("bool tensor", torch.tensor([True, False]), ("request 0: input_ids", "torch.bool")),
    ("2-D tensor", torch.tensor([[5, 6]]), ("request 0: input_ids", "(1, 2)")),
    ("float in a list", [5, 6.0], ("request 0: input_ids", "6.0", "index 1")),
    ("None in a list", [5, None], ("request 0: input_ids", "None", "index 1")),
    ("a string", "56", ("request 0: input_ids", "str")),
    ("float array", np.array([1.0, 2.0]), ("request 0: input_ids", "torch.float64")),
]


@pytest.mark.parametrize("name,ids,needles", BAD_IDS, ids=[c[0] for c in BAD_IDS])
def test_a_request_with_bad_ids_is_refused_when_built(name: str, ids: Any, needles: tuple[str, ...]) -> None:
    """Req keeps its tokens as one list of ints, converted (and type-checked) when it is built."""
    expect(InvalidRequestError, lambda: make_req(ids), *needles)


@pytest.mark.parametrize(
    "ids", [[5, 6, 7], (5, 6, 7), torch.tensor([5, 6, 7], dtype=torch.int16), np.array([5, 6, 7], dtype=np.uint8),
            [np.int64(5), np.int32(6), 7]],
    ids=["list", "tuple", "int16 tensor", "uint8 array", "NumPy ints"],
)
def test_any_integer_ids_make_the_same_request(contract: Contract, ids: Any) -> None:
    plain = run_batch(contract.engine, [make_req(torch.tensor([5, 6, 7], dtype=torch.int32), table_idx=0, uid=0)])
    req = make_req(ids, table_idx=1, uid=1)
    assert req.token_ids == [5, 6, 7] and all(type(t) is int for t in req.token_ids)
    assert torch.equal(run_batch(contract.engine, [req]), plain)


SLOT_CASES = [
    ("slot past the pool", [0, 1, 10**6], ("page_table[0, 2] = 1000000", "not a KV slot")),
    ("negative slot", [0, 1, -1], ("page_table[0, 2] = -1",)),
    ("slot in the dummy page", [0, 1, ROWS * ROW_SLOTS], (f"page_table[0, 2] = {ROWS * ROW_SLOTS}",)),
    ("two tokens, one slot", [0, 1, 1], ("page_table[0, 2] = 1", "overwrite")),
    ("three tokens, one slot", [7, 7, 7], ("page_table[0, 1] = 7", "another new token")),
]


@pytest.mark.parametrize("name,slots,needles", SLOT_CASES, ids=[c[0] for c in SLOT_CASES])
def test_bad_page_table_slots_rejected(
    contract: Contract, name: str, slots: list[int], needles: tuple[str, ...]
) -> None:
    contract.engine.page_table[0, :3] = torch.tensor(slots, dtype=torch.int32)
    contract.rejects(InvalidRequestError, lambda: run_batch(contract.engine, [make_req()]), *needles)


def test_a_step_run_to_given_ends_is_undone_to_the_lengths_before_them(contract: Contract) -> None:
    """prepare_batch(ends=...) checks the batch at its ends and leaves the requests alone; forward_batch sets each
    device_len as it runs, and the step's undo (here: a refused page table) puts back what the request held
    before, not the chunk end."""
    engine = contract.engine
    engine.page_table[0, :3] = torch.tensor([0, 1, 10**6], dtype=torch.int32)
    req = make_req((5, 6, 7, 8, 9))
    batch, args = engine.prepare_batch([req], "prefill", ends=[3])
    assert (req.cached_len, req.device_len) == (0, 5) and batch.spans == [(0, 5)] and batch.ends == [3]
    out = engine.forward_batch(batch, args)
    assert (req.cached_len, req.device_len) == (3, 3)
    expect(InvalidRequestError, out.result, "page_table[0, 2] = 1000000", "not a KV slot")
    assert (req.cached_len, req.device_len) == (0, 5)


ENDS_CASES = [
    ("one end too few", [], ("ends must be a list of 1 ints",)),
    ("not a list", 3, ("ends must be a list of 1 ints",)),
    ("a float end", [2.0], ("ends must hold ints", "float")),
    ("past max_seq_len", [65], ("65 tokens exceed max_seq_len=64",)),
    ("not past cached_len", [0], ("cached_len=0 must be in [0, device_len=0)",)),
]


@pytest.mark.parametrize("name,ends,needles", ENDS_CASES, ids=[c[0] for c in ENDS_CASES])
def test_bad_ends_are_rejected_and_leave_the_request_alone(
    contract: Contract, name: str, ends: Any, needles: tuple[str, ...]
) -> None:
    req = make_req((5, 6, 7, 8, 9))
    contract.rejects(InvalidRequestError, lambda: contract.engine.prepare_batch([req], "prefill", ends=ends), *needles)
    assert (req.cached_len, req.device_len) == (0, 5)


PAGE_STRUCTURE_CASES = [
    ("offset off by one", [1, 2, 3, 4, 5], (0, "= 1", "slot 0")),
    ("two pages in one block", [0, 1, 6, 7, 8], (2, "= 6", "slot 2")),
    ("a block starting mid-page", [4, 5, 6, 7, 9], (4, "= 9", "slot 8")),
    ("token-granular slots", [8, 3, 14, 0, 1], (1, "= 3", "slot 9")),
]


@pytest.mark.parametrize("name,slots,expected", PAGE_STRUCTURE_CASES, ids=[c[0] for c in PAGE_STRUCTURE_CASES])
def test_rows_must_keep_the_page_structure(
    qwen3: Path, name: str, slots: list[int], expected: tuple[int, str, str]
) -> None:
    """Paged kernels (FlashInfer) read whole pages, so with page_size 4 position j must be at offset j % 4 of the
    page its block starts on; the torch backend would compute these rows right, FlashInfer wrong."""
    engine = Engine(cpu_config(qwen3, page_size=4, num_page_override=16, max_running_req=2, max_seq_len_override=32))
    contract = Contract.of(engine)
    engine.page_table[0, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    pos, value, slot = expected
    contract.rejects(InvalidRequestError, lambda: run_batch(engine, [make_req((1, 2, 3, 4, 5))]),
                     f"page_table[0, {pos}] {value}", "breaks the page structure", f"must be {slot}")
    engine.shutdown()


def test_new_token_may_not_overwrite_cached_kv_of_another_request(contract: Contract) -> None:
    engine = contract.engine
    first = make_req((5, 6, 7), table_idx=0, uid=10)
    run_batch(engine, [first])  # its KV now lives in slots 0..2
    first.append_host(torch.tensor(9))
    engine.page_table[1, :2] = torch.tensor([20, 1], dtype=torch.int32)  # position 1 of row 1 → slot 1: cached KV
    intruder = make_req((3, 4), table_idx=1, uid=11)
    contract.rejects(
        InvalidRequestError,
        lambda: run_batch(engine, [first, intruder], "prefill"),
        "request 11",
        "page_table[1, 1] = 1",
        "cached KV of request 10",
    )


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_write_over_a_live_request_outside_the_batch_is_refused(contract: Contract, phase: str) -> None:
    """The seed's hand-driven loop: request 10 (row 0) is live but not in this batch; a column of row 1 that
    still aliases one of its slots would overwrite its KV, until its row is released."""
    engine = contract.engine
    live = make_req((5, 6, 7, 8), table_idx=0, uid=10)
    run_batch(engine, [live])
    live.append_host(3)
    other = make_req((1, 2), table_idx=1, uid=11)
    if phase == "decode":
        run_batch(engine, [other])
        other.append_host(4)
    column = other.device_len - 1
    engine.page_table[1, column] = 2  # slot 2 holds request 10's KV of position 2
    kv_before = _live_kv(engine, live)
    contract.rejects(
        InvalidRequestError, lambda: run_batch(engine, [other], phase), "request 11", f"page_table[1, {column}] = 2",
        "request 10", "row 0", "release_rows([0])",
    )
    engine.release_rows([0])  # request 10 is done: its slots may be written again
    _map_rows(engine)
    engine.page_table[1, column] = 2
    run_batch(engine, [other], phase)
    assert not torch.equal(kv_before, _live_kv(engine, live)), "the write did not reach slot 2"


def test_a_new_request_in_a_live_row_is_refused_until_the_row_is_released(contract: Contract) -> None:
    """Without release, a new request in row 0 would write its prompt over request 10's KV, in the same slots."""
    engine = contract.engine
    live = make_req((5, 6, 7, 8), table_idx=0, uid=10)
    run_batch(engine, [live])
    newcomer = make_req((1, 2), table_idx=0, uid=11)
    for _ in range(2):  # before and after its owner writes there again
        state = engine_state(engine)
        expect(InvalidRequestError, lambda: run_batch(engine, [newcomer]), "request 11", "row 0",
               "live KV of request 10", "release_rows([0])")
        assert_same_state(state, engine_state(engine))
        live.append_host(3)
        run_batch(engine, [live], "decode")  # the owner may
    engine.release_rows([0])
    run_batch(engine, [newcomer])
    contract.still_generates()


def _live_kv(engine: Engine, req: Req) -> torch.Tensor:
    """The layer-0 keys of request `req`'s cached positions, as the pool holds them."""
    return engine.kv_cache.k_slots(0)[engine.page_table[req.table_idx, : req.cached_len].long()].clone()


def test_a_batch_runs_once(contract: Contract) -> None:
    req = make_req()
    batch, args = contract.engine.prepare_batch([req], "prefill")
    contract.engine.forward_batch(batch, args)
    state = (req.cached_len, req.device_len)
    contract.rejects(InvalidRequestError, lambda: contract.engine.forward_batch(batch, args), "stale", "prepare_batch")
    assert (req.cached_len, req.device_len) == state


FORWARD_ARGUMENT_CASES: list[tuple[str, Callable[[Any, Any, Any], tuple[Any, Any]], tuple[str, ...]]] = [
    ("args None", lambda b, a, other: (b, None), ("args", "BatchSamplingArgs", "NoneType")),
    ("batch None", lambda b, a, other: (None, a), ("batch", "Batch", "NoneType")),
    ("batch a list of Req", lambda b, a, other: (b.reqs, a), ("batch", "list")),
    ("args a dict", lambda b, a, other: (b, {"all_greedy": True}), ("args", "dict")),
    ("args of another batch", lambda b, a, other: (b, other[1]), ("args were built for requests [1]", "[0]")),
    ("a batch not from prepare_batch", lambda b, a, other: (Batch(b.reqs, "prefill"), a), ("stale", "prepare_batch")),
]


@pytest.mark.parametrize("name,pick,needles", FORWARD_ARGUMENT_CASES, ids=[c[0] for c in FORWARD_ARGUMENT_CASES])
def test_forward_batch_arguments(
    contract: Contract, name: str, pick: Callable[[Any, Any, Any], tuple[Any, Any]], needles: tuple[str, ...]
) -> None:
    engine = contract.engine
    req = make_req(uid=0)
    batch, args = engine.prepare_batch([req], "prefill")
    other = engine.prepare_batch([make_req(table_idx=1, uid=1)], "prefill")
    contract.rejects(InvalidRequestError, lambda: engine.forward_batch(*pick(batch, args, other)), *needles)
    assert (req.cached_len, req.device_len) == (0, 3)


def test_a_decode_step_reads_a_pending_token_on_the_device(contract: Contract) -> None:
    """Right after the step that sampled it, a token need not be appended: the engine keeps each row's last token
    on the device, and the decode step is the one append_host would have run."""
    engine = contract.engine
    pending, appended = make_req(uid=1, table_idx=0), make_req(uid=2, table_idx=1)
    first = run_batch(engine, [pending, appended])
    appended.append_host(int(first[1]))
    assert pending.token_pending and not appended.token_pending
    batch, args = engine.prepare_batch([pending, appended], "decode")
    out = engine.forward_batch(batch, args)
    out.result()
    assert int(first[0]) == int(first[1]) != 0  # a pending id read as 0 would change the logits
    # One input, two rows of a batch: equal up to the rows' own rounding (a CPU GEMM on 2 threads splits them apart).
    assert logits_error(out.logits[0], out.logits[1]) <= logit_tolerance(engine.dtype).bound(out.logits[1])


def test_a_pending_token_is_refused_once_its_row_moved_on(contract: Contract) -> None:
    """Once its row is released (or another request ran there) the device no longer holds the request's token."""
    req = make_req()
    run_batch(contract.engine, [req])  # device_len is now 4, but the sampled token was not appended
    contract.engine.release_rows([0])
    contract.rejects(InvalidRequestError, lambda: run_batch(contract.engine, [req], "decode"), "device_len=4",
                     "append_host")


def test_numpy_ints_in_a_hand_built_request_are_accepted(contract: Contract) -> None:
    plain = run_batch(contract.engine, [make_req((5, 6, 7), table_idx=0, uid=0)])
    odd = run_batch(contract.engine, [make_req((5, 6, 7), table_idx=np.int64(1), cached_len=np.int32(0), uid=1)])
    assert torch.equal(plain, odd)


# ---- the demo script ---------------------------------------------------------------------------------------
def test_demo_without_tokenizer_prints_one_line_and_fails(qwen3: Path) -> None:
    # transformers 5 quietly builds an empty tokenizer for a dir without one; the demo must refuse instead.
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "drive_engine.py"), "--model", str(qwen3), "--max-tokens", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert lines[-2].startswith("error: ") and "has no tokenizer" in lines[-2] and str(qwen3) in lines[-2]
    assert lines[-1].startswith("hint: ")


# ---- sampler inputs ------------------------------------------------------------------------------------------
def _args(sampler: Sampler, params: list[SamplingParams]) -> Any:
    reqs = [Req(torch.zeros(3, dtype=torch.int32), i, 0, 1, 100 + i, p) for i, p in enumerate(params)]
    return sampler.prepare(Batch(reqs, "decode"))


SAMPLED = SamplingParams(temperature=1.0, top_p=0.95)
BAD_ROWS = [
    ("NaN", torch.full((8,), math.nan), "NaN logits"),
    ("one NaN", torch.tensor([1.0, math.nan, 0, 0, 0, 0, 0, 0]), "NaN logits"),
    ("+inf", torch.tensor([math.inf, 1.0, 0, 0, 0, 0, 0, 0]), "+inf logits"),
    ("all -inf", torch.full((8,), -math.inf), "every logit -inf"),
]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name,bad_row,needle", BAD_ROWS, ids=[r[0] for r in BAD_ROWS])
def test_unsampleable_row_raises_and_leaves_other_rows_alone(
    idle: Contract, name: str, bad_row: torch.Tensor, needle: str, params: SamplingParams
) -> None:
    good = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    logits = torch.cat([good[:1], bad_row[None], good[1:]])
    sampler = Sampler(torch.device("cpu"), 8, seed=5)
    error = idle.rejects(
        NonFiniteLogitsError, lambda: sampler.sample(logits, _args(sampler, [SAMPLED, params, SAMPLED, SAMPLED])),
        "request(s) [101]", "batch rows [1]", needle,
    )
    assert isinstance(error, NonFiniteLogitsError) and error.uids == [101] and error.rows == [1]
    # The failed call drew no noise: the other rows, run again, get what a fresh sampler gives them.
    again = sampler.sample(good, _args(sampler, [SAMPLED] * 3))
    fresh = Sampler(torch.device("cpu"), 8, seed=5)
    assert torch.equal(again, fresh.sample(good, _args(fresh, [SAMPLED] * 3)))


def test_temperature_overflow_raises(idle: Contract) -> None:
    sampler = Sampler(torch.device("cpu"), 8, seed=0)
    logits = torch.tensor([[1000.0, 999.0, 0, 0, 0, 0, 0, 0]])
    tiny = SamplingParams(temperature=1e-37)
    idle.rejects(NonFiniteLogitsError, lambda: sampler.sample(logits, _args(sampler, [tiny])), "temperature=",
                 "overflow")


def test_masked_tokens_are_never_sampled() -> None:
    """Rows that are partly -inf are valid: every draw is a finite-logit token inside the vocabulary."""
    sampler = Sampler(torch.device("cpu"), 8, seed=3)
    row = torch.tensor([-math.inf, 0.5, -math.inf, 0.1, -math.inf, -math.inf, 2.0, -math.inf])
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in
              [(1.0, -1, 1.0, 0.0), (5.0, 3, 1.0, 0.0), (2.0, -1, 0.99, 0.0), (1.0, 7, 0.5, 0.01), (0.0, -1, 1.0, 0.0)]]
    batch_params = params * 400
    tokens = sampler.sample(row.expand(len(batch_params), 8).contiguous(), _args(sampler, batch_params))
    assert set(tokens.tolist()) <= {1, 3, 6}


LOGITS_SHAPE_CASES = [
    ("more rows than requests", torch.zeros(2, 8), "(2, 8)"),
    ("a narrower vocab", torch.zeros(1, 5), "vocab 8"),
    ("1-D logits", torch.zeros(8), "(8,)"),
]


@pytest.mark.parametrize("name,logits,needle", LOGITS_SHAPE_CASES, ids=[c[0] for c in LOGITS_SHAPE_CASES])
def test_logits_shape_must_match_the_batch(idle: Contract, name: str, logits: torch.Tensor, needle: str) -> None:
    sampler = Sampler(torch.device("cpu"), 8, seed=0)
    idle.rejects(InvalidRequestError, lambda: sampler.sample(logits, _args(sampler, [GREEDY])), needle)


def test_engine_names_the_request_with_nan_logits(contract: Contract, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = contract.engine
    forward = engine.model.forward

    def nan_in_second_row(*args: Any) -> torch.Tensor:
        logits = forward(*args)
        logits[1] = math.nan
        return logits

    monkeypatch.setattr(engine.model, "forward", nan_in_second_row)
    reqs = [make_req((5, 6), table_idx=0, uid=7), make_req((8, 9), table_idx=1, uid=8)]
    error = expect(NonFiniteLogitsError, lambda: run_batch(engine, reqs), "request(s) [8]", "NaN logits")
    assert isinstance(error, NonFiniteLogitsError) and error.uids == [8]
    assert [(r.cached_len, r.device_len) for r in reqs] == [(0, 2), (0, 2)]  # neither request advanced
    monkeypatch.undo()
    contract.still_generates()


def test_forward_batch_returns_at_once_and_the_error_comes_with_the_host_tokens(
    contract: Contract, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's forward_batch: the requests advance before the tokens are read; result() finds the -1 row, puts
    the step back (requests, live rows, the engine's generator) and raises, so the others run again as if it
    never ran."""
    engine = contract.engine
    forward = engine.model.forward
    sampled = SamplingParams(temperature=100.0, max_tokens=4)  # unseeded and near uniform: the noise decides
    reqs = [make_req((5, 6), table_idx=0, uid=7, params=sampled), make_req((8, 9), table_idx=1, uid=8, params=sampled)]
    nan_row = torch.tensor([1])
    monkeypatch.setattr(engine.model, "forward", lambda *args: forward(*args).index_fill_(0, nan_row, math.nan))
    engine.sampler.reseed(3)
    out = engine.forward_batch(*engine.prepare_batch(reqs, "prefill"))
    assert [(r.cached_len, r.device_len) for r in reqs] == [(2, 3), (2, 3)]  # advanced, not yet checked
    assert out.next_tokens_gpu.tolist()[1] == -1
    expect(NonFiniteLogitsError, out.result, "request(s) [8]", "NaN logits")
    assert [(r.cached_len, r.device_len) for r in reqs] == [(0, 2), (0, 2)] and not engine.live_rows
    monkeypatch.undo()
    again = run_batch(engine, reqs[:1])
    engine.sampler.reseed(3)
    fresh = run_batch(engine, [make_req((5, 6), table_idx=2, uid=9, params=sampled)])
    assert torch.equal(again, fresh), "the failed step's draw was not undone"
    contract.still_generates()


# ---- lifecycle -----------------------------------------------------------------------------------------------
def test_shutdown_twice_then_every_use_is_refused(contract: Contract) -> None:
    engine = contract.engine
    req = make_req()
    batch, args = engine.prepare_batch([req], "prefill")
    driver = StaticDriver(engine)
    engine.shutdown()
    engine.shutdown()
    expect(EngineClosedError, lambda: engine.prepare_batch([make_req()], "prefill"), "shut down")
    expect(EngineClosedError, lambda: engine.forward_batch(batch, args), "shut down")
    expect(EngineClosedError, lambda: driver.add([1, 2], GREEDY), "shut down")
    expect(EngineClosedError, driver.step, "shut down")
    expect(EngineClosedError, lambda: driver.generate([[1]], GREEDY), "shut down")
    expect(EngineClosedError, lambda: StaticDriver(engine), "shut down")
    assert (req.cached_len, req.device_len) == (0, 3)


def test_release_rows_after_shutdown_is_refused(contract: Contract) -> None:
    contract.engine.shutdown()
    expect(EngineClosedError, lambda: contract.engine.release_rows([0]), "shut down")


def test_an_engine_collected_without_shutdown_gives_the_thread_count_back(
    qwen3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # set: the engine would leave the count alone
    before = torch.get_num_threads()
    sentinel = 3 if cpu_threads_for(1) != 3 else 5
    torch.set_num_threads(sentinel)
    try:
        engine = Engine(cpu_config(qwen3, num_page_override=8))
        assert torch.get_num_threads() == cpu_threads_for(1) != sentinel
        del engine
        gc.collect()
        assert torch.get_num_threads() == sentinel, "a dropped engine pinned the thread count"
    finally:
        torch.set_num_threads(before)


def test_context_manager_shuts_down(qwen3: Path) -> None:
    with Engine(cpu_config(qwen3, num_page_override=8)) as eng:
        StaticDriver(eng).generate([[1, 2]], GREEDY)
    expect(EngineClosedError, lambda: StaticDriver(eng), "shut down")


def test_two_engines_interleaved_are_both_correct(tiny_models: dict[str, Path]) -> None:
    """There is no global state: two engines (different models, page sizes, layouts) step in turn."""
    setups = [("qwen3", 1, PageLayout("shuffled", 1)), ("llama", 4, PageLayout("interleaved"))]
    drivers, expected = [], []
    for i, (arch, page_size, layout) in enumerate(setups):
        eng = Engine(cpu_config(tiny_models[arch], page_size=page_size, num_page_override=64, max_running_req=3))
        driver = StaticDriver(eng, layout)
        prompts = [_prompt(10 * i + j, 3 + 4 * j) for j in range(3)]
        uids = [driver.add(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
        ref = HFOracle(tiny_models[arch], dtype=torch.float32)
        drivers.append(driver)
        expected.append({u: ref.greedy(p, 8) for u, p in zip(uids, prompts)})
    while any(d.running for d in drivers):
        for driver in drivers:
            driver.step()
    for driver, want in zip(drivers, expected):
        assert {u: driver.result(u).output_ids for u in want} == want
        driver.engine.shutdown()
