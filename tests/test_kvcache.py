"""KV pool, page table, dummy page isolation and memory planning."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from engine import Batch, CapacityError, ConfigError, Engine, EngineConfig, SamplingParams
from engine.core import Req
from engine.device import host_tensor
from engine.distributed import TorchDistComm
from engine.driver import DECODE_LOOKAHEAD, Contiguous, PageLayout, Pages, RequestState, StaticDriver
from engine.kvcache import KVCachePool, model_footprint, plan_num_pages
from engine.layers.kernels import TORCH_KERNELS
from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig
from oracle.ranks import run_ranks

SENTINEL = 12345.0


def test_norm_rope_store_writes_only_its_slots() -> None:
    pool = KVCachePool(2, 3, 4, 2, 8, torch.float32, torch.device("cpu"))
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    rope = RotaryEmbedding(8, 16, RopeConfig(theta=1e4), torch.device("cpu")).at(torch.tensor([3, 0, 15]))
    slots = torch.tensor([5, 0, 11])  # page 1 offset 1, page 0 offset 0, page 2 offset 3
    rotated_q = pool.norm_rope_store(TORCH_KERNELS, 1, slots, q, k, v, rope, None, None)
    assert torch.equal(rotated_q, rope.apply(q))
    k = rope.apply(k)
    assert torch.equal(pool.k_cache(1)[1, 1], k[0])
    assert torch.equal(pool.k_cache(1)[0, 0], k[1])
    assert torch.equal(pool.v_cache(1)[2, 3], v[2])
    written = torch.zeros(2, 2, 4, 4, dtype=torch.bool)
    written[:, 1].view(2, -1)[:, slots] = True
    assert not pool.buffer[~written.unsqueeze(-1).unsqueeze(-1).expand_as(pool.buffer)].any()


def test_pool_has_a_dummy_page_and_the_table_a_dummy_row(tiny_models: dict[str, Path]) -> None:
    engine = Engine(EngineConfig(str(tiny_models["llama"]), page_size=4, num_page_override=10, max_running_req=3))
    assert engine.kv_cache.buffer.shape[2] == 11 and engine.kv_cache.dummy_page == 10
    assert engine.page_table.shape[0] == 4 and engine.dummy_row == 3
    assert (engine.page_table[engine.dummy_row] // 4 == 10).all()
    engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 4])
def test_real_requests_never_write_the_dummy_page(tiny_models: dict[str, Path], page_size: int) -> None:
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=page_size, num_page_override=64))
    dummy = engine.kv_cache.buffer[:, :, engine.kv_cache.dummy_page]
    dummy.fill_(SENTINEL)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    StaticDriver(engine, PageLayout("interleaved")).generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert (dummy == SENTINEL).all()
    engine.shutdown()


def test_dummy_request_writes_only_the_dummy_page(tiny_models: dict[str, Path]) -> None:
    engine = Engine(EngineConfig(str(tiny_models["qwen3"]), page_size=2, num_page_override=16))
    real = engine.kv_cache.buffer[:, :, : engine.kv_cache.dummy_page]
    real.fill_(SENTINEL)
    # The dummy request only ever rides along as padding, so build its batch by hand.
    dummy = engine.dummy_req
    batch = Batch([dummy], "decode")
    batch.input_ids = torch.zeros(1, dtype=torch.int32)
    batch.positions = torch.zeros(1, dtype=torch.int64)
    batch.out_loc = engine.page_table[engine.dummy_row, :1]
    batch.table_rows = torch.tensor([engine.dummy_row])
    engine.attn_backend.prepare_metadata(batch)
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        engine.model(batch.input_ids, batch.positions, engine.ctx)
    assert (real == SENTINEL).all()
    assert not (engine.kv_cache.buffer[:, :, engine.kv_cache.dummy_page] == 0).all()
    engine.shutdown()


def _everything_back(driver: StaticDriver) -> None:
    allocator = driver.pages.allocator
    assert allocator.reserved == 0, f"{allocator.reserved} pages still reserved with nothing running"
    assert sorted(allocator.free) == list(range(allocator.total)), "pages missing from the free list"
    rows = list(range(driver.engine.config.max_running_req))
    assert sorted(driver.requests.free_rows) == rows, "page-table rows missing"


def test_every_finish_path_gives_back_its_pages_reservation_and_row(tiny_models: dict[str, Path]) -> None:
    """Abort before and after prefill (part of the reservation unmapped), EOS and length: all of it comes back."""
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=2, num_page_override=32, max_running_req=2))
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    [ref] = StaticDriver(engine).generate([[5, 6, 7]], greedy)
    stop = ref.output_ids[1]
    assert stop != ref.output_ids[0]  # so the request below stops on its second token
    driver = StaticDriver(engine, PageLayout("shuffled", 1), eos_token_ids=[stop])
    driver.abort(driver.add([1, 2, 3, 4, 5], greedy))  # before its prefill: nothing of it mapped
    _everything_back(driver)
    eos = driver.add([5, 6, 7], replace(greedy, ignore_eos=False))
    late = driver.add([9, 8, 7, 6], greedy)
    driver.step()  # both prefilled; the pages of their new tokens are still unmapped
    driver.abort(late)
    driver.run()
    assert (driver.result(eos).finish_reason, driver.result(eos).output_ids) == ("eos", ref.output_ids[:2])
    _everything_back(driver)
    [length] = driver.generate([[9, 8]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert length.finish_reason == "length"
    _everything_back(driver)
    engine.shutdown()


class _Descending(Contiguous):
    """A user's page order: the highest pages first."""

    def free_list(self, num_pages: int) -> list[int]:
        return list(range(num_pages))[::-1]


