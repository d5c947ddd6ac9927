"""The Triton q/k norm + RoPE + KV store (TritonKernels.norm_rope_store, one launch) against the composition it fuses
(norm_rope of q and of k, then store_kv), bit for bit, and against the torch reference (HF's op sequence): bitwise
without a norm, within a bf16 ulp with one (as norm_rope's test) or in the interpreter, whose casts to a half type
truncate.

Shapes: Qwen3-0.6B's batch-1 step (16 q heads over 8 kv heads, head_dim 128), GQA groups of 1-3, MQA, head counts
that are not powers of two; q, k, v are views of one merged qkv row, as the layer splits them; positions include the
last row of the RoPE table; the pools hold other values everywhere, so a stray write shows.

On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("triton")

from gpu_support import INTERPRETED, needs_kernel_device  # noqa: E402
from gpu_support import KERNEL_DEVICE as DEVICE

from engine.layers.kernels import TORCH_KERNELS, LayerKernels, TritonKernels  # noqa: E402
from engine.layers.rotary import RotaryEmbedding  # noqa: E402
from engine.models.config import RopeConfig  # noqa: E402
from oracle.tolerance import KERNEL_ULPS, rounding_bound  # noqa: E402

pytestmark = needs_kernel_device
MAX_POSITIONS = 4096
SLOTS = 40

# (tokens, q heads, kv heads, head_dim, dtype)
CASES = [
    (1, 16, 8, 128, torch.bfloat16),  # Qwen3-0.6B, batch 1
    (9, 16, 8, 128, torch.bfloat16),
    (5, 4, 2, 16, torch.float32),
    (3, 6, 2, 32, torch.bfloat16),  # a group of 3
    (4, 3, 3, 16, torch.float16),  # three kv heads: the unfused store declines them
    (2, 4, 1, 64, torch.bfloat16),  # one kv head
]


def _inputs(tokens: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, with_norm: bool) -> dict:
    gen = torch.Generator().manual_seed(tokens * 1000 + q_heads * 10 + kv_heads)
    qkv = (torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen) * 4).to(DEVICE, dtype)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    positions = torch.randint(0, MAX_POSITIONS, (tokens,), generator=gen)
    positions[-1] = MAX_POSITIONS - 1
    norms = [None, None]
    if with_norm:
        norms = [SimpleNamespace(weight=torch.randn(head_dim, generator=gen).to(DEVICE, dtype), eps=1e-6)
                 for _ in range(2)]
    return {
        "q": q.view(tokens, q_heads, head_dim), "k": k.view(tokens, kv_heads, head_dim),
        "v": v.view(tokens, kv_heads, head_dim), "positions": positions.to(DEVICE), "norms": norms,
        "loc": torch.randperm(SLOTS, generator=gen)[:tokens].to(DEVICE, torch.int32),
        "pools": torch.randn(2, SLOTS, kv_heads, head_dim, generator=gen).to(DEVICE, dtype),
    }


def _run(kernels: LayerKernels, case: dict, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, both pools after the call) of the fused op, or of the composition on the same kernels."""
    head_dim = case["q"].shape[-1]
    rope = RotaryEmbedding(head_dim, MAX_POSITIONS, RopeConfig(theta=1e6), torch.device(DEVICE)).at(case["positions"])
    pools = case["pools"].clone()
    op = type(kernels).norm_rope_store if fused else LayerKernels.norm_rope_store
    out = op(kernels, case["q"], case["k"], case["v"], rope, *case["norms"], pools[0], pools[1], case["loc"])
    return out, pools


@pytest.fixture(scope="module")
def triton_kernels() -> TritonKernels:
    return TritonKernels()


