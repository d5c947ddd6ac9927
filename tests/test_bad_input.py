"""The bad-input catalogue: every invalid input gets one of the engine's typed errors, whose message names the
offending field or value, and a rejected call changes no state (KV pool, page table, driver bookkeeping).

Sampler policy (see engine/sample.py): a row with NaN or +inf logits, with every logit -inf, or whose
logits / temperature overflow float32 raises NonFiniteLogitsError naming the rows and request uids, before any
random draw, so the other rows, run again without it, get exactly the tokens they would have got.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import (
    Batch,
    CapacityError,
    ConfigError,
    Engine,
    EngineClosedError,
    EngineConfig,
    EngineError,
    InvalidRequestError,
    NonFiniteLogitsError,
    Req,
    SamplingParams,
)
from engine.attention import ATTENTION_BACKENDS
from engine.driver import PageLayout, StaticDriver
from engine.sample import Sampler
from oracle.hf import HFOracle
from oracle.pytest_plugin import OraclePool

REPO = Path(__file__).resolve().parent.parent
VOCAB = 512  # every tiny model's vocabulary
ROWS = 4  # max_running_req of the test engine
ROW_SLOTS = 16  # row r of the page table maps positions [0, 16) to slots [16 r, 16 r + 16)
GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def cpu_config(model: Path, **kwargs: Any) -> EngineConfig:
    """The tests pin the CPU: on a GPU machine "auto" would pick CUDA and bfloat16, where HF parity is not exact."""
    return EngineConfig(str(model), **{"device": "cpu", **kwargs})


def expect(error: type[EngineError], call: Callable[[], object], *needles: str) -> EngineError:
    """call() raises `error` (exactly that type or a subclass), and the message contains every needle."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in the message: {message}"
    return info.value


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture
def engine(qwen3: Path) -> Iterator[Engine]:
    eng = Engine(
        cpu_config(qwen3, num_page_override=ROWS * ROW_SLOTS, max_running_req=ROWS, max_seq_len_override=64),
        sampler_seed=0,
    )
    for r in range(ROWS):
        eng.page_table[r, :ROW_SLOTS] = r * ROW_SLOTS + torch.arange(ROW_SLOTS, dtype=torch.int32)
    yield eng
    eng.shutdown()


def snapshot(engine: Engine) -> tuple[torch.Tensor, torch.Tensor]:
    return engine.kv_cache.buffer.clone(), engine.page_table.clone()


def assert_unchanged(engine: Engine, snap: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(engine.kv_cache.buffer, snap[0]), "a rejected call wrote into the KV pool"
    assert torch.equal(engine.page_table, snap[1]), "a rejected call wrote into the page table"


def make_req(ids: Any = (5, 6, 7), table_idx: Any = 0, cached_len: Any = 0, params: Any = GREEDY, uid: int = 0) -> Req:
    tensor = torch.tensor(ids, dtype=torch.int32) if isinstance(ids, (tuple, list)) else ids
    return Req(tensor, table_idx, cached_len, 4, uid, params)


def run_batch(engine: Engine, reqs: list[Req], phase: Any = "prefill") -> torch.Tensor:
    batch, args = engine.prepare_batch(reqs, phase)
    return engine.forward_batch(batch, args).next_tokens_cpu


# ---- SamplingParams ------------------------------------------------------------------------------------------
SAMPLING_CASES = [
    ({"temperature": -0.5}, "temperature=-0.5"),
    ({"temperature": math.nan}, "temperature=nan"),
    ({"temperature": math.inf}, "temperature=inf"),
    ({"temperature": 1e-45}, "temperature=1e-45"),  # rounds to a float32 subnormal: logits / T overflows
    ({"temperature": "0.7"}, "temperature='0.7'"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"top_p": math.nan}, "top_p=nan"),
    ({"top_k": 0}, "top_k=0"),
    ({"top_k": -2}, "-1 to disable"),
    ({"top_k": 2.5}, "top_k=2.5"),
    ({"min_p": -0.1}, "min_p=-0.1"),
    ({"min_p": 1.5}, "min_p=1.5"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"max_tokens": -3}, "max_tokens=-3"),
    ({"seed": "42"}, "seed='42'"),
    ({"seed": 1.5}, "seed=1.5"),
    ({"ignore_eos": "yes"}, "ignore_eos='yes'"),
]


