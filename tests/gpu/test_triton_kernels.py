"""The Triton layer kernels against the torch reference (HF's op sequences) on CUDA.

The kernels take HF's rounding steps, so RoPE and the KV store are checked bit for bit. The norms and SiLU-and-mul
may differ in the last bit where a float32 sum of squares or an exp lands on the other side of a bf16 rounding
boundary: at most one bf16 ulp, on at most 1% of elements. Then the engine with each
kernel set: same greedy tokens, close logits.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from gpu_support import TOL, generate, gpu_engine, needs_cuda, random_prompt
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.layers.kernels import LAYER_KERNELS, TORCH_KERNELS, LayerKernels
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig
from engine.registry import Where
from engine.step.kernels import STEP_KERNELS, TORCH_STEP_KERNELS
from engine.step.slots import SlotQuery
from engine.validate import Limits
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


# Every shape at one row; the narrowing ones (o_proj, down_proj) also at several.
GEMV_CASES = [(1, n, k) for n, k in ((4096, 1024), (1024, 2048), (1024, 3072), (50, 24), (64, 2500))] + [
    (rows, n, k) for rows in (3, 8) for n, k in ((1024, 2048), (1024, 3072), (24, 50))
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
    rows = x(3, 100)[:, 10:74]  # row stride 100, not 64
    exact = rows.double() @ narrowing.double().T
    gap = (triton_kernels.linear(rows, narrowing).double() - exact).abs()
    assert bool((gap <= dot_bound(exact, rows.double().abs() @ narrowing.double().abs().T, 64, torch.bfloat16)).all())
    for inputs, w in ((x(tk.GEMV_MAX_ROWS + 1, 64), narrowing), (x(2, 32), widening)):
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


@settings(max_examples=150, deadline=None)
@given(
    page_size=st.sampled_from((1, 2, 4, 16)),
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 39)), min_size=1, max_size=5),
    live=st.lists(st.integers(1, 40), max_size=3),
    faults=st.lists(st.tuples(st.sampled_from(["out", "negative", "alias", "twice", "offset"]), st.integers(0, 10**6)),
                    max_size=2),
    seed=st.integers(0, 2**32 - 1),
    pads=st.integers(0, 2),
)
def test_the_triton_slot_check_is_the_torch_one(
    page_size: int, lengths: list[tuple[int, int]], live: list[int], faults: list[tuple[str, int]], seed: int,
    pads: int,
) -> None:
    """Random batches over a shuffled, page-structured page table, with faults that must be refused (slots out
    of the pool, a write over cached or live KV, two tokens on one slot, a slot off its page offset), padded as a
    graph pads them (requests of device_len 0 on the dummy row): the same out_loc for every new token, the same
    rows to read and the same verdict as engine/step/slots.py's torch reference."""
    rnd = random.Random(seed)
    num_pages, width = 64, 48
    limits = Limits(max_rows=8, max_seq_len=width, vocab=512, num_slots=num_pages * page_size, page_size=page_size)
    table = torch.zeros(9, width, dtype=torch.int32)
    free = list(range(num_pages))
    rnd.shuffle(free)
    reqs = [(device_len, min(cached, device_len - 1)) for device_len, cached in lengths]
    if pads:  # a graph's layout: decode, one token per request
        reqs = [(device_len, device_len - 1) for device_len, _ in reqs]
    rows = list(range(len(reqs) + len(live)))
    for row, n in zip(rows, [d for d, _ in reqs] + live):
        for start in range(0, n, page_size):
            if not free:
                return
            page = free.pop()
            table[row, start : start + page_size] = page * page_size + torch.arange(page_size)[: width - start]
    for kind, pick in faults:
        r = pick % len(reqs)
        device_len, cached = reqs[r]
        col = cached + pick % (device_len - cached)  # a written column
        if kind == "out":
            table[r, pick % device_len] = limits.num_slots + pick % 7
        elif kind == "negative":
            table[r, pick % device_len] = -1 - pick % 5
        elif kind == "alias" and (cached or live):
            src = (len(reqs), pick % live[0]) if live and pick % 2 else (r, pick % max(cached, 1))
            table[r, col] = table[src]
        elif kind == "twice" and len(reqs) > 1:
            other = (r + 1) % len(reqs)
            table[r, col] = table[other, reqs[other][1]]
        elif kind == "offset" and page_size > 1:
            table[r, col] = table[r, col] + 1
    device = torch.device("cuda")
    extend = [d - c for d, c in reqs]
    starts = [0]
    for e in extend[:-1]:
        starts.append(starts[-1] + e)
    token_req = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor(extend))
    positions = torch.cat([torch.arange(c, d) for d, c in reqs])
    table[limits.max_rows] = limits.num_slots + torch.arange(width) % page_size  # the dummy row
    n = len(reqs)
    starts += list(range(sum(extend), sum(extend) + pads))
    token_req = torch.cat([token_req, torch.arange(n, n + pads)])
    positions = torch.cat([positions, torch.zeros(pads, dtype=torch.int64)])
    reqs += [(0, 0)] * pads
    rows = rows[:n] + [limits.max_rows] * pads + rows[n:]

    def dev(values: list[int] | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(values, dtype=torch.int64).to(device)

    query = SlotQuery(
        dev(rows[: len(reqs)]), dev([c for _, c in reqs]), dev([d for d, _ in reqs]), dev(starts), dev(token_req),
        dev(positions), dev(rows[len(reqs):]), dev(live), max(d for d, _ in reqs), max(live, default=0),
    )
    table = table.to(device)
    want_loc, want_rows, want = TORCH_STEP_KERNELS.slot_check(table, query, limits, pads > 0)
    got_loc, got_rows, got = STEP_KERNELS.factory("triton")().slot_check(table, query, limits, pads > 0)
    assert bool(got) == bool(want)
    assert torch.equal(got_loc, want_loc) and torch.equal(got_rows, want_rows)
    assert (got_loc[len(got_loc) - pads :] == limits.num_slots).all(), "padding writes the dummy page"


@settings(max_examples=40, deadline=None)
@given(
    bs=st.integers(1, 9),
    vocab=st.sampled_from((7, 2048, 4097, 151936)),
    specials=st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["nan", "+inf", "-inf row", "tie"]),
                                st.integers(0, 10**6)), max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
