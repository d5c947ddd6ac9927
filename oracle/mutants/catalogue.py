"""The mutants: bug patterns that inference engines have shipped, each as a reversible monkeypatch.

Every mutant replaces one engine function or method with a small function written here that carries the
bug; the engine's files are never edited. Where it can, a replacement wraps the original and corrupts only its
input or output (a shifted position, a swapped slot, a dropped mask), and the sampler mutants call the engine's
own ``filtered_probs`` with some filters switched off, so each mutant differs from the real engine in exactly the
one way its bug describes, and keeps up with the engine as it evolves. Probabilities are fed back in as logits
via ``probs.log()``: softmax returns the same distribution, and dropped tokens become -inf.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from engine.attention import torch_backend
from engine.attention.torch_backend import TorchAttnBackend
from engine.core import Batch, Phase, Req
from engine.engine import Engine
from engine.kvcache.pool import KVCachePool
from engine.layers.norm import RMSNorm
from engine.sample import BatchSamplingArgs, Sampler

Patch = Callable[[], contextlib.AbstractContextManager[None]]

_ORIGINAL_FILTERED_PROBS = Sampler.filtered_probs
_ORIGINAL_PREPARE = Sampler.prepare
_ORIGINAL_FLASHINFER_DRAW = Sampler.flashinfer_draw
_ORIGINAL_STORE_KV = KVCachePool.store_kv
_ORIGINAL_PREPARE_BATCH = Engine.prepare_batch
_ORIGINAL_PREPARE_METADATA = TorchAttnBackend.prepare_metadata


@contextlib.contextmanager
def _swap(owner: object, attr: str, replacement: object) -> Iterator[None]:
    """Set ``owner.attr = replacement`` for the duration of the block; restore the exact original after."""
    original = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)


def _only(args: BatchSamplingArgs, **changes: Any) -> BatchSamplingArgs:
    return dataclasses.replace(args, **changes)


def _no_temperature(args: BatchSamplingArgs) -> torch.Tensor:
    return torch.ones_like(args.temperature)


# ---- sampler ------------------------------------------------------------------------------------------------


def _descending_top_p(
    self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs, own_mass: bool, off_rows: bool
) -> torch.Tensor:
    """Top-p on a stable descending sort after temperature and top-k (min-p after it): a token is dropped once the
    mass above it (plus its own with own_mass) reaches p. off_rows=False leaves rows with top_p = 1 alone; True gives
    them the cut as well, at p = 1."""
    if args.top_p is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    probs = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, top_p=None, min_p=None))
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    drop_sorted = (cumulative if own_mass else cumulative - sorted_probs) >= args.top_p.unsqueeze(1)
    if not off_rows:
        drop_sorted &= (args.top_p < 1.0).unsqueeze(1)
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    kept = probs.log().masked_fill(drop, float("-inf"))
    return _ORIGINAL_FILTERED_PROBS(self, kept, _only(args, temperature=_no_temperature(args), top_k=None, top_p=None))


def _top_p_inclusive(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Top-p with the token's own mass counted: the token that crosses p is dropped (nucleus one token short)."""
    return _descending_top_p(self, logits, args, own_mass=True, off_rows=False)


def _top_k_after_top_p(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Top-p on the full distribution first, then top-k: the nucleus is cut before top-k renormalizes."""
    nucleus = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, top_k=None, min_p=None))
    return _ORIGINAL_FILTERED_PROBS(self, nucleus.log(), _only(args, temperature=_no_temperature(args), top_p=None))


def _temperature_after_softmax(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Temperature divides probabilities instead of logits; renormalizing undoes it, so T is silently ignored."""
    probs = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, temperature=_no_temperature(args)))
    probs = probs / args.temperature.unsqueeze(1)
    return probs / probs.sum(dim=-1, keepdim=True)