@pytest.mark.parametrize("kwargs,needle", SAMPLING_CASES, ids=[n for _, n in SAMPLING_CASES])
def test_sampling_params_rejected(kwargs: dict[str, Any], needle: str) -> None:
    error = expect(InvalidRequestError, lambda: SamplingParams(**kwargs), needle)
    assert isinstance(error, ValueError)  # callers that catch ValueError keep working


def test_top_k_message_says_minus_one_disables() -> None:
    expect(InvalidRequestError, lambda: SamplingParams(top_k=0), "top_k=0", "-1 to disable")


# ---- requests, by hand through prepare_batch -----------------------------------------------------------------
def _long_prompt_req(engine: Engine) -> list[Req]:
    engine.page_table[0, :] = torch.arange(engine.max_seq_len, dtype=torch.int32)
    return [make_req(list(range(engine.max_seq_len + 1)))]


REQUEST_CASES: list[tuple[str, Callable[[Engine], list[Req]], str, tuple[str, ...]]] = [
    ("empty prompt", lambda e: [make_req(torch.zeros(0, dtype=torch.int32))], "prefill", ("empty",)),
    ("token id = vocab", lambda e: [make_req((5, VOCAB, 7))], "prefill", (f"token id {VOCAB}", "[0, 512)")),
    ("negative token id", lambda e: [make_req((5, -1, 7))], "prefill", ("token id -1",)),
    ("float input_ids", lambda e: [make_req(torch.tensor([5.0, 6.0]))], "prefill", ("input_ids", "torch.float32")),
    ("2-D input_ids", lambda e: [make_req(torch.tensor([[5, 6]]))], "prefill", ("input_ids", "(1, 2)")),
    ("list input_ids", lambda e: [Req([5, 6], 0, 0, 4, 0, GREEDY)], "prefill", ("input_ids", "list")),  # type: ignore[arg-type]
    ("table_idx = max_running_req", lambda e: [make_req(table_idx=ROWS)], "prefill", ("table_idx=4", "[0, 4)")),
    ("negative table_idx", lambda e: [make_req(table_idx=-1)], "prefill", ("table_idx=-1",)),
    ("float table_idx", lambda e: [make_req(table_idx=1.5)], "prefill", ("table_idx=1.5",)),
    ("table_idx twice", lambda e: [make_req(uid=1), make_req(uid=2)], "prefill", ("table_idx=0", "twice")),
    ("cached_len > device_len", lambda e: [make_req(cached_len=5)], "prefill", ("cached_len=5", "device_len=3")),
    ("cached_len = device_len", lambda e: [make_req(cached_len=3)], "prefill", ("cached_len=3",)),
    ("prompt > max_seq_len", _long_prompt_req, "prefill", ("65 tokens", "max_seq_len=64")),
    ("decode of 3 tokens", lambda e: [make_req()], "decode", ("extend_len=3",)),
    ("bad phase", lambda e: [make_req()], "extend", ("phase='extend'",)),
    ("no requests", lambda e: [], "prefill", ("at least one request",)),
    ("not a Req", lambda e: [None], "prefill", ("batch entry 0", "NoneType")),  # type: ignore[list-item]
    ("params not SamplingParams", lambda e: [make_req(params={"temperature": 0})], "prefill", ("sampling_params",)),
]


