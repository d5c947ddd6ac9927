"""Op-level checks of the KV store, alone and fused with the q/k norm + RoPE before it (LayerKernels.store_kv,
norm_rope_store): each drawn call on the target's kernels against HF's op sequence, with pools past 2**31 elements
where memory allows; the store has no reduction, so it keeps HF's bits (contracts: oracle/ops/layers.py)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig

from ..strategies import seeds
from .bench import Bench
from .compare import assert_bitwise, describe
from .guard import assert_untouched, guarded
from .layers import ROPE_SCALES, dev, guarded_head_norm, rope_close, table_positions, want_rope
from .strategies import edge_sizes, gaps, random_tensor

# ---- the KV store ------------------------------------------------------------------------------------------------

TOP_INDEX = 2**31
"""An element offset past int32: a slot times its stride computed in 32 bits wraps here."""


def big_pools_fit(device: torch.device) -> bool:
    """Whether two KV buffers of 2**31 two-byte elements fit comfortably (CPU: physical memory, never touched but
    where written; CUDA: free device memory)."""
    need = 2 * TOP_INDEX * 2 + 2**30
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] > 2 * need
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") > 2 * need


@dataclass(frozen=True)
class StoreCase:
    k: torch.Tensor  # [tokens, kv_heads, head_dim]
    v: torch.Tensor
    loc: torch.Tensor  # int64 [tokens]: distinct slots
    num_slots: int
    big: bool  # the pool passes 2**31 elements (two-byte KV); loc sits at its top
    gap: int


@st.composite
def store_cases(draw: st.DrawFn, dtype: torch.dtype, head_dim: int, big_ok: bool) -> StoreCase:
    tokens = draw(edge_sizes((32, 64), 1, 130))
    heads = draw(st.sampled_from((1, 2, 3, 4, 8)))
    big = big_ok and draw(st.integers(0, 4)) == 0
    if big:
        dtype = dtype if dtype.itemsize == 2 else torch.bfloat16
        num_slots = TOP_INDEX // (heads * head_dim) + tokens + 2
        low = num_slots - tokens - 2
    else:
        num_slots = draw(st.integers(tokens + 1, 4 * tokens + 8))
        low = 0
    slots = draw(st.lists(st.integers(low, num_slots - 1), min_size=tokens, max_size=tokens, unique=True))
    seed = draw(seeds)
    k = random_tensor((tokens, heads, head_dim), dtype, 1.0, seed)
    v = random_tensor((tokens, heads, head_dim), dtype, 1.0, seed + 1)
    return StoreCase(k, v, torch.tensor(slots), num_slots, big, draw(gaps))


@dataclass(frozen=True)
class Pools:
    """The k and v slots of a StoreCase, and the slots watched for stray writes with what they held before."""

    k_slots: torch.Tensor
    v_slots: torch.Tensor
    watch: torch.Tensor
    before: tuple[torch.Tensor, torch.Tensor]


def _pools(bench: Bench, case: StoreCase) -> Pools:
    """The whole pool is watched, or for a pool past 2**31 elements the written slots' neighbours, since reading it
    all would touch every page."""
    tokens, heads, head_dim = case.k.shape
    shape = (case.num_slots, heads, head_dim)
    if case.big:  # never zero-filled: only the pages written and compared are ever touched
        pools = [torch.empty(shape, dtype=case.k.dtype, device=bench.device) for _ in range(2)]
        watch = torch.unique(torch.cat([case.loc + d for d in (-2, -1, 0, 1)]).clamp(0, case.num_slots - 1))
        for pool in pools:
            pool[watch] = -7.0
    else:
        pools = [random_tensor(shape, case.k.dtype, 1.0, tokens + s).to(bench.device) for s in (0, 1)]
        watch = torch.arange(case.num_slots)
    watch = watch.to(bench.device)
    return Pools(pools[0], pools[1], watch, (pools[0][watch].clone(), pools[1][watch].clone()))


def assert_stored(op: str, call: str, pools: Pools, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   k_close: Callable[[str, torch.Tensor, torch.Tensor], None]) -> None:
    """k_slots[loc] is k under k_close, v_slots[loc] is v bitwise, and no other watched slot changed."""
    written = torch.isin(pools.watch, loc)
    k_close("k_slots[loc]", pools.k_slots[loc], k.to(pools.k_slots.device))
    assert_bitwise(op, call, "v_slots[loc]", pools.v_slots[loc].cpu(), v)
    for name, pool, was in (("k_slots", pools.k_slots, pools.before[0]), ("v_slots", pools.v_slots, pools.before[1])):
        assert_bitwise(op, call, f"{name} outside loc (the guard)", pool[pools.watch][~written], was[~written])


def check_store_kv(bench: Bench, case: StoreCase) -> None:
    """slots[loc] = k, v, bitwise, and no other slot of the pool changes."""
    pools = _pools(bench, case)
    k, v = guarded("k", dev(bench, case.k), case.gap), guarded("v", dev(bench, case.v), case.gap)
    loc = guarded("loc", dev(bench, case.loc))
    call = describe({"k_slots": pools.k_slots, "k": k.view, "v": v.view, "loc": loc.view},
                    top_slot=int(case.loc.max()))
    bench.run_kernel("store_kv", "store_kv", pools.k_slots, pools.v_slots, k.view, v.view, loc.view)
    assert_stored("store_kv", call, pools, loc.view, case.k, case.v,
                   lambda name, got, want: assert_bitwise("store_kv", call, name, got, want))
    assert_untouched("store_kv", [k, v, loc])


# ---- q/k norm + RoPE fused with the KV store -----------------------------------------------------------------


@dataclass(frozen=True)
class RopeStoreCase:
    q: torch.Tensor  # [tokens, kv_heads * group, head_dim]
    store: StoreCase  # k, v, the slots
    positions: torch.Tensor  # int64 [tokens]
    theta: float
    max_positions: int
    q_norm: torch.Tensor | None  # both norms or neither, as a model has them
    k_norm: torch.Tensor | None


@st.composite
def rope_store_cases(draw: st.DrawFn, dtype: torch.dtype, head_dim: int, big_ok: bool) -> RopeStoreCase:
    store = draw(store_cases(dtype, head_dim, big_ok))
    tokens, kv_heads, _ = store.k.shape
    group = draw(st.sampled_from((1, 2, 3, 4)))  # query heads per kv head (Qwen3-0.6B: 16 over 8)
    positions, max_positions = table_positions(draw, tokens)
    seed = draw(seeds)
    scale = draw(st.sampled_from(ROPE_SCALES))
    dtype = store.k.dtype  # a pool past 2**31 elements holds two-byte KV
    q = random_tensor((tokens, kv_heads * group, head_dim), dtype, scale, seed)
    store = dataclasses.replace(store, k=(store.k.double() * scale).to(dtype))
    normed = draw(st.booleans())
    q_norm, k_norm = (random_tensor((head_dim,), dtype, 1.0, seed + s) if normed else None for s in (1, 2))
    return RopeStoreCase(q, store, positions, draw(st.sampled_from((1e4, 1e6))), max_positions, q_norm, k_norm)


def check_norm_rope_store(bench: Bench, case: RopeStoreCase) -> None:
    """The returned q is norm_rope's, k_slots[loc] holds norm_rope's k and v_slots[loc] the v, under norm_rope's
    contract (bitwise without a norm), and no other slot changes."""
    store = case.store
    pools = _pools(bench, store)
    q = guarded("q", dev(bench, case.q), store.gap)
    k, v = guarded("k", dev(bench, store.k), store.gap), guarded("v", dev(bench, store.v), store.gap)
    loc, positions = guarded("loc", dev(bench, store.loc)), guarded("positions", dev(bench, case.positions))
    guards = [q, k, v, loc, positions]
    q_norm = guarded_head_norm(bench, "q_norm weight", case.q_norm, guards)
    k_norm = guarded_head_norm(bench, "k_norm weight", case.k_norm, guards)
    table = RotaryEmbedding(case.q.shape[-1], case.max_positions, RopeConfig(theta=case.theta), bench.device)
    call = describe({"q": q.view, "k": k.view, "k_slots": pools.k_slots, "loc": loc.view, "positions": positions.view},
                    theta=case.theta, qk_norm=q_norm is not None, top_slot=int(store.loc.max()))
    got = bench.run_kernel("norm_rope_store", "norm_rope_store", q.view, k.view, v.view, table.at(positions.view),
                           q_norm, k_norm, pools.k_slots, pools.v_slots, loc.view)
    assert isinstance(got, torch.Tensor)
    op, normed = "norm_rope_store", q_norm is not None

    def close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        rope_close(bench, op, call, name, got, want, normed)

    close("q out", got, want_rope(bench, case.q, positions.view, q_norm, case.theta, case.max_positions))
    want_k = want_rope(bench, store.k, positions.view, k_norm, case.theta, case.max_positions)
    assert_stored(op, call, pools, loc.view, want_k, store.v, close)
    assert_untouched(op, guards)