def _min_p_untempered_max(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """The min-p threshold scales the max of the *raw* softmax, not of the tempered, filtered distribution."""
    if args.min_p is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    probs = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, min_p=None))
    threshold = args.min_p.unsqueeze(1) * logits.softmax(dim=-1).max(dim=-1, keepdim=True).values
    drop = probs < threshold
    # The best token survives, as every min-p implementation guarantees; the bug is only the threshold.
    drop.scatter_(1, probs.argmax(dim=-1, keepdim=True), False)
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def _prepare_greedy_lost(self: Sampler, batch: Batch) -> BatchSamplingArgs:
    """The greedy mask is dropped in a mixed batch: greedy rows (temperature 1.0 in the args) are sampled too."""
    args = _ORIGINAL_PREPARE(self, batch)
    return args if args.all_greedy else _only(args, greedy=torch.zeros_like(args.greedy))


def _prepare_seeds_dropped(self: Sampler, batch: Batch) -> BatchSamplingArgs:
    """Per-request seeds are dropped: every row draws its noise from the engine-wide generator."""
    args = _ORIGINAL_PREPARE(self, batch)
    return _only(args, row_seeds=[None] * len(args.row_seeds))


# ---- sampler: ties and filter order ---------------------------------------------------------------------------


def _top_p_lowest_index_ties(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """The old rule: a descending stable sort, so of the ties top-p splits the lowest indices stay (HF: highest)."""
    return _descending_top_p(self, logits, args, own_mass=False, off_rows=False)


def _top_p_off_rows_truncated(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Rows without top-p get the batch's descending cut at p = 1: where the float32 mass above reaches 1.0, their
    tail tokens are dropped (the fp32 cumulative-mass bug, guard removed)."""
    return _descending_top_p(self, logits, args, own_mass=False, off_rows=True)


def _min_p_before_top_p(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Min-p runs before top-p: top-p then sees a distribution renormalized over min-p's survivors and cuts earlier."""
    if args.top_p is None or args.min_p is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    # The survivors' own logits (not their probabilities) go on, so top-p still orders them by score.
    survivors = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, top_p=None))
    kept = logits.masked_fill(survivors == 0, float("-inf"))
    return _ORIGINAL_FILTERED_PROBS(self, kept, _only(args, top_k=None, min_p=None))


def _top_k_exactly_k(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Top-k keeps exactly k tokens (the first k of a sort): tokens tied with the k-th value beyond k are dropped."""
    if args.top_k is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    ranks = (logits / args.temperature.unsqueeze(1)).argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
    return _ORIGINAL_FILTERED_PROBS(
        self, logits.masked_fill(ranks >= args.top_k.unsqueeze(1), float("-inf")), _only(args, top_k=None)
    )


def _prepare_top_k_one_greedy(self: Sampler, batch: Batch) -> BatchSamplingArgs:
    """Rows with top_k = 1 are treated as greedy: the argmax, where HF samples among tied maxima."""
    args = _ORIGINAL_PREPARE(self, batch)
    top_k_one = torch.tensor([r.sampling_params.top_k == 1 for r in batch.reqs], device=args.greedy.device)
    greedy = args.greedy | top_k_one
    return _only(args, greedy=greedy, all_greedy=bool(greedy.all()))


class _JointOrder:
    """FlashInfer's sampling module, with top_k_top_p_sampling_from_probs forced to filter_apply_order="joint"."""

    def __init__(self, fi: Any) -> None:
        self._fi = fi

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fi, name)

    def top_k_top_p_sampling_from_probs(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._fi.top_k_top_p_sampling_from_probs(*args, **{**kwargs, "filter_apply_order": "joint"})


def _flashinfer_draw_joint(self: Sampler, probs: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """FlashInfer draws with top-k and top-p both on the original distribution (joint), not top-k first."""
    fi = self._fi
    self._fi = _JointOrder(fi)
    try:
        return _ORIGINAL_FLASHINFER_DRAW(self, probs, args)
    finally:
        self._fi = fi


# ---- model --------------------------------------------------------------------------------------------------


def _prepare_batch_decode_position(self: Engine, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, Any]:
    """A decode token's RoPE position is device_len (counted after the step's increment) instead of device_len - 1.

    Shifting *every* position by one would be invisible (RoPE only sees differences); this shift is not, because
    the prefill positions stay right.
    """
    batch, args = _ORIGINAL_PREPARE_BATCH(self, reqs, phase)
    if phase == "decode":
        batch.positions = batch.positions + 1
    return batch, args


def _rmsnorm_model_dtype(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm's mean of squares and rsqrt in the model dtype (bf16 loses ~3 significant digits) instead of fp32."""
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _sdpa_extend_sees_next_token(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, **kw: Any
) -> torch.Tensor:
    """On an extend (kv longer than q) the bottom-right causal diagonal is shifted by one: each new token also
    sees the token after it. Fresh prefills (kv == q) and decodes (no causal mask: q_len 1) are untouched."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    cached = kv_len - q_len
    if attn_mask is not None and attn_mask.dim() == 2 and q_len > 1 and cached > 0:
        rows = torch.arange(q_len, device=q.device)[:, None] + cached + 1  # the bug: + 1
        attn_mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)


def _prepare_metadata_short_kv(self: TorchAttnBackend, batch: Batch) -> None:
    """Decode attends over the KV length from *before* this step: the token's own K/V slot is left out."""
    _ORIGINAL_PREPARE_METADATA(self, batch)
    meta = batch.attn_metadata
    if batch.is_decode and isinstance(meta, torch_backend.TorchAttnMetadata):
        meta.kv_slots = [slots[:-1] for slots in meta.kv_slots]


# ---- KV cache -----------------------------------------------------------------------------------------------


def _store_kv_swapped_strides(
    self: KVCachePool, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int
) -> None:
    """With page_size > 1 the slot is decoded offset-major: slot s = page*P + o is written at o*(pages+1) + page.

    The layout [pages, page_size] is confused with [page_size, pages]; page_size 1 is unaffected.
    """
    loc = out_loc.long()
    if self.page_size > 1:
        loc = (loc % self.page_size) * (self.num_pages + 1) + loc // self.page_size
    _ORIGINAL_STORE_KV(self, k, v, loc, layer)


def _dummy_page_zero(self: KVCachePool) -> int:
    """The dummy page is page 0, which the allocator also hands out: padding rows overwrite a live request's KV."""
    return 0


# ---- the patches: one context manager per mutant -------------------------------------------------------------


def top_p_off_by_one() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _top_p_inclusive)


def top_k_after_top_p() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _top_k_after_top_p)


def temperature_after_softmax() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _temperature_after_softmax)


