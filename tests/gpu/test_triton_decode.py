"""The Triton paged decode kernel (engine/attention/triton_decode.py) against a float64 torch reference.

Each case reads K/V through a token-granular page table (a random permutation of slots, or contiguous pages of
16 in random order) with table rows out of order, q strided in the batch dim, and per-request lengths that leave
some splits empty. Slot 0 and every slot no request owns hold NaN, and table entries past a request's length
point at slot 0, so a read outside a request's tokens shows as NaN. fp32 is checked to 1e-5; bf16 on tensor cores,
whose probabilities are rounded to bf16 before the P V product, to the harness's attention bound
(oracle/tolerance.py); bf16 in the interpreter (float32 products) to the rounding of the exact value to bf16 (a
whole ulp: the interpreter truncates) plus 1e-5 for the float32 arithmetic before it.

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gpu_support import INTERPRETED, needs_kernel_device  # noqa: E402
from gpu_support import KERNEL_DEVICE as DEVICE  # noqa: E402

from engine.attention.triton_decode import (  # noqa: E402
    NewTokens,
    block_n,
    choose_splits,
    paged_decode,
    tensor_core_products,
)
from engine.layers import triton_kernels  # noqa: E402
from engine.layers.rotary import RotaryEmbedding  # noqa: E402
from engine.layers.triton_pdl import pdl_on, pdl_release, pdl_wait  # noqa: E402
from engine.models.config import RopeConfig  # noqa: E402
from oracle.tolerance import attention_bound, unit_roundoff  # noqa: E402

pytestmark = [
    *needs_kernel_device,
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log"),  # the interpreter's log(0) of empty splits
]
PAGE = 16
# Rounding to bfloat16 is off by at most half an ulp, 2**-8 of the magnitude; the interpreter truncates instead
# (a whole ulp).
BF16_ROUNDING = unit_roundoff(torch.bfloat16) * (2 if INTERPRETED else 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _case(
    seed: int, dtype: torch.dtype, group: int, num_kv_heads: int, head_dim: int, lens: list[int], layout: str
) -> dict:
    """Inputs on DEVICE: q strided in the batch dim, k/v views of one [slots, 2, Hkv, D] buffer, a page table
    with a spare row whose rows are used in reverse, and NaN wherever no request's tokens are."""
    gen = _gen(seed)
    bs, width = len(lens), max(lens) + 5
    total = sum(_pages(n) * PAGE for n in lens)
    num_slots = 1 + total + 7
    kv = torch.full((num_slots, 2, num_kv_heads, head_dim), float("nan"))
    table = torch.zeros(bs + 1, width, dtype=torch.int32)
    rows = torch.arange(bs, 0, -1)
    if layout == "permuted":
        free = 1 + torch.randperm(num_slots - 1, generator=gen)
        owned = [free[sum(lens[:i]) : sum(lens[: i + 1])] for i in range(bs)]
    else:
        pages = torch.randperm(total // PAGE, generator=gen)
        firsts = [sum(_pages(n) for n in lens[:i]) for i in range(bs)]
        owned = [1 + (pages[f + torch.arange(n) // PAGE] * PAGE + torch.arange(n) % PAGE) for f, n in zip(firsts, lens)]
    for row, slots in zip(rows.tolist(), owned):
        table[row, : len(slots)] = slots.int()
        kv[slots] = torch.randn(len(slots), 2, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(2 * bs, group * num_kv_heads, head_dim, generator=gen)[::2]
    kv = kv.to(dtype).to(DEVICE)
    return {
        "q": q.to(dtype).to(DEVICE),
        "k_slots": kv[:, 0],
        "v_slots": kv[:, 1],
        "page_table": table.to(DEVICE),
        "table_rows": rows.to(DEVICE),
        "seq_lens": torch.tensor(lens, dtype=torch.int32, device=DEVICE),
        "scale": head_dim**-0.5,
    }


def _pages(n: int) -> int:
    return -(-n // PAGE)


def _reference(
    q: torch.Tensor, k_slots: torch.Tensor, v_slots: torch.Tensor, page_table: torch.Tensor,
    table_rows: torch.Tensor, seq_lens: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 output [bs, Hq, D], and its bound on tensor cores (attention_bound per request and head)."""
    group = q.shape[1] // k_slots.shape[1]
    outs, bounds = [], []
    for i, (row, n) in enumerate(zip(table_rows.tolist(), seq_lens.tolist())):
        slots = page_table[row, :n].long()
        k = k_slots[slots].double().repeat_interleave(group, dim=1)  # [n, Hq, D]
        v = v_slots[slots].double().repeat_interleave(group, dim=1)
        qi = q[i].double()
        p = torch.softmax(torch.einsum("hd,nhd->hn", qi, k) * scale, dim=-1)
        outs.append(torch.einsum("hn,nhd->hd", p, v))
        magnitude = torch.einsum("hd,nhd->hn", qi.abs(), k.abs()).amax(-1) * scale
        bounds.append(attention_bound(v.abs().amax(dim=(0, 2)), magnitude, n, q.shape[-1], q.dtype))
    return torch.stack(outs), torch.stack(bounds)[..., None].expand(-1, -1, q.shape[-1])


def _check(got: torch.Tensor, inputs: dict) -> None:
    ref, on_tensor_cores = _reference(**inputs)
    dtype = inputs["q"].dtype
    assert got.dtype == dtype and got.is_contiguous() and got.shape == ref.shape
    err = (got.double() - ref).abs()
    if tensor_core_products(inputs["q"], inputs["k_slots"]):
        bound = on_tensor_cores
    else:
        bound = 1e-5 + (BF16_ROUNDING * ref.abs() if dtype == torch.bfloat16 else 0.0)
    assert not err.isnan().any(), "NaN in the output"
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}, {int((err > bound).sum())} over the bound"


# (group, kv heads, head_dim, layout, num_splits, lengths): lengths of 1, shorter than num_splits * BLOCK_N (some
# splits empty), not a multiple of BLOCK_N, and long.
CASES = [
    (1, 2, 16, "permuted", 1, [1]),
    (1, 2, 64, "paged", 3, [300, 1, 37, 129, 64]),
    (2, 2, 128, "permuted", 8, [450, 1, 100, 17, 700]),
    (2, 1, 16, "paged", 1, [513]),
    (3, 2, 64, "permuted", 1, [5, 700, 1, 64, 200]),
    (3, 1, 128, "paged", 8, [1]),
    (3, 2, 16, "paged", 3, [33, 610, 2, 1, 95]),
    (4, 2, 128, "permuted", 3, [320]),
    (4, 2, 64, "paged", 8, [1, 77, 400, 16, 650]),
    (4, 1, 16, "permuted", 8, [200, 3, 31, 500, 9]),
]


@pytest.mark.parametrize("early", [False, True], ids=["after-wait", "early"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("group", "num_kv_heads", "head_dim", "layout", "num_splits", "lens"), CASES)
def test_matches_float64_reference(
    early: bool, dtype: torch.dtype, group: int, num_kv_heads: int, head_dim: int, layout: str, num_splits: int,
    lens: list[int],
) -> None:
    inputs = _case(len(lens) * 1000 + group * 100 + head_dim, dtype, group, num_kv_heads, head_dim, lens, layout)
    got = paged_decode(**inputs, num_splits=num_splits, early=early)
    _check(got, inputs)


def test_int64_lengths_and_short_splits() -> None:
    """int64 seq_lens, and lengths under one BLOCK_N with many splits: every split but the first is empty."""
    inputs = _case(7, torch.float32, 2, 2, 64, [1, 2, 15], "permuted")
    inputs["seq_lens"] = inputs["seq_lens"].long()
    assert max(inputs["seq_lens"].tolist()) < block_n(2, 64)
    _check(paged_decode(**inputs, num_splits=16), inputs)


def test_positions_with_a_length_offset_stand_for_the_lengths() -> None:
    """len_offset=1 reads each request's newest position (int64, as the backends pass them) as its length less one."""
    inputs = _case(9, torch.float32, 2, 2, 64, [450, 1, 100, 64], "paged")
    positions = inputs["seq_lens"].long() - 1
    _check(paged_decode(**{**inputs, "seq_lens": positions}, num_splits=8, len_offset=1), inputs)


def test_split_merge_leaves_its_counters_zero_for_the_next_launch() -> None:
    """The last split of each (request, kv head) merges and resets its counter: a second call on the same counters
    (the next layer, the next replay) merges again."""
    inputs = _case(5, torch.float32, 2, 2, 64, [450, 1, 100], "permuted")
    arrivals = torch.zeros(3 * 2, dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        _check(paged_decode(**inputs, num_splits=8, arrivals=arrivals), inputs)
        assert not arrivals.any(), arrivals.tolist()


def _new_tokens(inputs: dict, seed: int, normed: bool) -> tuple[torch.Tensor, NewTokens, torch.Tensor]:
    """Unrotated q, the newest tokens' k and v (at seq_lens - 1, stored at their table slots) and the positions."""
    gen = _gen(seed)
    q = inputs["q"]
    bs, _, head_dim = q.shape
    dtype, kv_heads = q.dtype, inputs["k_slots"].shape[1]
    raw = (torch.randn(bs, q.shape[1] + 2 * kv_heads, head_dim, generator=gen) * 3).to(dtype).to(DEVICE)
    q, k, v = raw.split([q.shape[1], kv_heads, kv_heads], dim=1)  # views of one qkv row, as the layer splits them
    positions = (inputs["seq_lens"] - 1).long()
    loc = inputs["page_table"][inputs["table_rows"], positions].long()
    cos, sin = RotaryEmbedding(head_dim, 4096, RopeConfig(theta=1e4), DEVICE).tables_in(dtype)
    weights = [(torch.rand(head_dim, generator=gen) + 0.5).to(dtype).to(DEVICE) if normed else None for _ in "qk"]
    return q, NewTokens(k, v, loc, cos, sin, weights[0], 1e-6, weights[1], 1e-5), positions


@pytest.mark.parametrize("normed", [False, True], ids=["plain", "qk-norm"])
@pytest.mark.parametrize(("group", "num_kv_heads", "head_dim", "layout", "num_splits", "lens"),
                         [CASES[1], CASES[2], CASES[6], CASES[8]])
def test_new_tokens_fused_as_norm_rope_store_then_decode(
    normed: bool, group: int, num_kv_heads: int, head_dim: int, layout: str, num_splits: int, lens: list[int]
) -> None:
    """With `new`, the decode stores what the fused RoPE + KV store stores (bit for bit) and attends as the decode
    after it, its q rotated in registers rather than read back."""
    inputs = _case(len(lens) * 100 + head_dim, torch.bfloat16, group, num_kv_heads, head_dim, lens, layout)
    q, new, positions = _new_tokens(inputs, head_dim + group, normed)
    want = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}
    rotary = SimpleNamespace(tables_in=lambda dtype: (new.cos, new.sin))
    want["q"] = triton_kernels.norm_rope_store(
        q, new.k, new.v, positions, rotary, new.q_weight, new.q_eps, new.k_weight, new.k_eps, want["k_slots"],
        want["v_slots"], new.loc,
    )
    got = paged_decode(**{**inputs, "q": q}, num_splits=num_splits, new=new, early=True)
    for name in ("k_slots", "v_slots"):
        assert torch.equal(inputs[name].nan_to_num(7.0), want[name].nan_to_num(7.0)), f"{name} differ from the store's"
    _check(got, want)


def test_choose_splits() -> None:
    assert choose_splits(1, 8, 8192, 132) == 16  # 264 programs wanted, capped at 16 splits
    assert choose_splits(4, 2, 300, 132) == 4  # no split under 64 tokens
    assert choose_splits(8, 8, 4096, 132) == 5  # ceil(264 / 64)
    assert choose_splits(8, 8, 4096, 66) == 3  # half the SMs: ceil(132 / 64)
    assert choose_splits(64, 8, 4096, 132) == 1  # bs * Hkv alone fills the GPU
    assert choose_splits(1, 1, 10, 132) == 1


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("num_splits", [1, 4])
def test_cuda_graph_replay_follows_device_lengths_and_rows(num_splits: int) -> None:
    inputs = _case(11, torch.bfloat16, 3, 2, 64, [40, 300, 1, 150], "paged")
    static = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}
    arrivals = torch.zeros(4 * 2, dtype=torch.int32, device=DEVICE)  # the split merge's, shared by every replay
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        paged_decode(**static, num_splits=num_splits, arrivals=arrivals, early=True)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode(**static, num_splits=num_splits, arrivals=arrivals, early=True)
    graph.replay()
    graph.replay()
    _check(out, static)
    assert not arrivals.any()

    # Swap requests 0 and 1 (rows and lengths) and shorten two: the captured launch must read the new values.
    static["table_rows"].copy_(inputs["table_rows"][[1, 0, 2, 3]])
    static["seq_lens"].copy_(torch.tensor([300, 7, 1, 150], dtype=torch.int32, device=DEVICE))
    graph.replay()
    _check(out, static)
    assert not arrivals.any()


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, SPIN_NS: tl.constexpr, BLOCK: tl.constexpr):
    """dst = src, written only SPIN_NS after its start, while it lets the next kernel start at once (PDL)."""
    pdl_release(True)
    pdl_wait(True)
    start = _now()
    now = start
    while now - start < SPIN_NS:
        now = _now()
    for first in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = first + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@pytest.mark.skipif(DEVICE != "cuda", reason="programmatic dependent launch needs CUDA")
def test_tokens_the_kernel_before_stores_are_read_after_the_wait() -> None:
    """A query of a prefill chunk (the invariant backend's rows) attends to chunk-mates the layer's store, the kernel
    just before, writes: without `early` the decode reads them after its PDL wait, so it sees a store that lands
    200 µs after both kernels started."""
    inputs = _case(13, torch.bfloat16, 2, 2, 64, [300, 120], "paged")
    if not pdl_on(inputs["q"]):
        pytest.skip("programmatic dependent launch needs Hopper")
    kv = inputs["k_slots"]._base  # [slots, 2, Hkv, D]: k_slots and v_slots are its views
    stored = kv.clone()
    for row, n in zip(inputs["table_rows"].tolist(), inputs["seq_lens"].tolist()):
        kv[inputs["page_table"][row, n - 40 : n].long()] = 100.0  # until the late store lands
    _late_copy_kernel[(4,)](stored.view(-1), kv.view(-1), kv.numel(), SPIN_NS=200_000, BLOCK=1024, launch_pdl=True)
    got = paged_decode(**inputs, num_splits=4)
    torch.cuda.synchronize()
    assert torch.equal(kv.nan_to_num(7.0), stored.nan_to_num(7.0))
    _check(got, inputs)
