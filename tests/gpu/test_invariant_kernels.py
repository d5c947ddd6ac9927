"""The batch-invariant kernels on CUDA (EngineConfig.batch_invariant): the matmul whose tiles and split-K follow the
weight's shape alone (engine/layers/triton_matmul.py) and per-token paged attention (engine/attention/
triton_invariant.py's use of the decode kernel with a constant split count). Each row or token computed in any batch,
at any position in it, among any other rows, is bitwise the same row computed alone; and both are close to a float64
reference. Then an engine on
``cuda-bf16,invariant=on``: its backends, captured graphs, and one batch bitwise its solo runs.

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter (float32 and
float16 there: the interpreter has no bfloat16 dot).
"""

from __future__ import annotations

import inspect
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from gpu_support import KERNEL_DEVICE as DEVICE
from gpu_support import needs_kernel_device  # noqa: E402

from engine.attention.triton_decode import paged_decode  # noqa: E402
from engine.attention.triton_invariant import SPLITS  # noqa: E402
from engine.layers import triton_matmul  # noqa: E402
from engine.layers.kernels import TritonInvariantKernels  # noqa: E402
from engine.layers.triton_matmul import BLOCK_M, Tiles, matmul, tiles  # noqa: E402
from oracle.drive import TINY_VOCAB  # noqa: E402
from oracle.target import Target, parse  # noqa: E402