@pytest.mark.parametrize("name,build,phase,needles", REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_bad_request_rejected_before_any_write(
    engine: Engine, name: str, build: Callable[[Engine], list[Req]], phase: str, needles: tuple[str, ...]
) -> None:
    reqs = build(engine)
    lens = [(r.cached_len, r.device_len) for r in reqs if isinstance(r, Req)]
    snap = snapshot(engine)
    expect(InvalidRequestError, lambda: run_batch(engine, reqs, phase), *needles)
    assert_unchanged(engine, snap)
    assert [(r.cached_len, r.device_len) for r in reqs if isinstance(r, Req)] == lens


SLOT_CASES = [
    ("slot past the pool", [0, 1, 10**6], ("page_table[0, 2] = 1000000", "not a KV slot")),
    ("negative slot", [0, 1, -1], ("page_table[0, 2] = -1",)),
    ("slot in the dummy page", [0, 1, ROWS * ROW_SLOTS], (f"page_table[0, 2] = {ROWS * ROW_SLOTS}",)),
    ("two tokens, one slot", [0, 1, 1], ("page_table[0, 2] = 1", "overwrite")),
]


@pytest.mark.parametrize("name,slots,needles", SLOT_CASES, ids=[c[0] for c in SLOT_CASES])
def test_bad_page_table_slots_rejected(engine: Engine, name: str, slots: list[int], needles: tuple[str, ...]) -> None:
    engine.page_table[0, :3] = torch.tensor(slots, dtype=torch.int32)
    snap = snapshot(engine)
    expect(InvalidRequestError, lambda: run_batch(engine, [make_req()]), *needles)
    assert_unchanged(engine, snap)


def test_new_token_may_not_overwrite_cached_kv_of_another_request(engine: Engine) -> None:
    first = make_req((5, 6, 7), table_idx=0, uid=10)
    run_batch(engine, [first])  # its KV now lives in slots 0..2
    first.append_host(torch.tensor(9))
    engine.page_table[1, :2] = torch.tensor([20, 1], dtype=torch.int32)  # position 1 of row 1 → slot 1: cached KV
    snap = snapshot(engine)
    intruder = make_req((3, 4), table_idx=1, uid=11)
    expect(
        InvalidRequestError,
        lambda: run_batch(engine, [first, intruder], "prefill"),
        "request 11",
        "page_table[1, 1] = 1",
        "cached KV of request 10",
    )
    assert_unchanged(engine, snap)


def test_a_batch_runs_once(engine: Engine) -> None:
    req = make_req()
    batch, args = engine.prepare_batch([req], "prefill")
    engine.forward_batch(batch, args)
    state = (req.cached_len, req.device_len)
    snap = snapshot(engine)
    expect(InvalidRequestError, lambda: engine.forward_batch(batch, args), "stale", "prepare_batch")
    assert (req.cached_len, req.device_len) == state
    assert_unchanged(engine, snap)


def test_decode_before_append_host_rejected(engine: Engine) -> None:
    req = make_req()
    run_batch(engine, [req])  # device_len is now 4, but the sampled token was not appended
    expect(InvalidRequestError, lambda: run_batch(engine, [req], "decode"), "device_len=4", "append_host")


# ---- requests through the driver -----------------------------------------------------------------------------
DRIVER_CASES: list[tuple[str, Any, Any, tuple[Any, ...], tuple[str, ...]]] = [
    ("prompt + max_tokens > max_seq_len", [1] * 60, SamplingParams(max_tokens=8), (), ("68", "max_seq_len=64")),
    ("token id >= vocab", [1, VOCAB + 3], GREEDY, (), (f"token id {VOCAB + 3}",)),
    ("token id beyond int32", torch.tensor([2**32 + 5]), GREEDY, (), (str(2**32 + 5),)),  # would wrap to 5
    ("negative token id", [3, -7], GREEDY, (), ("token id -7",)),
    ("float token ids", [1.7, 2.2], GREEDY, (), ("1.7",)),  # would truncate to 1, 2
    ("bool token ids", [True, False], GREEDY, (), ("True",)),
    ("string prompt", "hello", GREEDY, (), ("str",)),
    ("nested prompt", [[1, 2], [3, 4]], GREEDY, (), ("[1, 2]",)),
    ("2-D tensor prompt", torch.ones(2, 2, dtype=torch.int64), GREEDY, (), ("(2, 2)",)),
    ("float tensor prompt", torch.tensor([1.0, 2.0]), GREEDY, (), ("torch.float32",)),
    ("empty prompt", [], GREEDY, (), ("empty",)),
    ("params not SamplingParams", [1, 2], {"max_tokens": 2}, (), ("SamplingParams", "dict")),
    ("chunk_sizes not summing", [1, 2, 3], GREEDY, (1, 1), ("chunk_sizes [1, 1]",)),
    ("chunk_sizes not ints", [1, 2, 3], GREEDY, (1.5, 1.5), ("chunk_sizes [1.5, 1.5]",)),
]


@pytest.mark.parametrize("name,prompt,params,chunks,needles", DRIVER_CASES, ids=[c[0] for c in DRIVER_CASES])
def test_driver_add_rejects_without_leaking(
    engine: Engine, name: str, prompt: Any, params: Any, chunks: tuple[Any, ...], needles: tuple[str, ...]
) -> None:
    driver = StaticDriver(engine)
    running = driver.add([4, 5, 6], GREEDY)
    rows, pages, next_uid = list(driver.free_rows), driver.allocator.available, driver._next_uid
    snap = snapshot(engine)
    expect(InvalidRequestError, lambda: driver.add(prompt, params, chunks), *needles)
    assert (list(driver.free_rows), driver.allocator.available, driver._next_uid) == (rows, pages, next_uid)
    assert list(driver.running) == [running]
    assert_unchanged(engine, snap)


def test_driver_unknown_uid(engine: Engine) -> None:
    driver = StaticDriver(engine)
    uid = driver.add([4, 5], GREEDY)
    expect(InvalidRequestError, lambda: driver.abort(99), "uid 99", "not a running request")
    expect(InvalidRequestError, lambda: driver.result(uid), f"uid {uid}", "still running")
    expect(InvalidRequestError, lambda: driver.result(99), "uid 99", "unknown")


def test_driver_prefill_budget_must_be_positive(engine: Engine) -> None:
    expect(ConfigError, lambda: StaticDriver(engine, max_prefill_tokens=0), "max_prefill_tokens=0")


# ---- capacity ------------------------------------------------------------------------------------------------
def test_pool_too_small_to_plan(qwen3: Path) -> None:
    expect(CapacityError, lambda: Engine(cpu_config(qwen3, cpu_kv_cache_bytes=1)), "cpu_kv_cache_bytes")
    expect(CapacityError, lambda: Engine(cpu_config(qwen3, memory_ratio=1e-12)), "memory_ratio=1e-12")


def test_allocation_larger_than_memory_refused_before_allocating(qwen3: Path) -> None:
    # Far beyond any machine: torch would fail deep inside, or the OOM killer would end the process.
    expect(CapacityError, lambda: Engine(cpu_config(qwen3, num_page_override=10**12)), "KV pool", "num_page")
    expect(CapacityError, lambda: Engine(cpu_config(qwen3, max_running_req=10**9)), "page table")


def test_driver_rows_exhausted(engine: Engine) -> None:
    driver = StaticDriver(engine)
    for i in range(ROWS):
        driver.add([i + 1], GREEDY)
    pages = driver.allocator.available
    expect(CapacityError, lambda: driver.add([9], GREEDY), f"all {ROWS} page-table rows", "max_running_req")
    assert driver.allocator.available == pages and not driver.free_rows


def test_request_that_can_never_fit(qwen3: Path) -> None:
    eng = Engine(cpu_config(qwen3, num_page_override=8, max_running_req=2))
    driver = StaticDriver(eng)
    expect(CapacityError, lambda: driver.add(list(range(10)), GREEDY), "14 KV page(s)", "only 8", "never fit")
    assert driver.allocator.available == 8 and len(driver.free_rows) == 2
    eng.shutdown()


def test_pages_exhausted_running_requests_continue_and_match_hf(qwen3: Path, oracle: OraclePool) -> None:
    eng = Engine(cpu_config(qwen3, page_size=2, num_page_override=12, max_running_req=4))
    driver = StaticDriver(eng, PageLayout("shuffled", seed=3))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [_prompt(1, 7), _prompt(2, 5)]  # 7 + 6 → 7 pages, 5 + 6 → 6 pages: 13 > 12
    first = driver.add(prompts[0], params)
    driver.step()  # the first request is running: its prefill is done
    snap = snapshot(eng)
    expect(CapacityError, lambda: driver.add(prompts[1], params), "6 KV page(s)", "only 5 are free")
    assert_unchanged(eng, snap)
    driver.run()
    assert driver.result(first).output_ids == oracle(qwen3, torch.float32).greedy(prompts[0], 6)
    second = driver.add(prompts[1], params)  # its pages are free again
    driver.run()
    assert driver.result(second).output_ids == oracle(qwen3, torch.float32).greedy(prompts[1], 6)
    eng.shutdown()


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


# ---- configuration and device --------------------------------------------------------------------------------
CONFIG_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("unknown device", {"device": "tpu"}, ("device='tpu'",)),
    ("device not a string", {"device": None}, ("device=None",)),
    ("page_size 0", {"page_size": 0}, ("page_size=0",)),
    ("page_size negative", {"page_size": -4}, ("page_size=-4",)),
    ("memory_ratio 0", {"memory_ratio": 0.0}, ("memory_ratio=0.0",)),
    ("memory_ratio > 1", {"memory_ratio": 1.5}, ("memory_ratio=1.5",)),
    ("memory_ratio nan", {"memory_ratio": math.nan}, ("memory_ratio=nan",)),
    ("max_running_req 0", {"max_running_req": 0}, ("max_running_req=0",)),
    ("unknown dtype", {"dtype": "int8"}, ("dtype='int8'",)),
    ("unknown attention backend", {"attention_backend": "flash9"}, ("'flash9'", *ATTENTION_BACKENDS.names())),
    ("cuda_graph_bs not a list", {"cuda_graph_bs": 4}, ("cuda_graph_bs=4",)),
]


