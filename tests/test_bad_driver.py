"""The bad-input catalogue, driver part: StaticDriver.add/abort/result/generate, capacity, non-finite logits, and
one driver and one thread at a time.

Every rejected call is checked by oracle.rejection.Contract: the typed error naming the field or request, the
KV pool, page table and driver bookkeeping unchanged, and a valid generation through the same driver afterwards
bitwise equal to one before.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import (
    CapacityError,
    Engine,
    EngineBusyError,
    EngineConfig,
    EngineError,
    InvalidRequestError,
    SamplingParams,
)
from engine.driver import PageLayout, StaticDriver
from oracle.pytest_plugin import OraclePool
from oracle.rejection import Contract, engine_state, expect

VOCAB = 512  # every tiny model's vocabulary
ROWS = 4
GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def _engine(model: Path, **kwargs: Any) -> Engine:
    config = {"device": "cpu", "num_page_override": 64, "max_running_req": ROWS, "max_seq_len_override": 64, **kwargs}
    return Engine(EngineConfig(str(model), **config), sampler_seed=0)


@pytest.fixture
def contract(qwen3: Path) -> Iterator[Contract]:
    engine = _engine(qwen3)
    yield Contract.of(engine)
    engine.shutdown()


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---- add ---------------------------------------------------------------------------------------------------
ADD_CASES: list[tuple[str, Any, Any, Any, tuple[str, ...]]] = [
    ("prompt + max_tokens > max_seq_len", [1] * 60, SamplingParams(max_tokens=8), (), ("68", "max_seq_len=64")),
    ("token id >= vocab", [1, VOCAB + 3], GREEDY, (), (f"token id {VOCAB + 3}",)),
    ("token id beyond int32", torch.tensor([2**32 + 5]), GREEDY, (), (str(2**32 + 5),)),  # would wrap to 5
    ("numpy id beyond vocab", [np.int64(VOCAB)], GREEDY, (), (f"token id {VOCAB}",)),
    ("negative token id", [3, -7], GREEDY, (), ("token id -7",)),
    ("float token ids", [1.7, 2.2], GREEDY, (), ("1.7",)),  # would truncate to 1, 2
    ("numpy float token id", [np.float32(3.0)], GREEDY, (), ("3.0",)),
    ("bool token ids", [True, False], GREEDY, (), ("True",)),
    ("None token id", [1, None], GREEDY, (), ("None",)),
    ("string prompt", "hello", GREEDY, (), ("str",)),
    ("bytes prompt", b"\x01\x02", GREEDY, (), ("bytes",)),
    ("None prompt", None, GREEDY, (), ("NoneType",)),
    ("int prompt", 5, GREEDY, (), ("int",)),
    ("dict prompt", {0: 1}, GREEDY, (), ("dict",)),
    ("set prompt", {1, 2}, GREEDY, (), ("set",)),
    ("nested prompt", [[1, 2], [3, 4]], GREEDY, (), ("[1, 2]",)),
    ("2-D tensor prompt", torch.ones(2, 2, dtype=torch.int64), GREEDY, (), ("(2, 2)",)),
    ("0-D tensor prompt", torch.tensor(3), GREEDY, (), ("shape ()",)),
    ("float tensor prompt", torch.tensor([1.0, 2.0]), GREEDY, (), ("torch.float32",)),
    ("bool tensor prompt", torch.tensor([True]), GREEDY, (), ("torch.bool",)),
    ("complex tensor prompt", torch.tensor([1 + 0j]), GREEDY, (), ("complex",)),
    ("float numpy prompt", np.array([1.0, 2.0]), GREEDY, (), ("torch.float64",)),
    ("2-D numpy prompt", np.ones((2, 2), dtype=np.int64), GREEDY, (), ("(2, 2)",)),
    ("object numpy prompt", np.array([1, "a"], dtype=object), GREEDY, (), ("dtype object",)),
    ("empty prompt", [], GREEDY, (), ("empty",)),
    ("empty tensor prompt", torch.zeros(0, dtype=torch.int64), GREEDY, (), ("empty",)),
    ("params a dict", [1, 2], {"max_tokens": 2}, (), ("SamplingParams", "dict")),
    ("params None", [1, 2], None, (), ("SamplingParams", "NoneType")),
    ("params a number", [1, 2], 0.7, (), ("SamplingParams", "float")),
    ("chunk_sizes not summing", [1, 2, 3], GREEDY, (1, 1), ("chunk_sizes=(1, 1)",)),
    ("chunk_sizes not ints", [1, 2, 3], GREEDY, (1.5, 1.5), ("chunk_sizes=(1.5, 1.5)",)),
    ("chunk_sizes a bare int", [1, 2, 3], GREEDY, 3, ("chunk_sizes=3",)),
    ("chunk_sizes with a zero", [1, 2, 3], GREEDY, [0, 3], ("chunk_sizes=[0, 3]",)),
    ("chunk_sizes negative", [1, 2, 3], GREEDY, [-1, 4], ("chunk_sizes=[-1, 4]",)),
    ("chunk_sizes of bools", [1, 2], GREEDY, [True, True], ("chunk_sizes=[True, True]",)),
    ("chunk_sizes a str", [1, 2], GREEDY, "11", ("chunk_sizes='11'",)),
]


@pytest.mark.parametrize("name,prompt,params,chunks,needles", ADD_CASES, ids=[c[0] for c in ADD_CASES])
def test_add_rejects_without_leaking(
    contract: Contract, name: str, prompt: Any, params: Any, chunks: Any, needles: tuple[str, ...]
) -> None:
    driver = StaticDriver(contract.engine)
    running = driver.add([4, 5, 6], GREEDY)
    driver.step()  # the running request has cached KV: a leak or a stray write would show
    contract.rejects(InvalidRequestError, lambda: driver.add(prompt, params, chunks), *needles, driver=driver)
    assert driver.result(running).output_ids  # it ran on, to the end, in the witness


UID_CASES: list[tuple[str, Callable[[StaticDriver], object], tuple[str, ...]]] = [
    ("abort of an unknown uid", lambda d: d.abort(99), ("uid 99", "not a running request")),
    ("abort of a str uid", lambda d: d.abort("0"), ("uid '0'",)),  # type: ignore[arg-type]
    ("abort of a finished uid", lambda d: d.abort(0), ("uid 0", "not a running request")),
    ("result of an unknown uid", lambda d: d.result(99), ("uid 99", "unknown")),
    ("result of a running uid", lambda d: d.result(1), ("uid 1", "still running")),
    ("result of None", lambda d: d.result(None), ("uid None",)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("name,call,needles", UID_CASES, ids=[c[0] for c in UID_CASES])
def test_unknown_uids(
    contract: Contract, name: str, call: Callable[[StaticDriver], object], needles: tuple[str, ...]
) -> None:
    driver = StaticDriver(contract.engine)
    driver.generate([[1, 2]], GREEDY)  # uid 0, finished
    driver.add([3, 4], GREEDY)  # uid 1, running
    contract.rejects(InvalidRequestError, lambda: call(driver), *needles, driver=driver)


# ---- generate: every prompt is checked before any is admitted --------------------------------------------------
GENERATE_CASES: list[tuple[str, Any, Any, type[Exception], tuple[str, ...]]] = [
    ("params None", [[1, 2]], None, InvalidRequestError, ("params", "NoneType")),
    ("params a number", [[1, 2]], 0.7, InvalidRequestError, ("params", "float")),
    ("params a dict", [[1, 2]], {"max_tokens": 2}, InvalidRequestError, ("params", "dict")),
    ("params too few", [[1, 2], [3]], [GREEDY], InvalidRequestError, ("2 prompts but 1 SamplingParams",)),
    ("params too many", [[1, 2]], [GREEDY, GREEDY], InvalidRequestError, ("1 prompts but 2",)),
    ("prompts a str", "hello", GREEDY, InvalidRequestError, ("prompts", "str")),
    ("prompts None", None, GREEDY, InvalidRequestError, ("prompts", "NoneType")),
    ("prompts one flat prompt", 5, GREEDY, InvalidRequestError, ("prompts", "int")),
    ("a later prompt out of vocab", [[1, 2], [3, 4], [5, VOCAB]], GREEDY, InvalidRequestError,
     ("prompt 2:", f"token id {VOCAB}")),
    ("a later prompt empty", [[1, 2], []], GREEDY, InvalidRequestError, ("prompt 1:", "empty")),
    ("a later prompt of floats", [[1, 2], [1.5]], GREEDY, InvalidRequestError, ("prompt 1:", "1.5")),
    ("a later prompt too long", [[1, 2], [1] * 62], GREEDY, InvalidRequestError, ("prompt 1:", "max_seq_len=64")),
    ("a later params a dict", [[1], [2]], [GREEDY, {"max_tokens": 1}], InvalidRequestError,
     ("prompt 1:", "SamplingParams")),
    ("a later prompt never fits", [[1, 2], [1] * 40], SamplingParams(max_tokens=20), CapacityError,
     ("prompt 1:", "never fit")),
]


@pytest.mark.parametrize("name,prompts,params,error,needles", GENERATE_CASES, ids=[c[0] for c in GENERATE_CASES])
def test_generate_admits_nothing_when_a_prompt_is_bad(
    qwen3: Path, name: str, prompts: Any, params: Any, error: type[Any], needles: tuple[str, ...]
) -> None:
    engine = _engine(qwen3, num_page_override=48)  # 48 slots: 40 + 20 can never fit
    contract = Contract.of(engine)
    driver = StaticDriver(engine)
    driver.add([7, 8, 9], GREEDY)
    driver.step()
    contract.rejects(error, lambda: driver.generate(prompts, params), *needles, driver=driver)
    engine.shutdown()


def test_generate_returns_every_result_across_capacity_waits(qwen3: Path, oracle: OraclePool) -> None:
    """More requests than rows and pages: admitted as others finish, all returned in order (none lost)."""
    engine = _engine(qwen3, num_page_override=24, page_size=2)  # 48 slots: about three requests at a time
    prompts = [_prompt(i, 3 + i % 5) for i in range(9)]
    gens = StaticDriver(engine, PageLayout("shuffled", 2)).generate(prompts, SamplingParams(max_tokens=8,
                                                                                            ignore_eos=True))
    ref = oracle(qwen3, torch.float32)
    assert [g.output_ids for g in gens] == [ref.greedy(p, 8) for p in prompts]
    assert [g.prompt_ids for g in gens] == prompts
    engine.shutdown()


def test_a_step_that_raises_in_generate_drops_its_requests(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(qwen3)
    contract = Contract.of(engine)
    driver = StaticDriver(engine)
    state = engine_state(engine, driver)
    forward = engine.model.forward
    calls = [0]

    def fail_on_third(*args: Any) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("injected")
        return forward(*args)

    monkeypatch.setattr(engine.model, "forward", fail_on_third)
    with pytest.raises(RuntimeError, match="injected"):
        driver.generate([[1, 2], [3, 4, 5]], GREEDY)
    monkeypatch.setattr(engine.model, "forward", forward)
    rows, pages, *rest = engine_state(engine, driver)[3]
    assert (sorted(rows), sorted(pages), rest) == (sorted(state[3][0]), sorted(state[3][1]), list(state[3][2:])), (
        "generate left requests, rows or pages behind"
    )
    contract.still_generates(driver)
    engine.shutdown()


# ---- a request that cannot continue ------------------------------------------------------------------------
def _poison(engine: Engine, monkeypatch: pytest.MonkeyPatch, uids: set[int], value: float = math.nan) -> None:
    forward = engine.model.forward

    def poisoned(*args: Any) -> torch.Tensor:
        logits = forward(*args)
        for row, req in enumerate(engine.ctx.batch.reqs):
            if req.uid in uids:
                logits[row] = value
        return logits

    monkeypatch.setattr(engine.model, "forward", poisoned)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "+inf", "all -inf"])
def test_generate_finishes_a_non_finite_request_with_an_error_and_serves_the_others(
    qwen3: Path, oracle: OraclePool, monkeypatch: pytest.MonkeyPatch, value: float
) -> None:
    engine = _engine(qwen3)
    contract = Contract.of(engine)
    driver = StaticDriver(engine)
    prompts = [_prompt(1, 4), _prompt(2, 6), _prompt(3, 5)]
    params = [GREEDY, SamplingParams(temperature=0.9, max_tokens=4, ignore_eos=True, seed=3), GREEDY]
    _poison(engine, monkeypatch, {driver.requests.next_uid + 1})
    gens = driver.generate(prompts, params)
    assert [g.finish_reason for g in gens] == ["length", "error", "length"]
    assert gens[1].output_ids == [] and gens[1].error is not None and "request(s) [1]" in gens[1].error
    ref = oracle(qwen3, torch.float32)
    assert gens[0].output_ids == ref.greedy(prompts[0], 4) and gens[2].output_ids == ref.greedy(prompts[2], 4)
    monkeypatch.undo()
    assert not driver.running and len(driver.requests.free_rows) == ROWS
    contract.still_generates(driver)  # nothing is stuck: the next generate runs as on a fresh engine
    engine.shutdown()


def test_temperature_overflow_midway_finishes_that_request(qwen3: Path) -> None:
    """A temperature that divides the logits past float32 is caught at the step, not at admission."""
    engine = _engine(qwen3)
    contract = Contract.of(engine)
    driver = StaticDriver(engine)
    tiny = SamplingParams(temperature=1.2e-38, max_tokens=3, ignore_eos=True)
    gens = driver.generate([[1, 2, 3], [4, 5]], [tiny, GREEDY])
    assert [g.finish_reason for g in gens] == ["error", "length"]
    assert gens[0].error is not None and "overflow" in gens[0].error
    contract.still_generates(driver)
    engine.shutdown()


# ---- capacity ------------------------------------------------------------------------------------------------
def test_rows_exhausted(contract: Contract) -> None:
    driver = StaticDriver(contract.engine)
    for i in range(ROWS):
        driver.add([i + 1], GREEDY)
    contract.rejects(CapacityError, lambda: driver.add([9], GREEDY), f"all {ROWS} page-table rows",
                     "max_running_req", driver=driver)


def test_request_that_can_never_fit(qwen3: Path) -> None:
    engine = _engine(qwen3, num_page_override=8, max_running_req=2)
    contract = Contract.of(engine)
    driver = StaticDriver(engine)
    contract.rejects(CapacityError, lambda: driver.add(list(range(10)), GREEDY), "14 KV page(s)", "only 8",
                     "never fit", driver=driver)
    engine.shutdown()


def test_pages_exhausted_running_requests_continue_and_match_hf(qwen3: Path, oracle: OraclePool) -> None:
    engine = _engine(qwen3, page_size=2, num_page_override=12)
    driver = StaticDriver(engine, PageLayout("shuffled", seed=3))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [_prompt(1, 7), _prompt(2, 5)]  # 7 + 6 → 7 pages, 5 + 6 → 6 pages: 13 > 12
    first = driver.add(prompts[0], params)
    driver.step()  # the first request is running: its prefill is done
    state = engine_state(engine, driver)
    expect(CapacityError, lambda: driver.add(prompts[1], params), "6 KV page(s)", "only 5 are free")
    assert engine_state(engine, driver)[3] == state[3]
    driver.run()
    assert driver.result(first).output_ids == oracle(qwen3, torch.float32).greedy(prompts[0], 6)
    second = driver.add(prompts[1], params)  # its pages are free again
    driver.run()
    assert driver.result(second).output_ids == oracle(qwen3, torch.float32).greedy(prompts[1], 6)
    engine.shutdown()


# ---- an interrupt inside a step --------------------------------------------------------------------------------
def test_an_interrupt_at_the_release_of_a_steps_finished_rows_keeps_them_live(qwen3: Path) -> None:
    """Two requests finish in one decode step and an interrupt lands at the release of the second's row: the step is
    taken back whole, and the first's row is still live in the engine (released one by one, it was lost to the undo:
    properties/test_interrupts.py under `deep`). The step then runs again."""
    engine = _engine(qwen3)
    driver = StaticDriver(engine)
    try:
        uids = [driver.add(_prompt(seed, 5), SamplingParams(max_tokens=2, ignore_eos=True)) for seed in (1, 2)]
        driver.step()  # the prefill: both rows live from here on
        second = driver.running[uids[1]].req.table_idx
        before = engine_state(engine, driver)
        release = engine.release_rows

        def interrupted(rows: Any) -> None:
            rows = list(rows)
            if second in rows:
                raise KeyboardInterrupt("injected at the release of the step's finished rows")
            release(rows)

        engine.release_rows = interrupted  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            driver.step()
        del engine.release_rows
        after = engine_state(engine, driver)
        assert after[-1] == before[-1], f"the engine's live rows: {before[-1]} before the step, {after[-1]} after"
        assert after[3:-1] == before[3:-1], "the driver's bookkeeping changed"
        assert set(driver.step()) == set(uids) and not driver.running
    finally:
        engine.shutdown()


# ---- one driver at a time ------------------------------------------------------------------------------------
def test_a_second_driver_is_refused_while_the_first_runs(contract: Contract, oracle: OraclePool, qwen3: Path) -> None:
    first = StaticDriver(contract.engine)
    uid = first.add(_prompt(4, 5), SamplingParams(max_tokens=6, ignore_eos=True))
    first.step()
    contract.rejects(EngineBusyError, lambda: StaticDriver(contract.engine), "another StaticDriver",
                     "1 running request", f"uids [{uid}]", driver=first)
    assert first.result(uid).output_ids == oracle(qwen3, torch.float32).greedy(_prompt(4, 5), 6)


def test_a_newer_driver_retires_an_idle_one(contract: Contract) -> None:
    old = StaticDriver(contract.engine)
    old.generate([[1, 2]], GREEDY)
    new = StaticDriver(contract.engine)
    for call in (lambda: old.add([1], GREEDY), old.step, old.run, lambda: old.generate([[1]], GREEDY)):
        contract.rejects(EngineBusyError, call, "newer StaticDriver", driver=new)


def test_close_aborts_and_frees_the_engine(contract: Contract) -> None:
    driver = StaticDriver(contract.engine)
    driver.add([1, 2, 3], GREEDY)
    driver.step()
    driver.close()
    assert driver.finished[0].finish_reason == "abort"
    expect(EngineBusyError, lambda: driver.add([1], GREEDY), "closed")
    contract.still_generates(StaticDriver(contract.engine))


# ---- one thread at a time ------------------------------------------------------------------------------------
def _blocked_in(
    driver: StaticDriver, where: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """The next forward pass (inside an engine call) or page-table write (the driver's own work, between engine
    calls) waits until `release` is set; `entered` is set when it starts waiting."""
    entered, release = threading.Event(), threading.Event()
    owner, name = (driver.engine.model, "forward") if where == "forward" else (driver.pages, "write")
    original = getattr(owner, name)

    def blocking(*args: Any) -> Any:
        entered.set()
        assert release.wait(60), "the test never released the blocked call"
        return original(*args)

    monkeypatch.setattr(owner, name, blocking)
    return entered, release


SECOND_THREAD_CALLS: list[tuple[str, Callable[[StaticDriver], object], tuple[str, ...]]] = [
    ("generate", lambda d: d.generate([[1, 2]], GREEDY), ("generate", "another thread")),
    ("add", lambda d: d.add([1, 2], GREEDY), ("add", "another thread")),
    ("step", lambda d: d.step(), ("step", "another thread")),
    ("abort", lambda d: d.abort(0), ("abort", "another thread")),
    ("engine.prepare_batch", lambda d: d.engine.prepare_batch([d.running[0].req], "decode"),
     ("prepare_batch", "engine is in use by another thread")),
    ("engine.shutdown", lambda d: d.engine.shutdown(), ("shutdown", "engine is in use by another thread")),
    ("engine.release_rows", lambda d: d.engine.release_rows([0]), ("release_rows", "engine is in use")),
]


@pytest.mark.parametrize("where", ["forward", "page writes"])
@pytest.mark.parametrize("name,call,needles", SECOND_THREAD_CALLS, ids=[c[0] for c in SECOND_THREAD_CALLS])
def test_a_second_thread_is_refused_at_once(
    contract: Contract, monkeypatch: pytest.MonkeyPatch, name: str, call: Callable[[StaticDriver], object],
    needles: tuple[str, ...], where: str,
) -> None:
    """Refused while the first thread is inside an engine call, and between two (its driver's page writes)."""
    driver = StaticDriver(contract.engine)
    driver.add([5, 6, 7], GREEDY)
    entered, release = _blocked_in(driver, where, monkeypatch)
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(driver.generate([[8, 9]], GREEDY)))
    worker.start()
    try:
        assert entered.wait(60)
        expect(EngineBusyError, lambda: call(driver), *needles)
    finally:
        release.set()
        worker.join(60)
    monkeypatch.undo()
    assert len(outcome) == 1, "the first thread's generate did not complete"
    contract.still_generates(driver)


def test_threads_hammering_one_engine_meet_only_typed_errors(qwen3: Path) -> None:
    """One thread generates while others shut the engine down, release rows and step: every refusal is an
    EngineError (busy, or closed once a shutdown got through), never an error from half-torn-down state."""
    untyped: list[BaseException] = []

    def guarded(call: Callable[[], object], rounds: int) -> None:
        for _ in range(rounds):
            try:
                call()
            except EngineError:
                pass
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
                untyped.append(exc)

    for _ in range(5):
        engine = _engine(qwen3)
        driver = StaticDriver(engine)
        workers = [
            threading.Thread(target=guarded, args=(functools.partial(driver.generate, [[1, 2, 3]] * 2, GREEDY), 20)),
            threading.Thread(target=guarded, args=(functools.partial(engine.release_rows, [0, 1]), 200)),
            threading.Thread(target=guarded, args=(driver.step, 200)),
            threading.Thread(target=guarded, args=(engine.shutdown, 50)),
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        engine.shutdown()
    assert not untyped, [f"{type(e).__name__}: {e}" for e in untyped[:5]]