def min_p_wrong_max() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _min_p_untempered_max)


def greedy_rows_sampled() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "prepare", _prepare_greedy_lost)


def seed_ignored() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "prepare", _prepare_seeds_dropped)


def rope_off_by_one() -> contextlib.AbstractContextManager[None]:
    return _swap(Engine, "prepare_batch", _prepare_batch_decode_position)


def rmsnorm_model_dtype() -> contextlib.AbstractContextManager[None]:
    return _swap(RMSNorm, "forward", _rmsnorm_model_dtype)


def causal_mask_off_by_one_extend() -> contextlib.AbstractContextManager[None]:
    # torch_backend reaches SDPA through its module-level name `F`; only that name is rebound, not torch itself.
    shim = types.SimpleNamespace(scaled_dot_product_attention=_sdpa_extend_sees_next_token)
    return _swap(torch_backend, "F", shim)


def decode_kv_len_off_by_one() -> contextlib.AbstractContextManager[None]:
    return _swap(TorchAttnBackend, "prepare_metadata", _prepare_metadata_short_kv)


def kv_wrong_slot_paged() -> contextlib.AbstractContextManager[None]:
    return _swap(KVCachePool, "store_kv", _store_kv_swapped_strides)


def dummy_page_overlap() -> contextlib.AbstractContextManager[None]:
    return _swap(KVCachePool, "dummy_page", property(_dummy_page_zero))


# ---- the patches: sampler ties and filter order --------------------------------------------------------------


def top_p_ties_lowest_index() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _top_p_lowest_index_ties)


def top_p_off_rows_truncated() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _top_p_off_rows_truncated)


def min_p_before_top_p() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _min_p_before_top_p)


def top_k_drops_ties() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "filtered_probs", _top_k_exactly_k)


def top_k_one_is_greedy() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "prepare", _prepare_top_k_one_greedy)


def flashinfer_joint_order() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "flashinfer_draw", _flashinfer_draw_joint)