class _LosesAPage(Contiguous):
    def free_list(self, num_pages: int) -> list[int]:
        return list(range(num_pages - 1))


class _SkipsARequest(Contiguous):
    def grants(self, need: list[int]) -> list[int]:  # type: ignore[override]
        return super().grants(need)[1:]


def test_driver_takes_a_page_order_policy(tiny_models: dict[str, Path]) -> None:
    """A PageOrder is handed to the allocator as is: the pages go out in its order and the tokens do not change."""
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=2, num_page_override=16, max_running_req=2))
    greedy = SamplingParams(max_tokens=4, ignore_eos=True)
    [ref] = StaticDriver(engine).generate([[5, 6, 7]], greedy)
    driver = StaticDriver(engine, _Descending())
    uid = driver.add([5, 6, 7], greedy)
    driver.step()
    assert driver.running[uid].pages == [15, 14]
    driver.run()
    assert driver.result(uid).output_ids == ref.output_ids
    engine.shutdown()


@pytest.mark.parametrize("order", [_LosesAPage(), _SkipsARequest()], ids=type)
def test_a_broken_page_order_is_refused_before_it_maps_a_page(tiny_models: dict[str, Path], order: Contiguous) -> None:
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=2, num_page_override=16, max_running_req=2))
    with pytest.raises(ConfigError, match=type(order).__name__):
        driver = StaticDriver(engine, order)
        driver.generate([[5, 6, 7]], SamplingParams(max_tokens=2, ignore_eos=True))
    engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 3])
def test_decode_maps_pages_once_per_lookahead(tiny_models: dict[str, Path], page_size: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode pass writes the page table only when its slot is unmapped, then DECODE_LOOKAHEAD slots ahead: 70
    tokens of one request make the prefill's write and 3 more, not one a step (and the tokens stay the same)."""
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=page_size, num_page_override=128,
                                 max_running_req=1))
    params = SamplingParams(max_tokens=70, ignore_eos=True)
    [ref] = StaticDriver(engine).generate([[5, 6, 7]], params)
    writes: list[int] = []
    write = Pages.write
    monkeypatch.setattr(Pages, "write", lambda self, rows: (writes.append(len(rows)), write(self, rows))[1])
    [got] = StaticDriver(engine).generate([[5, 6, 7]], params)
    assert got.output_ids == ref.output_ids
    assert len(writes) == 1 + math.ceil(69 / DECODE_LOOKAHEAD) <= 4, writes  # the prefill's, then 69 decode slots
    engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 3])
@pytest.mark.parametrize("kind", ["contiguous", "interleaved", "shuffled"])
def test_map_writes_each_request_its_pages_slots_in_order(tiny_models: dict[str, Path], page_size: int,
                                                           kind: str) -> None:
    """Pages.map, in two rounds under each page order: every request's row holds its pages' slots, position after
    position, a page cut short at the row's end; nothing else in the table changes."""
    engine = Engine(EngineConfig(str(tiny_models["qwen2"]), page_size=page_size, num_page_override=64,
                                 max_running_req=3, max_seq_len_override=10))
    pages = Pages(engine, PageLayout(kind, seed=7).order())
    seqs = [RequestState(Req([1] * 4, row, 0, 1, row, SamplingParams()), 4, reserved_pages=10) for row in range(3)]
    pages.allocator.reserve(30)
    before = engine.page_table.clone()
    granted = pages.map(seqs, [4, 1, 7]) + pages.map(seqs, [9, 10, 7])
    assert sorted(p for seq in seqs for p in seq.pages) == sorted(set(p for seq in seqs for p in seq.pages))
    assert len(granted) == sum(len(seq.pages) for seq in seqs) == 64 - len(pages.allocator.free)
    expected = before.clone()
    for seq in seqs:
        slots = [page * page_size + offset for page in seq.pages for offset in range(page_size)][:10]
        expected[seq.req.table_idx, : len(slots)] = torch.tensor(slots, dtype=torch.int32)
    assert torch.equal(engine.page_table, expected)
    engine.shutdown()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float64, torch.float32, torch.bool])
