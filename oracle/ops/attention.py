"""Op-level checks of an attention backend: one forward of one layer over a drawn page table (prefill, extend and
decode), against softmax(q k^T / sqrt(d)) v in float64 with a bottom-right causal mask.

Lengths straddle the tile edges up to 1024 tokens and the page edges; q is scaled so the largest score of the batch
reaches a drawn value up to past float32's exp overflow; every KV slot the batch does not own holds poison (a
large finite value, so a kernel that reads a slot it should not gets a visibly wrong output, while a whole-page
read that masks correctly stays exact). The new tokens' K/V are in their slots before the call, as the layer's
norm_rope_store leaves them (that op's own check covers the store); the call may change no slot of the pool. A
backend that norms, rotates and stores the new tokens itself (forward_new_tokens) is checked on decode cases whose
new tokens are not stored yet, against HF's norm and RoPE before the same float64 attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from engine import ATTENTION_BACKENDS, Batch, Context, Req, SamplingParams
from engine.attention import BaseAttnBackend, TorchAttnBackend
from engine.distributed.comm import NullComm
from engine.kvcache.pool import KVCachePool
from engine.layers.rotary import RotaryEmbedding
from engine.models.config import RopeConfig

from ..strategies import seeds
from ..tolerance import attention_bound
from .bench import Bench
from .compare import assert_bitwise, assert_within, describe
from .guard import assert_untouched, guarded
from .kv_store import Pools, assert_stored
from .layers import guarded_head_norm, rope_close, want_rope
from .ledger import expected_impl
from .strategies import gaps, random_tensor, score_maxima, seq_lengths

MAX_LEN = 1024
MAX_TOKENS = 1400  # KV positions of one example, all requests together: keeps an example under a second on CPU
POISON = 512.0
GROUPS = (1, 2, 3, 4)  # query heads per kv head (3: not a power of two)


@dataclass(frozen=True)
class AttnCase:
    phase: str  # "prefill" (cached_len 0), "extend" (cached_len > 0, several new tokens) or "decode"
    cached: tuple[int, ...]
    lengths: tuple[int, ...]  # device_len of each request
    page_size: int
    kv_heads: int
    group: int
    score_max: float
    seed: int
    gap: int

    @property
    def new(self) -> tuple[int, ...]:
        return tuple(d - c for c, d in zip(self.cached, self.lengths))


@st.composite
def attn_cases(
    draw: st.DrawFn, page_sizes: tuple[int, ...], phase: str | None = None,
    requests: st.SearchStrategy[int] | None = None,
) -> AttnCase:
    phase = phase or draw(st.sampled_from(("prefill", "extend", "decode")))
    ps = draw(st.sampled_from(page_sizes))
    n = draw(requests or st.integers(1, 4))
    lengths, cached = [], []
    budget = MAX_TOKENS
    for _ in range(n):
        if budget < 2:
            break
        length = draw(seq_lengths(min(MAX_LEN, budget), ps, low=2 if phase != "prefill" else 1))
        budget -= length
        lengths.append(length)
        if phase == "extend":
            cached.append(draw(st.integers(1, length - 1)))
        else:
            cached.append(0 if phase == "prefill" else length - 1)
    return AttnCase(
        phase, tuple(cached), tuple(lengths), ps,
        draw(st.sampled_from((1, 2))), draw(st.sampled_from(GROUPS)), draw(score_maxima()),
        draw(seeds), draw(gaps),
    )


def _tensors(case: AttnCase, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q [tokens, Hq, d] for the new tokens and k, v [kv positions, Hkv, d] for every request's whole sequence,
    q scaled so the largest score of the example is case.score_max."""
    total, new = sum(case.lengths), sum(case.new)
    hq = case.kv_heads * case.group
    q = random_tensor((new, hq, head_dim), torch.float64, 1.0, case.seed)
    k = random_tensor((total, case.kv_heads, head_dim), dtype, 1.0, case.seed + 1)
    v = random_tensor((total, case.kv_heads, head_dim), dtype, 1.0, case.seed + 2)
    scale = head_dim**-0.5
    top = max(float((_queries(case, q, i) @ _keys(case, k, i).transpose(1, 2)).abs().max()) * scale
              for i in range(len(case.lengths)))
    return (q * (case.score_max / top)).to(dtype), k, v


def _queries(case: AttnCase, q: torch.Tensor, i: int) -> torch.Tensor:
    start = sum(case.new[:i])
    return q[start : start + case.new[i]].transpose(0, 1).double()  # [Hq, new, d]


def _keys(case: AttnCase, kv: torch.Tensor, i: int) -> torch.Tensor:
    start = sum(case.lengths[:i])
    return kv[start : start + case.lengths[i]].transpose(0, 1).double().repeat_interleave(case.group, 0)