@pytest.mark.parametrize("with_norm", [False, True], ids=["rope", "norm+rope"])
@pytest.mark.parametrize(("tokens", "q_heads", "kv_heads", "head_dim", "dtype"), CASES)
def test_one_launch_is_the_composition(
    triton_kernels: TritonKernels, tokens: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
    with_norm: bool,
) -> None:
    case = _inputs(tokens, q_heads, kv_heads, head_dim, dtype, with_norm)
    pools = case["pools"].view(2, SLOTS, kv_heads, head_dim)
    assert triton_kernels.declines("norm_rope_store", case["q"], case["k"], case["v"], None, None, None, pools[0],
                                   pools[1], case["loc"]) is None
    got, got_pools = _run(triton_kernels, case)
    want, want_pools = _run(triton_kernels, case, fused=False)
    assert torch.equal(got, want), f"q: {(got != want).sum().item()} elements differ from the composition"
    assert torch.equal(got_pools, want_pools), "the pools differ from the composition's"
    ref, ref_pools = _run(TORCH_KERNELS, case)
    written = torch.zeros(SLOTS, dtype=torch.bool, device=DEVICE)
    written[case["loc"].long()] = True
    assert torch.equal(got_pools[:, ~written], case["pools"][:, ~written]), "a slot outside loc changed"
    for name, a, b in (("q", got, ref), ("k slots", got_pools[0], ref_pools[0]), ("v slots", got_pools[1],
                                                                                   ref_pools[1])):
        # A float32 sum of squares in another order, or the interpreter's truncation: the last bit may differ.
        # float32 and float16 (rounded by casts, not on the bits) may also fuse a product into the add: an error of
        # the products' size, which the rotation's cancellation can leave in a small result.
        if (with_norm or INTERPRETED or dtype != torch.bfloat16) and name != "v slots":
            gap = (a.float() - b.float()).abs()
            fused = not with_norm and not INTERPRETED
            ulps = rounding_bound(b, torch.bfloat16, KERNEL_ULPS)  # a bf16 ulp, for every dtype
            bound = rounding_bound(b.abs().amax(), dtype, 2) if fused else ulps
            assert bool((gap <= bound).all()), f"{name}: max gap {gap.max().item()}"
        else:
            assert torch.equal(a, b), f"{name}: {(a != b).sum().item()} elements differ from HF's"


def test_a_strided_pool_declines_to_the_composition(triton_kernels: TritonKernels) -> None:
    case = _inputs(3, 4, 2, 16, torch.float32, True)
    wide = torch.zeros(2, SLOTS, 2, 32, device=DEVICE)
    strided = wide[..., ::2]  # inner stride 2
    strided.copy_(case["pools"])
    why = triton_kernels.declines("norm_rope_store", case["q"], case["k"], case["v"], None, None, None, strided[0],
                                  strided[1], case["loc"])
    assert why is not None and "unit inner strides" in why
    head_dim = case["q"].shape[-1]
    rope = RotaryEmbedding(head_dim, MAX_POSITIONS, RopeConfig(theta=1e6), torch.device(DEVICE)).at(case["positions"])
    got = triton_kernels.norm_rope_store(case["q"], case["k"], case["v"], rope, *case["norms"], strided[0],
                                         strided[1], case["loc"])
    want, want_pools = _run(triton_kernels, case, fused=False)
    assert torch.equal(got, want) and torch.equal(strided, want_pools)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs")
def test_a_captured_launch_replays_new_positions_and_slots(triton_kernels: TritonKernels) -> None:
    """Inside a CUDA graph (as the decode step runs it): a replay with new positions and slots copied into the static
    inputs writes what an eager call on them writes."""
    case = _inputs(1, 16, 8, 128, torch.bfloat16, True)
    head_dim = 128
    rope = RotaryEmbedding(head_dim, MAX_POSITIONS, RopeConfig(theta=1e6), torch.device(DEVICE)).at(case["positions"])
    pools = case["pools"].clone()
    args = (case["q"], case["k"], case["v"], rope, *case["norms"], pools[0], pools[1], case["loc"])
    triton_kernels.norm_rope_store(*args)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_kernels.norm_rope_store(*args)
    case["positions"].fill_(MAX_POSITIONS - 2)
    case["loc"].fill_(SLOTS - 1)
    pools.copy_(case["pools"])
    graph.replay()
    want, want_pools = _run(triton_kernels, case)
    assert torch.equal(out, want) and torch.equal(pools, want_pools)


def test_a_decode_may_take_over_the_store_only_while_it_is_the_triton_kernel() -> None:
    """rope_store_fusable: the Triton kernel set itself, not a subclass that overrides norm_rope_store, nor the set
    with that method patched (a mutant, a user's swap), nor any other kernel set, whose store would be skipped."""

    class Overriding(TritonKernels):
        def norm_rope_store(self, *args: object, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
            return super().norm_rope_store(*args, **kwargs)  # type: ignore[arg-type]

    assert TritonKernels().rope_store_fusable()
    assert not Overriding().rope_store_fusable()
    assert not TORCH_KERNELS.rope_store_fusable()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TritonKernels, "norm_rope_store", LayerKernels.norm_rope_store)
        assert not TritonKernels().rope_store_fusable()