pytestmark = needs_kernel_device
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
ROW_COUNTS = (1, 2, 3, 7, 8, 9, 64, 65)  # each side of 8 and of BLOCK_M
# Weight shapes [n, k] through each of tiles()'s choices: narrow tiles without and with split-K (a short last split
# among them), and wide tiles without.
SHAPES = [(5, 7), (70, 1000), (40, 600), (16896, 24)]


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 5, 7), (3, 70, 130), (BLOCK_M + 1, 33, 64), (2 * BLOCK_M + 2, 64, 200)])
def test_matmul_rows_are_those_of_any_batch(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(m * n + k)
    x, w, b = _randn(gen, m, k, dtype=dtype), _randn(gen, n, k, dtype=dtype), _randn(gen, n, dtype=dtype)
    out = matmul(x, w, b)
    ref = F.linear(x.double(), w.double(), b.double())
    bound = (2.0**-7 if dtype == torch.bfloat16 else 2.0**-9) * ref.abs().max().item()
    assert (out.double() - ref).abs().max().item() <= bound
    for i in {0, m // 2, m - 1}:
        assert torch.equal(matmul(x[i : i + 1], w, b), out[i : i + 1]), f"row {i} alone"
        shuffled = torch.cat([x[i:], x[:i]])
        assert torch.equal(matmul(shuffled, w, b)[0], out[i]), f"row {i} first"
    assert torch.equal(matmul(x, w.t().contiguous().t(), b), out), "a column-major weight"
    assert matmul(x.view(1, m, k), w).shape == (1, m, n)


def test_tiles_follow_the_weight_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert list(inspect.signature(tiles).parameters) == ["n", "k"]
    assert {tiles(n, k)[:2] for n, k in SHAPES} == {(32, 1), (32, 4), (32, 2), (64, 1)}
    seen: list[tuple[int, int]] = []

    def recording(n: int, k: int) -> Tiles:
        seen.append((n, k))
        return tiles(n, k)

    monkeypatch.setattr(triton_matmul, "tiles", recording)
    w = torch.zeros(70, 1000, device=DEVICE)
    for m in (1, 9):
        matmul(torch.zeros(m, 1000, device=DEVICE), w)
    assert seen == [(70, 1000)] * 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,k", SHAPES)
def test_a_matmul_row_is_the_same_whatever_the_other_rows_and_their_count(dtype: torch.dtype, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    row, w, b = _randn(gen, 1, k, dtype=dtype), _randn(gen, n, k, dtype=dtype), _randn(gen, n, dtype=dtype)
    alone = matmul(row, w, b)
    ref = F.linear(row.double(), w.double(), b.double())
    bound = (2.0**-7 if dtype == torch.bfloat16 else 2.0**-9) * ref.abs().max().item()
    assert (alone.double() - ref).abs().max().item() <= bound
    place = random.Random(n * k)
    for m in ROW_COUNTS:
        x = _randn(gen, m, k, dtype=dtype)
        i = place.randrange(m)
        x[i] = row[0]
        assert torch.equal(matmul(x, w, b)[i], alone[0]), f"row {i} of {m}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group,head_dim", [(1, 16), (2, 64), (3, 32)])
def test_per_token_attention_is_that_of_any_batch(dtype: torch.dtype, group: int, head_dim: int) -> None:
    """Two requests' tokens (a prefill chunk of one, a decode token of the other) through a shuffled page table:
    each token's output equals the same token alone, and softmax(q k^T) v over its first position + 1 keys."""
    gen = torch.Generator().manual_seed(group * head_dim)
    kv_heads, lens = 2, [70, 9]
    num_slots = sum(lens) + 3
    k_slots = _randn(gen, num_slots, kv_heads, head_dim, dtype=dtype)
    v_slots = _randn(gen, num_slots, kv_heads, head_dim, dtype=dtype)
    table = torch.zeros(3, max(lens) + 4, dtype=torch.int32)
    perm = torch.randperm(num_slots, generator=gen)
    table[2, : lens[0]], table[0, : lens[1]] = perm[: lens[0]].int(), perm[lens[0] : sum(lens)].int()
    table = table.to(DEVICE)
    positions = torch.tensor([*range(lens[0] - 6, lens[0]), lens[1] - 1], dtype=torch.int32, device=DEVICE)
    rows = torch.tensor([2] * 6 + [0], dtype=torch.int64, device=DEVICE)
    q = _randn(gen, len(rows), kv_heads * group, head_dim, dtype=dtype)
    scale = head_dim**-0.5
    out = paged_decode(q, k_slots, v_slots, table, rows, positions + 1, scale, SPLITS)
    for t in range(len(rows)):
        alone = paged_decode(q[t : t + 1], k_slots, v_slots, table, rows[t : t + 1], positions[t : t + 1] + 1, scale,
                             SPLITS)
        assert torch.equal(alone[0], out[t]), f"token {t} alone"
        slots = table[rows[t], : int(positions[t]) + 1].long()
        keys = k_slots[slots].double().repeat_interleave(group, 1)
        values = v_slots[slots].double().repeat_interleave(group, 1)
        weights = torch.softmax(torch.einsum("hd,shd->hs", q[t].double(), keys) * scale, dim=-1)
        ref = torch.einsum("hs,shd->hd", weights, values)
        bound = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-9 if dtype == torch.float16 else 1e-5
        assert (out[t].double() - ref).abs().max().item() <= bound * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_token_attends_the_same_whatever_the_batch(dtype: torch.dtype) -> None:
    """One decode token, with fewer keys than splits' blocks (empty splits), a few, and more than all splits' blocks,
    in batches of random other tokens of random lengths: its output is bitwise the same as alone."""
    gen = torch.Generator().manual_seed(7)
    group, head_dim, kv_heads, width = 2, 16, 2, 1200
    rows_total = 12
    num_slots = rows_total * width
    k_slots = _randn(gen, num_slots, kv_heads, head_dim, dtype=dtype)
    v_slots = _randn(gen, num_slots, kv_heads, head_dim, dtype=dtype)
    table = torch.randperm(num_slots, generator=gen).view(rows_total, width).int().to(DEVICE)
    scale = head_dim**-0.5
    place = random.Random(3)
    for length in (1, 70, 1100):
        q = _randn(gen, 1, kv_heads * group, head_dim, dtype=dtype)
        lens = torch.tensor([length], dtype=torch.int32, device=DEVICE)
        alone = paged_decode(q, k_slots, v_slots, table, torch.zeros(1, dtype=torch.int64, device=DEVICE), lens,
                             scale, SPLITS)
        for bs in (2, 3, 9):
            i = place.randrange(bs)
            qs = _randn(gen, bs, kv_heads * group, head_dim, dtype=dtype)
            qs[i] = q[0]
            rows = torch.tensor(place.sample(range(1, rows_total), bs), dtype=torch.int64)
            rows[i] = 0
            others = torch.tensor([place.randint(1, width) for _ in range(bs)], dtype=torch.int32)
            others[i] = length
            out = paged_decode(qs, k_slots, v_slots, table, rows.to(DEVICE), others.to(DEVICE), scale, SPLITS)
            assert torch.equal(out[i], alone[0]), f"{length} keys, token {i} of {bs}"


@pytest.mark.skipif(DEVICE != "cuda", reason="an engine on CUDA")
def test_an_invariant_engine_runs_its_kernels_with_graphs_and_a_batch_matches_its_solo_runs(
    wide_models: dict[str, Path], gpu_target: Target,
) -> None:
    """On the session's target where it is an invariant one, else on cuda-bf16,invariant=on."""
    from gpu_support import generate, gpu_engine, random_prompt

    target = gpu_target if gpu_target.invariant else parse("cuda-bf16,invariant=on").require()
    engine = gpu_engine(target, wide_models["qwen3"])
    try:
        assert engine.attn_backend.name == "triton_invariant" and isinstance(engine.ctx.kernels, TritonInvariantKernels)
        assert engine.graph_runner.enabled
        prompts = [random_prompt(i, n, TINY_VOCAB) for i, n in enumerate((9, 30, 5))]
        batched = generate(engine, prompts, [6, 3, 5])
        for prompt, ours in zip(prompts, batched):
            solo = generate(engine, [prompt], len(ours.output_ids))[0]
            assert ours.output_ids == solo.output_ids
            assert all(torch.equal(a, b) for a, b in zip(ours.logits, solo.logits))
    finally:
        engine.shutdown()
