"""Micro-benchmarks of each device's target (conftest.py): one decode step, one prefill, the sampler, store_kv, the
driver's host work per decode step, and graph replay against eager.

Every timed callable drains the device before it returns, so a time covers all the work it queued. Each case
is named by its device, so a saved CPU run and a saved GPU run never compare against each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from engine import Batch, Engine, EngineConfig, SamplingParams
from engine.core import Req
from engine.driver import RequestState, StaticDriver
from engine.driver.loop import DECODE_LOOKAHEAD
from engine.kvcache.pool import KVCachePool
from engine.layers.kernels import TORCH_KERNELS
from engine.step.inputs import pack_inputs
from engine.validate import validate_batch
from oracle.target import Target
from oracle.zoo.tiny import tiny_model_dir

from .common import DecodeStep, PrefillStep, graphs, graphs_captured, make_sampler, mixed_batch
from .conftest import DECODE_BS, DECODE_CONTEXT, PREFILL_LENS, device_params, needs_cuda

EngineFor = Callable[[str], Engine]
TargetFor = Callable[[str], Target]


def _warm(device: str, fn: Callable[[], None]) -> None:
    """One untimed call on GPU: JIT compiles and lazy allocations stay out of the statistics."""
    if device == "cuda":
        fn()


def _bench_decode(benchmark, engine: Engine, device: str, bs: int, pipelined: bool) -> None:
    step = DecodeStep(engine, bs, DECODE_CONTEXT[device])
    run = step.pipelined_step if pipelined else step.step
    _warm(device, run)
    benchmark.group = f"decode-step-{'pipelined-' if pipelined else ''}{device}"
    benchmark.extra_info.update(bs=bs, context=DECODE_CONTEXT[device])
    benchmark(run)


@pytest.mark.parametrize(("device", "bs"), device_params(DECODE_BS))
def test_decode_step(benchmark, engine_for: EngineFor, device: str, bs: int) -> None:
    """prepare_batch + forward (CUDA graphs where captured) + sampling of bs requests at DECODE_CONTEXT tokens."""
    _bench_decode(benchmark, engine_for(device), device, bs, pipelined=False)


@pytest.mark.parametrize(("device", "bs"), device_params(DECODE_BS))
def test_decode_step_pipelined(benchmark, engine_for: EngineFor, device: str, bs: int) -> None:
    """The same step with the next one started before this one's tokens are waited for (the overlapped driver)."""
    _bench_decode(benchmark, engine_for(device), device, bs, pipelined=True)


@pytest.mark.benchmark(min_rounds=3)
@pytest.mark.parametrize(("device", "length"), device_params({"cpu": PREFILL_LENS, "cuda": PREFILL_LENS}))
def test_prefill(benchmark, engine_for: EngineFor, device: str, length: int) -> None:
    step = PrefillStep(engine_for(device), length)
    _warm(device, step.step)
    benchmark.group = f"prefill-{device}"
    benchmark.extra_info.update(tokens=length)
    benchmark(step.step)


SAMPLER_CASES = {"cpu": ((8, 49152), (64, 49152)), "cuda": ((1, 151936), (64, 151936), (256, 151936))}


@pytest.mark.parametrize("impl", ["torch", "flashinfer"])
@pytest.mark.parametrize(("device", "shape"), device_params(SAMPLER_CASES))
def test_sampler(benchmark, target_for: TargetFor, device: str, shape: tuple[int, int], impl: str) -> None:
    """prepare + sample of a batch mixing greedy, temperature, top-k, top-p and min-p rows, on both sampling paths."""
    bs, vocab = shape
    dev = target_for(device).torch_device
    sampler = make_sampler(impl, dev, vocab)
    if sampler is None:
        pytest.skip(f"the {impl} sampling path needs CUDA and the flashinfer package")
    logits = torch.randn(bs, vocab, generator=torch.Generator().manual_seed(0)).mul_(3.0).to(dev)
    batch = mixed_batch(bs)

    def run() -> None:
        sampler.sample(logits, sampler.prepare(batch))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    _warm(device, run)
    benchmark.group = f"sampler-{device}-{bs}x{vocab}"
    benchmark.extra_info.update(bs=bs, vocab=vocab, impl=impl)
    benchmark(run)