@pytest.mark.parametrize("name,kwargs,needles", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(qwen3: Path, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]) -> None:
    expect(ConfigError, lambda: Engine(cpu_config(qwen3, num_page_override=8, **kwargs)), *needles)


def test_model_path_not_a_path() -> None:
    expect(ConfigError, lambda: EngineConfig(None), "model_path=None")  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu(qwen3: Path) -> None:
    expect(ConfigError, lambda: Engine(EngineConfig(str(qwen3), device="cuda")), "device='cuda'", "no CUDA GPU")


def test_float16_on_cpu(qwen3: Path) -> None:
    config = cpu_config(qwen3, dtype="float16", num_page_override=8)
    expect(ConfigError, lambda: Engine(config), "float16", "CPU")


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
    name: str, bad_row: torch.Tensor, needle: str, params: SamplingParams
) -> None:
    good = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    logits = torch.cat([good[:1], bad_row[None], good[1:]])
    sampler = Sampler(torch.device("cpu"), 8, seed=5)
    error = expect(
        NonFiniteLogitsError, lambda: sampler.sample(logits, _args(sampler, [SAMPLED, params, SAMPLED, SAMPLED])),
        "request(s) [101]", "batch rows [1]", needle,
    )
    assert isinstance(error, NonFiniteLogitsError) and error.uids == [101] and error.rows == [1]
    # The failed call drew no noise: the other rows, run again, get what a fresh sampler gives them.
    again = sampler.sample(good, _args(sampler, [SAMPLED] * 3))
    fresh = Sampler(torch.device("cpu"), 8, seed=5)
    assert torch.equal(again, fresh.sample(good, _args(fresh, [SAMPLED] * 3)))