def reference(case: AttnCase, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [tokens, Hq, d] in float64, its bound), request by request: query j of request i sits at position
    cached_i + j and sees keys 0..cached_i + j."""
    outs, bounds = [], []
    for i, (cached, length) in enumerate(zip(case.cached, case.lengths)):
        qi, ki, vi = _queries(case, q, i), _keys(case, k, i), _keys(case, v, i)
        scores = qi @ ki.transpose(1, 2) * q.shape[-1] ** -0.5
        visible = torch.arange(length)[None, :] <= torch.arange(cached, length)[:, None]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        outs.append((probs @ vi).transpose(0, 1))
        # per query and head: the largest |v| it attends to, and the magnitude of its scores' float32 sums
        top_v = torch.where(visible[None, :, :, None], vi.abs()[:, None], 0).amax(dim=(2, 3))  # [Hq, new]
        magnitude = (qi.abs() @ ki.abs().transpose(1, 2) * q.shape[-1] ** -0.5).masked_fill(~visible, 0).amax(-1)
        head_dim = q.shape[-1]
        bounds.append(torch.stack([
            attention_bound(top_v[:, j], magnitude[:, j], cached + j + 1, head_dim, q.dtype)
            for j in range(length - cached)
        ]).unsqueeze(-1).expand(-1, -1, head_dim))
    return torch.cat(outs), torch.cat(bounds)


@dataclass
class _Setup:
    """One layer's pool, page table and batch for a case, and the backend and context to call."""

    pool: KVCachePool
    batch: Batch
    backend: BaseAttnBackend
    ctx: Context


def _setup(bench: Bench, case: AttnCase, k: torch.Tensor, v: torch.Tensor, store_new: bool = True) -> _Setup:
    """Every slot poisoned, then each request's tokens stored through its table row (its new ones only if
    store_new); the backend of the target's attention, its batch without metadata."""
    dev, dtype, head_dim = bench.device, bench.dtype, bench.target.head_dim
    ps = case.page_size
    width = -(-MAX_LEN // ps) * ps
    pages_per_row = width // ps
    rows = len(case.lengths)
    num_pages = rows * pages_per_row + 1
    pool = KVCachePool(1, num_pages, ps, case.kv_heads, head_dim, dtype, dev)
    sign = torch.randint(0, 2, pool.buffer.shape, generator=torch.Generator().manual_seed(case.seed)) * 2 - 1
    pool.buffer.copy_(sign * POISON)
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(case.seed + 3))
    table = torch.zeros(rows + 1, width, dtype=torch.int32)
    for r in range(rows):
        pages = order[r * pages_per_row : (r + 1) * pages_per_row]
        table[r] = (pages[:, None] * ps + torch.arange(ps)).flatten()
    k_slots, v_slots = pool.k_slots(0), pool.v_slots(0)
    positions: list[int] = []
    out_loc: list[int] = []
    for i, (cached, length) in enumerate(zip(case.cached, case.lengths)):
        start, stored = sum(case.lengths[:i]), length if store_new else cached
        slots = table[i, :stored].long().to(dev)
        k_slots[slots] = k[start : start + stored].to(dev)  # the cached prefix, and the new tokens if store_new
        v_slots[slots] = v[start : start + stored].to(dev)
        positions += range(cached, length)
        out_loc += table[i, cached:length].tolist()
    page_table = table.to(dev)
    backend: BaseAttnBackend = ATTENTION_BACKENDS.factory(str(bench.target.resolved("attention")))(
        pool, page_table, case.kv_heads * case.group, dev
    )
    reqs = [Req([0] * length, i, cached, 1, i, SamplingParams()) for i, (cached, length) in
            enumerate(zip(case.cached, case.lengths))]
    batch = Batch(reqs, "decode" if case.phase == "decode" else "prefill")
    batch.positions = torch.tensor(positions, device=dev)
    batch.out_loc = torch.tensor(out_loc, dtype=torch.int32, device=dev)
    batch.table_rows = torch.arange(rows, device=dev)
    batch.rows = batch.table_rows
    ctx = Context(ps, page_table, pool, backend, bench.kernels, NullComm())
    return _Setup(pool, batch, backend, ctx)


def check_attention(bench: Bench, case: AttnCase) -> None:
    q, k, v = _tensors(case, bench.target.head_dim, bench.dtype)
    got_setup = _setup(bench, case, k, v)
    pool, batch, backend, ctx = got_setup.pool, got_setup.batch, got_setup.backend, got_setup.ctx
    gq = guarded("q", q.to(bench.device), case.gap)
    before = pool.buffer.clone()
    call = describe({"q": gq.view, "k_slots": pool.k_slots(0)}, phase=case.phase, cached=case.cached,
                    lengths=case.lengths, page_size=case.page_size, score_max=case.score_max)
    impl = expected_impl(backend, "forward", "attention", str(bench.target.resolved("attention")),
                         (TorchAttnBackend, BaseAttnBackend))

    def run() -> torch.Tensor:
        backend.prepare_metadata(batch)
        with ctx.forward_batch(batch):
            return backend.forward(gq.view, 0, ctx)

    got = bench.traced(f"attention {case.phase}", impl, backend.delegate(batch), run)
    exact, bound = reference(case, q, k, v)
    assert_within(f"attention {case.phase}", call, "out", got, exact, bound, "rounding at the dtype, float32 sums")
    assert_bitwise(f"attention {case.phase}", call, "the KV pool (the guard)", pool.buffer, before)
    assert_untouched(f"attention {case.phase}", [gq])