# (kv_heads, head_dim) per device: SmolLM2 on CPU, the Qwen3 shapes on GPU.
KV_SHAPE = {"cpu": (3, 64), "cuda": (8, 128)}


@pytest.mark.parametrize(("device", "tokens"), device_params({"cpu": (64, 2048), "cuda": (256, 2048)}))
def test_store_kv(benchmark, target_for: TargetFor, device: str, tokens: int) -> None:
    """One layer's K and V for `tokens` tokens in the target's dtype written to scattered slots (a decode batch or a
    prefill), by the torch reference kernels."""
    heads, dim = KV_SHAPE[device]
    target = target_for(device)
    dev, dtype = target.torch_device, target.torch_dtype
    pool = KVCachePool(1, 16384, 1, heads, dim, dtype, dev)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    v = torch.randn(tokens, heads, dim, generator=gen).to(dev, dtype)
    out_loc = torch.randperm(16384, generator=gen)[:tokens].to(dev, torch.int32)

    def run() -> None:
        TORCH_KERNELS.store_kv(pool.k_slots(0), pool.v_slots(0), k, v, out_loc)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    _warm(device, run)
    benchmark.group = f"store_kv-{device}"
    benchmark.extra_info.update(tokens=tokens)
    benchmark(run)


@pytest.fixture(scope="module")
def host_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A tiny CPU engine of 256 rows of 1024 tokens: the driver's host work per step does not depend on the model."""
    path = tiny_model_dir("llama", tmp_path_factory.mktemp("host"))
    engine = Engine(EngineConfig(str(path), device="cpu", max_running_req=256, max_seq_len_override=1024,
                                 num_page_override=256 * 1024))
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("bs", [64, 256])
def test_driver_host_work(benchmark, host_engine: Engine, bs: int) -> None:
    """The host side of a decode step of bs requests 640 tokens long, no device work: the driver's rollback marks and
    the page grants of its lookahead map (DECODE_LOOKAHEAD pages each, made every that many steps), the batch
    checks, and the packed inputs of a captured graph's batch."""
    driver = StaticDriver(host_engine)
    loop, pages = driver.loop, driver.pages
    seqs = [RequestState(Req([1] * 640, row, 639, 1, row, SamplingParams()), 640, reserved_pages=1024)
            for row in range(bs)]
    pages.allocator.reserve(bs * 1024)
    pages.map(seqs, [640] * bs)
    reqs = [seq.req for seq in seqs]
    limits = host_engine.limits

    def run() -> None:
        loop.marks(seqs)
        granted = pages.map(seqs, [640 + DECODE_LOOKAHEAD] * bs)
        validate_batch(reqs, "decode", limits, host_engine.live_rows)
        pack_inputs(reqs, limits, host_engine.live_rows, True, pad_to=bs)
        pages.unmap(granted)

    benchmark.group = "driver-host-work-cpu"
    benchmark.extra_info.update(bs=bs, context=640)
    benchmark(run)


@needs_cuda
@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("bs", [1, 64])
def test_graph_vs_eager(benchmark, cuda_engine: Engine, bs: int, mode: str) -> None:
    """The same decode step of the same engine, replayed from a CUDA graph or run eagerly."""
    if not graphs_captured(cuda_engine):
        pytest.skip("the engine captured no CUDA graphs")
    step = DecodeStep(cuda_engine, bs, DECODE_CONTEXT["cuda"])

    def run() -> None:
        with graphs(cuda_engine, mode == "graph"):
            step.step()

    with graphs(cuda_engine, mode == "graph"):
        assert cuda_engine.graph_runner.can_use_graph(Batch(step.reqs, "decode")) == (mode == "graph")
    run()
    benchmark.group = f"graph-vs-eager-bs{bs}"
    benchmark.extra_info.update(bs=bs, mode=mode)
    benchmark(run)
