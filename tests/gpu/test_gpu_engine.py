"""The engine on CUDA: device and backend selection, its own stream, pinned async copies, a real CUDA event, and
KV planning from torch.cuda.mem_get_info."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_support import HAS_FLASHINFER, gpu_engine, needs_cuda, random_prompt

from engine import Batch, Engine, EngineConfig, ForwardOutput, Req, SamplingParams
from engine.attention import DECODE_MAX_BS
from engine.attention.hybrid import HybridAttnBackend
from engine.kvcache import KVCachePool
from engine.layers.linear import Linear, MergedLinear
from oracle.drive import hand_passes
from oracle.target import Target

pytestmark = needs_cuda


def test_auto_picks_cuda_bf16_and_the_right_backend(tiny_models: dict[str, Path], wide_models: dict[str, Path]) -> None:
    # auto takes the triton hybrid: decode up to DECODE_MAX_BS rows on Triton, the rest on FlashInfer where it serves
    # (head_dim 64 and the package), else every decode on Triton and the rest on torch; graphs either way.
    for models, rest in ((tiny_models, "torch"), (wide_models, "flashinfer" if HAS_FLASHINFER else "torch")):
        engine = Engine(EngineConfig(str(models["llama"]), num_page_override=16, max_running_req=2))
        assert engine.device.torch_device == torch.device("cuda", 0) and engine.dtype == torch.bfloat16
        backend = engine.attn_backend
        assert isinstance(backend, HybridAttnBackend) and backend.name == "triton" and engine.graph_runner.enabled
        assert backend.rest.name == rest and backend.decode_max_bs == (None if rest == "torch" else DECODE_MAX_BS)
        engine.shutdown()


def test_forward_runs_on_its_own_stream_with_a_real_event(gpu_target: Target, wide_models: dict[str, Path]) -> None:
    engine = gpu_engine(gpu_target, wide_models["qwen3"])
    stream = engine.device.stream
    assert isinstance(stream, torch.cuda.Stream) and stream != torch.cuda.default_stream()
    prompt = torch.tensor(random_prompt(1, 9, 512), dtype=torch.int32)
    req = Req(prompt, 0, 0, 2, 0, SamplingParams(max_tokens=2))
    engine.page_table[0, :11] = torch.arange(11, dtype=torch.int32, device="cuda")
    out = engine.forward_batch(*engine.prepare_batch([req], "prefill"))
    assert isinstance(out.copy_done_event, torch.cuda.Event)
    assert out.next_tokens_cpu.is_pinned() and out.next_tokens_gpu.is_cuda
    out.copy_done_event.synchronize()
    assert out.copy_done_event.query()
    assert int(out.next_tokens_cpu[0]) == int(out.next_tokens_gpu[0]) == int(out.logits[0].argmax())
    engine.shutdown()


def test_the_stream_context_switches_to_the_engines_stream_and_back(gpu_target: Target,
                                                                     wide_models: dict[str, Path]) -> None:
    """Device.stream_context (engine/device.OnStream): the engine's stream inside, nested too, and the caller's own
    stream (here a side stream) current again after, also when the block raises."""
    engine = gpu_engine(gpu_target, wide_models["qwen3"])
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with engine.device.stream_context():
            assert torch.cuda.current_stream() == engine.device.stream
            with engine.device.stream_context():
                assert torch.cuda.current_stream() == engine.device.stream
            assert torch.cuda.current_stream() == engine.device.stream
        assert torch.cuda.current_stream() == side
        with pytest.raises(RuntimeError, match="boom"), engine.device.stream_context():
            raise RuntimeError("boom")
        assert torch.cuda.current_stream() == side
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    engine.shutdown()


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_step_outputs_are_ordered_before_the_callers_stream(
    gpu_target: Target, wide_models: dict[str, Path], phase: str
) -> None:
    """The engine's stream is held back by a long sleep; a read on the caller's stream straight after forward_batch
    must still see the step's logits and tokens (eager prefill; decode replays a graph's static outputs where the
    target has graphs)."""
    engine = gpu_engine(gpu_target, wide_models["qwen3"])
    prompt = torch.tensor(random_prompt(2, 9, 512), dtype=torch.int32)
    req = Req(prompt, 0, 0, 3, 0, SamplingParams(max_tokens=3))
    engine.page_table[0, :12] = torch.arange(12, dtype=torch.int32, device="cuda")
    if phase == "decode":
        req.append_host(int(engine.forward_batch(*engine.prepare_batch([req], "prefill")).next_tokens_cpu[0]))
    batch, args = engine.prepare_batch([req], phase)
    with torch.cuda.stream(engine.device.stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles before the step runs
    out = engine.forward_batch(batch, args)
    logits, tokens = out.logits.clone(), out.next_tokens_gpu.clone()  # on the caller's stream
    torch.cuda.synchronize()
    assert torch.equal(logits, out.logits) and torch.equal(tokens, out.next_tokens_gpu)
    engine.shutdown()


def test_kv_pool_is_planned_from_free_device_memory(gpu_target: Target, wide_models: dict[str, Path]) -> None:
    free_before, _ = torch.cuda.mem_get_info()
    ratio = 0.02
    engine = gpu_engine(gpu_target, wide_models["llama"], num_page_override=None, memory_ratio=ratio, page_size=16)
    cfg = engine.model_config
    per_page = KVCachePool.bytes_per_page(cfg.num_layers, 16, cfg.num_kv_heads, cfg.head_dim, gpu_target.torch_dtype)
    pool = engine.num_pages * per_page
    # The engine measures free memory itself, after this test's measurement: it can only have seen less.
    assert pool <= ratio * free_before
    assert pool >= 0.5 * ratio * free_before, f"{engine.num_pages} pages use far less than {ratio:.0%} of free memory"
    engine.shutdown()


def test_the_torch_backend_serves_cuda_too(gpu_target: Target, wide_models: dict[str, Path]) -> None:
    """The fallback and reference backend: forced on a model FlashInfer could serve, in float16 as well."""
    engine = gpu_engine(gpu_target, wide_models["qwen2"], attention_backend="torch", dtype="float16")
    assert engine.attn_backend.name == "torch" and engine.kv_cache.buffer.dtype == torch.float16
    assert not engine.graph_runner.enabled  # the torch backend cannot be captured
    prompt = random_prompt(2, 5, 512)
    engine.page_table[0, :6] = torch.arange(6, dtype=torch.int32, device="cuda")
    out = engine.forward_batch(*engine.prepare_batch([Req(torch.tensor(prompt, dtype=torch.int32), 0, 0, 1, 0,
                                                          SamplingParams())], "prefill"))
    out.copy_done_event.synchronize()
    assert torch.isfinite(out.logits).all()
    engine.shutdown()


@pytest.mark.parametrize(
    "params",
    [SamplingParams(max_tokens=4), SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=4)],
    ids=["greedy", "sampled"],
)
def test_a_pass_starts_without_waiting_for_the_device(
    gpu_target: Target, wide_models: dict[str, Path], params: SamplingParams
) -> None:
    """prepare_batch and forward_batch of a prefill and of decode passes (graph replay where the target has graphs,
    pending tokens read on the device) never synchronize: torch's sync debug mode turns any synchronizing call into
    an error. Only result() waits, and the tokens are those of a run that appends each token before the next pass."""

    def run(pipelined: bool) -> list[list[int]]:
        engine = gpu_engine(gpu_target, wide_models["qwen3"])
        engine.page_table[:2, :16] = torch.arange(32, dtype=torch.int32, device="cuda").view(2, 16)
        reqs = [Req(random_prompt(i, 5 + i, 512), i, 0, 4, i, params) for i in range(2)]
        assert engine.graph_runner.can_use_graph(Batch(reqs, "decode")) == engine.graph_runner.enabled
        torch.cuda.synchronize()

        def launch(batch: list[Req], phase: str) -> ForwardOutput:
            torch.cuda.set_sync_debug_mode("error" if pipelined else 0)
            try:
                return engine.forward_batch(*engine.prepare_batch(batch, phase))  # type: ignore[arg-type]
            finally:
                torch.cuda.set_sync_debug_mode(0)

        tokens = hand_passes(engine, reqs, ["prefill", "decode", "decode", "decode"], pipelined, launch)
        assert [r.device_len for r in reqs] == [9, 10]
        engine.shutdown()
        return tokens

    assert run(pipelined=True) == run(pipelined=False)


def test_narrowing_weights_are_column_major_with_bitwise_equal_products(
    gpu_target: Target, wide_models: dict[str, Path]
) -> None:
    """With the torch layer kernels (cuBLAS), o_proj and down_proj keep their weights column-major on CUDA (a faster
    batch-1 GEMV); the products equal those of HF's row-major layout bit for bit, so parity with HF is untouched.
    The Triton kernels keep every weight row-major, which their own GEMV reads."""
    engine = gpu_engine(gpu_target, wide_models["qwen3"], layer_kernels="torch")
    layer = engine.model.model.layers[0]
    linears = [m for m in engine.model.modules() if isinstance(m, Linear) and not isinstance(m, MergedLinear)]
    narrowing = [m for m in linears if m.weight.shape[1] > m.weight.shape[0]]
    assert layer.mlp.down_proj in narrowing  # the tiny model's o_proj is square
    assert all(m.weight.stride() == (1, m.weight.shape[0]) for m in narrowing)
    assert all(m.weight.is_contiguous() for m in linears if m not in narrowing)
    assert layer.self_attn.qkv_proj.weight.is_contiguous()
    g = torch.Generator(device="cuda").manual_seed(0)
    for module in narrowing:
        for bs in (1, 8, 64):
            x = torch.randn(bs, module.weight.shape[1], device="cuda", dtype=gpu_target.torch_dtype, generator=g)
            assert torch.equal(module(x, engine.ctx), torch.nn.functional.linear(x, module.weight.contiguous()))
    engine.shutdown()
    triton = gpu_engine(gpu_target, wide_models["qwen3"], layer_kernels="triton")
    assert all(m.weight.is_contiguous() for m in triton.model.modules() if isinstance(m, Linear))
    triton.shutdown()
