"""The registry's one requirement type (Requires) and the hybrid attention backend's routing, on CPU: each need's
message, "auto" and explicit names resolved against them, and which backend each batch of a hybrid goes to."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine import ATTENTION_BACKENDS, LAYER_KERNELS, SAMPLERS, ConfigError, Engine, EngineConfig, Req, SamplingParams
from engine.attention import (
    DECODE_MAX_BS,
    BaseAttnBackend,
    Hybrid,
    HybridAttnBackend,
    Route,
    TorchAttnBackend,
    TritonDecodeBackend,
)
from engine.core import Batch, Context
from engine.driver import StaticDriver
from engine.kvcache import KVCachePool
from engine.registry import HeadDim, Registry, Requires, Where

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # only its type is read: nothing here touches a GPU


@pytest.mark.parametrize(
    ("requires", "where", "reason"),
    [
        (Requires(), Where(CPU, torch.float64, 3), None),
        (Requires(devices=("cuda",)), Where(CPU, torch.float32, 64), "it needs a CUDA device, got cpu"),
        (Requires(devices=("cuda",)), Where(CUDA, torch.float32, 64), None),
        (Requires(dtypes=(torch.bfloat16,)), Where(CPU, torch.float32, 64), "it serves bfloat16, got torch.float32"),
        (Requires(dtypes=(torch.bfloat16, torch.float16)), Where(CPU, torch.float32, 64),
         "it serves bfloat16 and float16, got torch.float32"),
        (Requires(dtypes=(torch.bfloat16, torch.float16, torch.float32)), Where(CPU, torch.float64, 64),
         "it serves bfloat16, float16 and float32, got torch.float64"),
        (Requires(head_dim=HeadDim("its decode kernel", 16, 256)), Where(CPU, torch.float32, 48),
         "its decode kernel needs a power-of-two head_dim in [16, 256], got 48"),
        (Requires(head_dim=HeadDim("its decode kernel", 16, 256)), Where(CPU, torch.float32, 512),
         "its decode kernel needs a power-of-two head_dim in [16, 256], got 512"),
        (Requires(head_dim=HeadDim("its decode kernel", 16, 256)), Where(CPU, torch.float32, 8),
         "its decode kernel needs a power-of-two head_dim in [16, 256], got 8"),
        (Requires(head_dim=HeadDim("its RoPE kernel", 2)), Where(CPU, torch.float32, 1),
         "its RoPE kernel needs a power-of-two head_dim of at least 2, got 1"),
        (Requires(head_dim=HeadDim("its RoPE kernel", 2)), Where(CPU, torch.float32, 1024), None),
        (Requires(package="no_such_package_here"), Where(CPU, torch.float32, 64),
         "the no_such_package_here package is not installed (pip install no_such_package_here)"),
        (Requires(package="torch"), Where(CPU, torch.float32, 64), None),
        # The first unmet need is the one named: device, then dtype, head_dim, package and the extra check.
        (Requires(devices=("cuda",), dtypes=(torch.bfloat16,), head_dim=HeadDim("k", 16), package="no_such_package"),
         Where(CPU, torch.float32, 3), "it needs a CUDA device, got cpu"),
        (Requires(dtypes=(torch.bfloat16,), head_dim=HeadDim("k", 16)), Where(CPU, torch.float32, 3),
         "it serves bfloat16, got torch.float32"),
        (Requires(head_dim=HeadDim("k", 16), extra=lambda w: "never asked"), Where(CPU, torch.float32, 3),
         "k needs a power-of-two head_dim of at least 16, got 3"),
        (Requires(extra=lambda w: f"it wants head_dim 80, got {w.head_dim}"), Where(CPU, torch.float32, 64),
         "it wants head_dim 80, got 64"),
    ],
)
def test_requires_names_the_first_unmet_need(requires: Requires, where: Where, reason: str | None) -> None:
    assert requires.reason(where) == reason


@pytest.mark.parametrize(
    ("registry", "name", "where", "reason"),
    [
        (ATTENTION_BACKENDS, "flashinfer", Where(CPU, torch.bfloat16, 64), "it needs a CUDA device, got cpu"),
        (ATTENTION_BACKENDS, "flashinfer", Where(CUDA, torch.float32, 64),
         "it serves bfloat16 and float16, got torch.float32"),
        (ATTENTION_BACKENDS, "flashinfer", Where(CUDA, torch.bfloat16, 96),
         "its prefill kernel needs a power-of-two head_dim in [64, 256], got 96"),
        (ATTENTION_BACKENDS, "triton", Where(CPU, torch.bfloat16, 64), "it needs a CUDA device, got cpu"),
        (ATTENTION_BACKENDS, "triton", Where(CUDA, torch.float64, 64),
         "it serves bfloat16, float16 and float32, got torch.float64"),
        (ATTENTION_BACKENDS, "triton", Where(CUDA, torch.bfloat16, 48),
         "its decode kernel needs a power-of-two head_dim in [16, 256], got 48"),
        (LAYER_KERNELS, "triton", Where(CPU, torch.float32, 64), "it needs a CUDA device, got cpu"),
        (LAYER_KERNELS, "triton", Where(CUDA, torch.float64, 64),
         "it serves float32, bfloat16 and float16, got torch.float64"),
        (LAYER_KERNELS, "triton", Where(CUDA, torch.bfloat16, 48),
         "its RoPE kernel needs a power-of-two head_dim of at least 2, got 48"),
        (SAMPLERS, "flashinfer", Where(CPU, torch.float32, 64), "it needs a CUDA device, got cpu"),
    ],
)
def test_the_engines_entries_state_their_needs(
    registry: Registry[object], name: str, where: Where, reason: str
) -> None:
    assert registry.unusable(name, where) == reason
    with pytest.raises(ConfigError) as refused:
        registry.resolve(name, where)
    assert str(refused.value) == f"{registry.option}='{name}' cannot be used: {reason}; use 'torch' or 'auto'"



def test_auto_takes_the_first_usable_preferred_name_else_the_reference() -> None:
    reg: Registry[str] = Registry("thing", preferred=("fastest", "fast"))
    reg.register("torch", "reference")
    reg.register("fast", "quick", requires=Requires(devices=("cuda",)))
    reg.register("fastest", "quicker", requires=Requires(devices=("cuda",), dtypes=(torch.bfloat16,)))
    assert reg.resolve("auto", Where(CPU, torch.bfloat16, 64)) == "torch"
    assert reg.resolve("auto", Where(CUDA, torch.float32, 64)) == "fast"
    assert reg.resolve("auto", Where(CUDA, torch.bfloat16, 64)) == "fastest"
    assert reg.unusable("torch", Where(CPU, torch.float64, 1)) is None  # registered with no requirement
    assert reg.unusable("fastest", Where(CUDA, torch.float32, 64)) == "it serves bfloat16, got torch.float32"
    with pytest.raises(ConfigError, match="thing='fastest' cannot be used: it serves bfloat16, got torch.float32"):
        reg.resolve("fastest", Where(CUDA, torch.float32, 64))


def test_an_engine_refuses_an_explicit_name_with_its_reason(tiny_models: dict[str, Path]) -> None:
    model = str(tiny_models["qwen3"])
    fields = (("layer_kernels", "triton"), ("attention_backend", "triton"), ("sampler_backend", "flashinfer"))
    for field, name in fields:
        with pytest.raises(ConfigError, match=f"{field}='{name}' cannot be used: it needs a CUDA device, got cpu"):
            Engine(EngineConfig(model, device="cpu", num_page_override=8, **{field: name}))


class Recording(TorchAttnBackend):
    """The torch backend, recording (phase, padded size) of each batch it is handed; its own name."""

    supports_cuda_graph = True

    def __init__(self, kv: KVCachePool, table: torch.Tensor, heads: int, device: torch.device, name: str) -> None:
        super().__init__(kv, table, heads)
        self.name = name
        self.batches: list[tuple[str, int]] = []
        self.captured: list[int] = []

    def prepare_metadata(self, batch: Batch) -> None:
        self.batches.append((batch.phase, batch.padded_size))
        super().prepare_metadata(batch)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        assert self.batches and self.batches[-1] == (ctx.batch.phase, ctx.batch.padded_size)
        return super().forward(q, layer_id, ctx)

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        self.captured += bs_list


def _recording(name: str) -> Recording:
    pool = KVCachePool(1, 4, 1, 1, 16, torch.float32, CPU)
    return Recording(pool, torch.zeros(3, 4, dtype=torch.int32), 1, CPU, name)


def _batch(phase: str, size: int) -> Batch:
    req = Req(torch.zeros(1, dtype=torch.int32), 0, 0, 1, 0, SamplingParams())
    batch = Batch([req] * size, "decode" if phase == "decode" else "prefill")
    batch.table_rows = torch.zeros(size, dtype=torch.int64)
    return batch


def test_a_hybrid_sends_small_decode_batches_to_its_decode_backend_and_the_rest_elsewhere() -> None:
    decode, rest = _recording("fast_decode"), _recording("paged")
    hybrid = HybridAttnBackend("mine", decode, rest, decode_max_bs=2)
    for phase, size in [("decode", 1), ("decode", 2), ("decode", 3), ("prefill", 1), ("prefill", 4)]:
        batch = _batch(phase, size)
        served = decode if phase == "decode" and size <= 2 else rest
        assert hybrid.backend_for(batch) is served
        assert hybrid.delegate(batch) == (None if served is decode else "paged")
        hybrid.prepare_metadata(batch)
    assert decode.batches == [("decode", 1), ("decode", 2)]
    assert rest.batches == [("decode", 3), ("prefill", 1), ("prefill", 4)]
    hybrid.init_capture_graph(4, [1, 2, 4, 8])
    assert (decode.captured, rest.captured) == ([1, 2], [4, 8])
    assert hybrid.supports_cuda_graph
    assert hybrid.describe() == (
        "mine: decode batches of up to 2 padded rows on fast_decode, every other batch on paged"
    )


def test_a_hybrid_captures_graphs_only_where_each_captured_size_has_a_capturing_backend() -> None:
    rest = _recording("paged")
    rest.supports_cuda_graph = False  # the torch backend's case
    every = HybridAttnBackend("mine", _recording("fast_decode"), rest, decode_max_bs=None)
    assert every.supports_cuda_graph and every.decodes(10**6)
    assert every.describe() == "mine: every decode batch on fast_decode, every other batch on paged"
    assert not HybridAttnBackend("mine", _recording("fast_decode"), rest, decode_max_bs=1).supports_cuda_graph


def test_the_triton_backend_states_its_routes_and_takes_the_first_usable_rest() -> None:
    """`triton` is Triton decode up to DECODE_MAX_BS rows beside FlashInfer, else every decode batch beside torch;
    built here on CPU with a recording stand-in for the Triton decode backend, so the torch route is the one taken."""
    factory = ATTENTION_BACKENDS.factory("triton")
    assert isinstance(factory, Hybrid)
    assert factory.decode is TritonDecodeBackend
    assert factory.routes == (Route("flashinfer", DECODE_MAX_BS), Route("torch", None))
    stand_in = replace(factory, decode=lambda kv, table, heads, device: Recording(kv, table, heads, device, "stub"))
    pool = KVCachePool(1, 4, 1, 1, 16, torch.float32, CPU)
    backend = stand_in(pool, torch.zeros(3, 4, dtype=torch.int32), 1, CPU)
    assert isinstance(backend, HybridAttnBackend) and isinstance(backend.rest, TorchAttnBackend)
    assert backend.name == "triton" and backend.decode_max_bs is None
    assert backend.describe() == "triton: every decode batch on stub, every other batch on torch"


def test_a_hybrid_with_no_usable_rest_is_refused() -> None:
    factory = Hybrid("mine", lambda kv, table, heads, device: _recording("d"), (Route("flashinfer", 1),))
    pool = KVCachePool(1, 4, 1, 1, 16, torch.float32, CPU)
    with pytest.raises(ConfigError, match="no backend for its rest \\(flashinfer: it needs a CUDA device, got cpu\\)"):
        factory(pool, torch.zeros(3, 4, dtype=torch.int32), 1, CPU)


def test_a_registered_hybrid_serves_an_engine_batch_by_batch(tiny_models: dict[str, Path]) -> None:
    """Decode batches of up to 2 rows on the decode backend, every prefill and the 3-row decode batches on torch;
    the tokens are the torch backend's, bit for bit."""
    built: list[Recording] = []

    def decode(kv: KVCachePool, table: torch.Tensor, heads: int, device: torch.device) -> BaseAttnBackend:
        built.append(Recording(kv, table, heads, device, "test_decode"))
        return built[-1]

    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (2, 4, 6)]
    outputs = {}
    ATTENTION_BACKENDS.register("test-hybrid", Hybrid("test-hybrid", decode, (Route("torch", 2),)))
    try:
        for name in ("test-hybrid", "torch"):
            engine = Engine(EngineConfig(str(tiny_models["qwen3"]), device="cpu", attention_backend=name,
                                         num_page_override=32, max_running_req=4))
            outputs[name] = [g.output_ids for g in StaticDriver(engine).generate(prompts, params)]
            engine.shutdown()
    finally:
        ATTENTION_BACKENDS.unregister("test-hybrid")
    assert outputs["test-hybrid"] == outputs["torch"]
    assert len(built) == 1 and set(built[0].batches) == {("decode", 2), ("decode", 1)}