def test_host_tensor_holds_what_torch_tensor_would(dtype: torch.dtype) -> None:
    values = [True, False, True] if dtype == torch.bool else [0, 3, -2, 7] if not dtype.is_floating_point else [
        0.5, 1.0 / 3.0, -2.0, 1e-30]
    assert torch.equal(host_tensor(values, dtype), torch.tensor(values, dtype=dtype))
    assert host_tensor([], dtype).dtype == dtype and host_tensor([], dtype).numel() == 0
    if dtype == torch.int64:
        with pytest.raises(OverflowError):
            host_tensor([2**63])


# ---- memory planning: pages = (ratio × free − model) // bytes_per_page ------------------------------------------
GiB = 1024**3


def test_bytes_per_page_formula() -> None:
    # 2 (k and v) × head_dim 64 × 3 kv heads × page 16 × 2 bytes (bf16) × 30 layers
    assert KVCachePool.bytes_per_page(30, 16, 3, 64, torch.bfloat16) == 2 * 64 * 3 * 16 * 2 * 30


def test_plan_uses_ratio_of_free_memory_minus_model() -> None:
    assert plan_num_pages(10 * GiB, 2 * GiB, GiB // 4, memory_ratio=0.9) == int((9 * GiB - 2 * GiB) // (GiB // 4))


def test_plan_is_capped_on_cpu() -> None:
    assert plan_num_pages(100 * GiB, GiB, 1024**2, 0.9, cap_bytes=2 * GiB) == 2048


def test_plan_rejects_fewer_than_two_pages() -> None:
    with pytest.raises(CapacityError, match="at least 2"):
        plan_num_pages(GiB, GiB - 1000, 1024, 1.0)
    with pytest.raises(CapacityError):
        plan_num_pages(GiB, 2 * GiB, 1024, 0.9)  # the model alone does not fit


def _rank_main(rank: int, port: int, free: list[int], out: mp.Queue[tuple[int, int]]) -> None:
    comm = TorchDistComm(rank, len(free), port, timeout_s=60, device=torch.device("cpu"))
    local = plan_num_pages(free[rank], GiB, GiB // 8, memory_ratio=0.5)
    out.put((rank, comm.min_int(local)))
    comm.destroy()


def test_tp_ranks_agree_on_the_minimum_plan() -> None:
    free = [16 * GiB, 10 * GiB]  # rank 1 has less free memory: both ranks must use its plan
    results = run_ranks(_rank_main, 2, free, timeout_s=120)
    expected = (int(0.5 * 10 * GiB) - GiB) // (GiB // 8)
    assert results == {0: expected, 1: expected}


def test_engines_build_and_shut_down_repeatedly(tiny_models: dict[str, Path]) -> None:
    threads = torch.get_num_threads()
    for i in range(4):
        arch = ("qwen3", "qwen2", "llama", "qwen3")[i]
        engine = Engine(EngineConfig(str(tiny_models[arch]), page_size=1 + i, num_page_override=32))
        gen = StaticDriver(engine).generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert len(gen[0].output_ids) == 4
        engine.shutdown()
        engine.shutdown()  # idempotent
    assert torch.get_num_threads() == threads


def test_num_pages_planned_from_memory_on_cpu(tiny_models: dict[str, Path]) -> None:
    cap = 1024**2
    engine = Engine(EngineConfig(str(tiny_models["llama"]), page_size=4, cpu_kv_cache_bytes=cap))
    per_page = KVCachePool.bytes_per_page(2, 4, 2, 16, torch.float32)
    assert engine.num_pages == cap // per_page
    engine.shutdown()


def test_model_footprint_is_measured_where_measured_and_never_below_the_parameters() -> None:
    assert model_footprint(GiB, None) == GiB  # CPU: the parameter bytes
    assert model_footprint(GiB, GiB + 300 * 2**20) == GiB + 300 * 2**20  # CUDA: allocator rounding, rotary tables
    assert model_footprint(GiB, GiB // 2) == GiB  # another process freed memory while the model loaded
    assert model_footprint(GiB, -5) == GiB


def test_cpu_engine_plans_with_the_parameter_bytes(qwen3: Path) -> None:
    engine = Engine(EngineConfig(str(qwen3), device="cpu", max_running_req=2, max_seq_len_override=32))
    assert engine.model_bytes == sum(p.numel() * p.element_size() for p in engine.model.parameters())
    engine.shutdown()
