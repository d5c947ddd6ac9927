"""The Triton layer kernels against the torch reference (HF's op sequences) on CUDA.

The kernels take HF's rounding steps, so RoPE and the KV store are checked bit for bit. The norms and SiLU-and-mul
may differ in the last bit where a float32 sum of squares or an exp lands on the other side of a bf16 rounding
boundary: at most one bf16 ulp, on at most 1% of elements. Then the engine with each
kernel set: same greedy tokens, close logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gpu_support import TOL, generate, gpu_engine, needs_cuda, random_prompt

from engine.layers.kernels import LAYER_KERNELS, TORCH_KERNELS, LayerKernels
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig
from engine.registry import Where
from oracle.checks import compare_greedy
from oracle.target import Target
from oracle.tolerance import KERNEL_ULPS, dot_bound, rounding_bound

pytestmark = [
    *needs_cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available()
        or LAYER_KERNELS.unusable("triton", Where(torch.device("cuda"), torch.bfloat16, 128)) is not None,
        reason="needs CUDA and triton",
    ),
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _close_to_last_bit(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype
    differ = got != ref
    gap = (got.float() - ref.float()).abs()
    what = f"{differ.sum().item()} of {differ.numel()} elements differ, max gap {gap.max().item()}"
    assert differ.float().mean().item() <= 0.01, what
    assert bool((gap <= rounding_bound(ref, ref.dtype, KERNEL_ULPS)).all()), what


@pytest.fixture(scope="module")
def triton_kernels() -> LayerKernels:
    return LAYER_KERNELS.factory("triton")()


@pytest.mark.parametrize("cols", [64, 1024, 4096])
def test_rms_norm(triton_kernels: LayerKernels, cols: int) -> None:
    x = torch.randn(37, cols, device="cuda", generator=_gen(cols)).mul(3).bfloat16()
    w = torch.randn(cols, device="cuda", generator=_gen(cols + 1)).bfloat16()
    _close_to_last_bit(triton_kernels.rms_norm(x, w, 1e-6), TORCH_KERNELS.rms_norm(x, w, 1e-6))


def test_add_rms_norm(triton_kernels: LayerKernels) -> None:
    x, r = (torch.randn(29, 1024, device="cuda", generator=_gen(s)).bfloat16() for s in (1, 2))
    w = torch.randn(1024, device="cuda", generator=_gen(3)).bfloat16()
    out, total = triton_kernels.add_rms_norm(x, r, w, 1e-6)
    ref_out, ref_total = TORCH_KERNELS.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(total, ref_total)
    _close_to_last_bit(out, ref_out)


def test_float32_norm_matches_closely(triton_kernels: LayerKernels) -> None:
    x = torch.randn(16, 1024, device="cuda", generator=_gen(5))
    w = torch.randn(1024, device="cuda", generator=_gen(6))
    torch.testing.assert_close(triton_kernels.rms_norm(x, w, 1e-6), TORCH_KERNELS.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("with_norm", [False, True])
def test_norm_rope_on_strided_heads(triton_kernels: LayerKernels, with_norm: bool) -> None:
    tokens, heads, head_dim = 23, 16, 128
    rotary = RotaryEmbedding(head_dim, 4096, RopeConfig(theta=1e6), torch.device("cuda"))
    # q as the engine sees it: a view into a merged qkv row, so rows are strided.
    qkv = torch.randn(tokens, (heads + 2) * head_dim, device="cuda", generator=_gen(7)).mul(4).bfloat16()
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    positions = torch.randint(0, 4096, (tokens,), device="cuda", generator=_gen(8))
    norm = None
    if with_norm:
        norm = RMSNorm(head_dim, 1e-6).cuda().bfloat16()
        norm.weight.data = torch.randn(head_dim, device="cuda", generator=_gen(9)).bfloat16()
    got = triton_kernels.norm_rope(q, rotary.at(positions), norm)
    ref = TORCH_KERNELS.norm_rope(q, rotary.at(positions), norm)
    assert got.is_contiguous()
    if with_norm:
        _close_to_last_bit(got, ref)
    else:  # same rounding steps and no reduction: nothing may differ
        assert torch.equal(got, ref), f"{(got != ref).sum().item()} elements differ from HF's RoPE"


def test_silu_and_mul(triton_kernels: LayerKernels) -> None:
    x = torch.randn(19, 2 * 3072, device="cuda", generator=_gen(10)).mul(3).bfloat16()
    _close_to_last_bit(triton_kernels.silu_and_mul(x), TORCH_KERNELS.silu_and_mul(x))


# Every shape at one row; the narrowing ones (o_proj, down_proj) also at the GEMV's most rows (2, GEMV_MAX_ROWS;
# the module imports no Triton at collection).
GEMV_CASES = [(1, n, k) for n, k in ((4096, 1024), (1024, 2048), (1024, 3072), (50, 24), (64, 2500))] + [
    (2, n, k) for n, k in ((1024, 2048), (1024, 3072), (24, 50))
]


@pytest.mark.parametrize(("rows", "out_features", "in_features"), GEMV_CASES)
@pytest.mark.parametrize("form", ["plain", "bias", "gated"])
def test_gemv_is_within_a_rounding_of_the_exact_product(
    triton_kernels: LayerKernels, rows: int, out_features: int, in_features: int, form: str
) -> None:
    """The small-batch GEMV accumulates in float32 and rounds once, as cuBLAS does: each output lies within half a
    bf16 ulp (plus float32 summation error) of the exact product of the rounded inputs, and the gated form takes
    SiLU-and-mul's own rounding steps (compared with the torch reference's bf16 input)."""
    g = _gen(rows * out_features + in_features)
    gated = form == "gated"
    x = torch.randn(rows, in_features * (2 if gated else 1), device="cuda", generator=g).bfloat16()
    w = (torch.randn(out_features, in_features, device="cuda", generator=g) / in_features**0.5).bfloat16()
    bias = torch.randn(out_features, device="cuda", generator=g).bfloat16() if form == "bias" else None
    from engine.layers import triton_gemv as tk

    assert tk.gemv_fits(x, w, gated)
    got = triton_kernels.linear(x, w, bias, gated)
    inputs = TORCH_KERNELS.silu_and_mul(x) if gated else x
    exact = inputs.double() @ w.double().T + (0 if bias is None else bias.double())
    gap = (got.double() - exact).abs()
    bound = dot_bound(exact, inputs.double().abs() @ w.double().abs().T, inputs.shape[-1], torch.bfloat16)
    assert got.dtype == torch.bfloat16 and bool((gap <= bound).all()), f"max gap {gap.max().item()}"


def test_gemv_leaves_larger_batches_and_column_major_weights_to_cublas(triton_kernels: LayerKernels) -> None:
    from engine.layers import triton_gemv as tk
    from engine.layers.triton_gemm import GEMM_MAX_ROWS

    narrowing = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    widening = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)

    def x(rows: int, width: int) -> torch.Tensor:
        return torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)

    assert tk.gemv_fits(x(1, 32), widening) and not tk.gemv_fits(x(2, 32), widening)
    assert tk.gemv_fits(x(tk.GEMV_MAX_ROWS, 64), narrowing)
    assert not tk.gemv_fits(x(tk.GEMV_MAX_ROWS + 1, 64), narrowing)
    assert not tk.gemv_fits(x(1, 64), narrowing.t().contiguous().t())
    assert not tk.gemv_fits(x(1, 63), narrowing) and not tk.gemv_fits(x(1, 64), narrowing, gated=True)
    assert tk.gemv_fits(x(1, 128), narrowing, gated=True)
    rows = x(tk.GEMV_MAX_ROWS, 100)[:, 10:74]  # row stride 100, not 64
    exact = rows.double() @ narrowing.double().T
    gap = (triton_kernels.linear(rows, narrowing).double() - exact).abs()
    assert bool((gap <= dot_bound(exact, rows.double().abs() @ narrowing.double().abs().T, 64, torch.bfloat16)).all())
    # Past the skinny GEMM's rows, and a widening product of the GEMV's rows: cuBLAS.
    for inputs, w in ((x(GEMM_MAX_ROWS + 1, 64), narrowing), (x(tk.GEMV_MAX_ROWS, 32), widening)):
        assert torch.equal(triton_kernels.linear(inputs, w), torch.nn.functional.linear(inputs, w))


def test_store_kv_writes_the_same_slots(triton_kernels: LayerKernels) -> None:
    slots, tokens, heads, head_dim = 64, 9, 8, 128
    kv = torch.randn(tokens, 3 * heads * head_dim, device="cuda", generator=_gen(12)).bfloat16()
    k = kv[:, : heads * head_dim].view(tokens, heads, head_dim)  # strided rows, as split from qkv
    v = kv[:, heads * head_dim : 2 * heads * head_dim].view(tokens, heads, head_dim)
    loc = torch.randperm(slots, device="cuda", generator=_gen(13))[:tokens].to(torch.int32)
    caches = {}
    for name, kernels in (("torch", TORCH_KERNELS), ("triton", triton_kernels)):
        k_cache = torch.zeros(slots, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.zeros_like(k_cache)
        kernels.store_kv(k_cache, v_cache, k, v, loc)
        caches[name] = (k_cache, v_cache)
    assert torch.equal(caches["torch"][0], caches["triton"][0]) and torch.equal(caches["torch"][1], caches["triton"][1])
    assert torch.equal(caches["triton"][0][loc.long()], k)


def test_engine_kernels_agree(gpu_target: Target, wide_models: dict[str, Path]) -> None:
    """The same qwen3 model (q/k norm, head_dim 64) with each kernel set: same greedy tokens (up to near-ties),
    logits within the harness's bf16 bound."""
    model = wide_models["qwen3"]
    outs = {}
    for name in ("torch", "triton"):
        engine = gpu_engine(gpu_target, model, layer_kernels=name)
        assert engine.ctx.kernels.name == name
        prompt = random_prompt(11, 40, engine.model_config.vocab_size)
        outs[name] = generate(engine, [prompt], 12)[0]
        engine.shutdown()
    ref, got = outs["torch"], outs["triton"]
    scale = max(1.0, float(ref.logits[0].abs().max()))
    assert float((ref.logits[0] - got.logits[0]).abs().max()) <= 0.06 * scale
    failure = compare_greedy(got.output_ids, got.logits, ref.output_ids, ref.logits, TOL).failure
    assert failure is None, f"triton vs torch kernels: {failure}"