NEW_TOKENS_OP = "attention with its new tokens"
LONE_OR_FEW = st.one_of(st.just(1), st.integers(1, 4))  # a lone request half the time: hybrids decode those apart
ROPE_THETA = 1e6
ROPE_ROWS = 2 * MAX_LEN  # the cos/sin tables' rows: past every position a case draws


def check_attention_new_tokens(bench: Bench, case: AttnCase, normed: bool) -> bool:
    """BaseAttnBackend.forward_new_tokens on a decode case whose new tokens are not stored yet, with q and k before
    their q/k norm (if `normed`) and RoPE. Where the backend takes them (False where it returns None: the layer's
    kernels do, checked as norm_rope_store): attention against float64 over the pool with the new k normed and
    rotated as HF does, that k stored at out_loc under norm_rope's contract (bitwise without a norm) and v bitwise,
    and no other slot changed."""
    dev, dtype, head_dim = bench.device, bench.dtype, bench.target.head_dim
    _, k, v = _tensors(case, head_dim, dtype)
    new = sum(case.new)
    q_raw = random_tensor((new, case.kv_heads * case.group, head_dim), dtype, 1.0, case.seed + 4)
    k_raw = random_tensor((new, case.kv_heads, head_dim), dtype, 1.0, case.seed + 5)
    last = torch.tensor([sum(case.lengths[: i + 1]) - 1 for i in range(len(case.lengths))])  # decode: one new each
    got_setup = _setup(bench, case, k, v, store_new=False)
    pool, batch, backend, ctx = got_setup.pool, got_setup.batch, got_setup.backend, got_setup.ctx
    guards = [guarded("q", q_raw.to(dev), case.gap), guarded("k", k_raw.to(dev), case.gap),
              guarded("v", v[last].to(dev), case.gap)]
    norms = [guarded_head_norm(bench, f"{x}_norm weight", random_tensor((head_dim,), dtype, 1.0, case.seed + s)
                               if normed else None, guards) for x, s in (("q", 6), ("k", 7))]
    rope = RotaryEmbedding(head_dim, ROPE_ROWS, RopeConfig(theta=ROPE_THETA), dev).at(batch.positions)
    k_slots, v_slots = pool.k_slots(0), pool.v_slots(0)
    pools = Pools(k_slots, v_slots, torch.arange(k_slots.shape[0], device=dev), (k_slots.clone(), v_slots.clone()))
    backend.prepare_metadata(batch)
    with ctx.forward_batch(batch):
        got = backend.forward_new_tokens(guards[0].view, guards[1].view, guards[2].view, rope, norms[0], norms[1], 0,
                                         ctx)
    if got is None:
        return False
    call = describe({"q": guards[0].view, "k_slots": k_slots}, phase=case.phase, lengths=case.lengths,
                    page_size=case.page_size, qk_norm=normed)
    want_q = want_rope(bench, q_raw, batch.positions, norms[0], ROPE_THETA, ROPE_ROWS)
    want_k = want_rope(bench, k_raw, batch.positions, norms[1], ROPE_THETA, ROPE_ROWS)
    k_full = k.clone()
    k_full[last] = want_k.cpu()
    exact, bound = reference(case, want_q.cpu(), k_full, v)
    assert_within(NEW_TOKENS_OP, call, "out", got, exact, bound, "rounding at the dtype, float32 sums")

    def k_close(name: str, got_k: torch.Tensor, want: torch.Tensor) -> None:
        # the kernel repeats the layer kernels' arithmetic (rope_store_fusable): norm_rope_store's contract
        rope_close(bench, NEW_TOKENS_OP, call, name, got_k, want, normed, "norm_rope_store")

    assert_stored(NEW_TOKENS_OP, call, pools, batch.out_loc.long(), want_k, v[last], k_close)
    assert_untouched(NEW_TOKENS_OP, guards)
    return True


def fuses_new_tokens(bench: Bench) -> bool:
    """Whether the target's backend takes a lone decode request's new tokens itself (check_attention_new_tokens on
    one fixed case, which it must pass)."""
    case = AttnCase("decode", (69,), (70,), bench.target.page_sizes[0], 1, 2, 10.0, 0, 0)
    return check_attention_new_tokens(bench, case, normed=True)