def test_temperature_overflow_raises() -> None:
    sampler = Sampler(torch.device("cpu"), 8, seed=0)
    logits = torch.tensor([[1000.0, 999.0, 0, 0, 0, 0, 0, 0]])
    tiny = SamplingParams(temperature=1e-37)
    expect(NonFiniteLogitsError, lambda: sampler.sample(logits, _args(sampler, [tiny])), "temperature=", "overflow")


def test_masked_tokens_are_never_sampled() -> None:
    """Rows that are partly -inf are valid: every draw is a finite-logit token inside the vocabulary."""
    sampler = Sampler(torch.device("cpu"), 8, seed=3)
    row = torch.tensor([-math.inf, 0.5, -math.inf, 0.1, -math.inf, -math.inf, 2.0, -math.inf])
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m) for t, k, p, m in
              [(1.0, -1, 1.0, 0.0), (5.0, 3, 1.0, 0.0), (2.0, -1, 0.99, 0.0), (1.0, 7, 0.5, 0.01), (0.0, -1, 1.0, 0.0)]]
    batch_params = params * 400
    tokens = sampler.sample(row.expand(len(batch_params), 8).contiguous(), _args(sampler, batch_params))
    assert set(tokens.tolist()) <= {1, 3, 6}


def test_logits_shape_must_match_the_batch() -> None:
    sampler = Sampler(torch.device("cpu"), 8, seed=0)
    expect(InvalidRequestError, lambda: sampler.sample(torch.zeros(2, 8), _args(sampler, [GREEDY])), "(2, 8)")
    expect(InvalidRequestError, lambda: sampler.sample(torch.zeros(1, 5), _args(sampler, [GREEDY])), "vocab 8")


def test_engine_names_the_request_with_nan_logits(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
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


# ---- lifecycle -----------------------------------------------------------------------------------------------
def test_shutdown_twice_then_every_use_is_refused(engine: Engine) -> None:
    req = make_req()
    batch, args = engine.prepare_batch([req], "prefill")
    driver = StaticDriver(engine)
    engine.shutdown()
    engine.shutdown()
    expect(EngineClosedError, lambda: engine.prepare_batch([make_req()], "prefill"), "shut down")
    expect(EngineClosedError, lambda: engine.forward_batch(batch, args), "shut down")
    expect(EngineClosedError, lambda: driver.add([1, 2], GREEDY), "shut down")
    expect(EngineClosedError, driver.step, "shut down")
    assert (req.cached_len, req.device_len) == (0, 3)


def test_context_manager_shuts_down(qwen3: Path) -> None:
    with Engine(cpu_config(qwen3, num_page_override=8)) as eng:
        StaticDriver(eng).generate([[1, 2]], GREEDY)
    expect(EngineClosedError, lambda: StaticDriver(eng).add([1], GREEDY), "shut down")


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