def test_greedy_step_is_the_torch_one(bs: int, vocab: int, specials: list[tuple[int, str, int]], seed: int) -> None:
    """A captured step's greedy tokens, last tokens and payload: the same as engine/sample.py's greedy_tokens and
    keep_tokens, with rows of NaN, +inf, all -inf (-1, kept as 0) and exact ties at the maximum (first index)."""
    logits = torch.randn(bs, vocab, generator=_gen(seed), device="cuda")
    for row, kind, pick in specials:
        row %= bs
        if kind == "nan":
            logits[row, pick % vocab] = float("nan")
        elif kind == "+inf":
            logits[row, pick % vocab] = float("inf")
        elif kind == "-inf row":
            logits[row] = float("-inf")
        else:
            top = logits[row].max() + 1
            logits[row, pick % vocab] = top
            logits[row, (pick * 7 + 1) % vocab] = top
    rows = torch.randperm(12, generator=torch.Generator().manual_seed(seed))[:bs].cuda()
    flags = torch.tensor([seed % 2 == 0], device="cuda")
    last = torch.arange(100, 112, dtype=torch.int32, device="cuda")
    want_last, got_last = last.clone(), last.clone()
    want = TORCH_STEP_KERNELS.greedy_step(logits, want_last, rows, flags)
    got = STEP_KERNELS.factory("triton")().greedy_step(logits, got_last, rows, flags)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got_last, want_last)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_graph_page_ids_in_one_launch(page_size: int) -> None:
    """attention/page_ids.py's page_ids writes what flashinfer_backend.graph_page_ids (its torch statement) writes."""
    from engine.attention.flashinfer_backend import graph_page_ids
    from engine.attention.page_ids import page_ids

    width, bs = 96, 5
    table = torch.randint(0, 4000, (bs + 2, width), dtype=torch.int32, generator=torch.Generator().manual_seed(3))
    pages = torch.tensor([1, 0, 24, 7, 3])[:bs] if page_size == 4 else torch.tensor([1, 0, 6, 2, 3])
    pages = pages.clamp(max=-(-width // page_size))
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).to(torch.int32).cuda()
    rows = torch.tensor([6, 0, 3, 2, 5]).cuda()
    max_pages = -(-width // page_size)
    want = torch.full((bs * max_pages + 1,), -7, dtype=torch.int32, device="cuda")
    got = want.clone()
    table = table.cuda()
    graph_page_ids(table, rows, indptr, torch.arange(max_pages, device="cuda"), page_size, want)
    page_ids(table, rows, indptr, max_pages, page_size, got)
    assert torch.equal(got[:-1], want[:-1])
