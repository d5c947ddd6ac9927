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
import importlib
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import engine.engine as engine_module
import engine.models.config as model_config_module
from engine import sample
from engine.attention import flashinfer_backend, torch_backend
from engine.attention.torch_backend import TorchAttnBackend
from engine.attention.triton_backend import TritonDecodeBackend, TritonDecodeMetadata
from engine.core import Batch, Context, Phase, Req, SamplingParams
from engine.driver import Generation, Pages, RequestState, StaticDriver
from engine.driver.loop import Launch, Loop
from engine.driver.requests import Requests, generate_pairs
from engine.engine import Engine
from engine.graph import GraphRunner, Mode, StepOutputs
from engine.kvcache.pool import KVCachePool
from engine.layers.kernels import LayerKernels
from engine.layers.norm import RMSNorm
from engine.sample import BaseSampler, BatchSamplingArgs, Sampler
from engine.step import ForwardOutput
from engine.step.inputs import BatchInputs
from engine.step.layout import InputLayout

Patch = Callable[[], contextlib.AbstractContextManager[None]]

_ORIGINAL_FILTERED_PROBS = Sampler.filtered_probs
_ORIGINAL_PREPARE = BaseSampler.prepare
_ORIGINAL_FLASHINFER_DRAW = Sampler.flashinfer_draw
_ORIGINAL_STORE_KV = KVCachePool.store_kv
_ORIGINAL_PREPARE_BATCH = Engine.prepare_batch
_ORIGINAL_PREPARE_METADATA = TorchAttnBackend.prepare_metadata
_ORIGINAL_FINISH = Requests.finish
_ORIGINAL_STEP_SEED = sample.step_seed
_ORIGINAL_FORWARD_BATCH = Engine.forward_batch
_ORIGINAL_REPLAY = GraphRunner.replay
_ORIGINAL_PAGED_KV_INDEX = flashinfer_backend.build_paged_kv_index
_ORIGINAL_LAND = Loop.land
_ORIGINAL_PACK_INPUTS = engine_module.pack_inputs
_ORIGINAL_UNPACK_INPUTS = engine_module.unpack_inputs
_ORIGINAL_LOAD_INPUTS = GraphRunner.load_inputs
_ORIGINAL_TRITON_GRAPH_METADATA = TritonDecodeBackend.graph_metadata
_ORIGINAL_DRIVER_INIT = StaticDriver.__init__
_ORIGINAL_GENERATION_EOS = model_config_module.generation_eos


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


def _prepare_greedy_lost(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
    """The greedy mask is dropped in a mixed batch: greedy rows (temperature 1.0 in the args) are sampled too."""
    args = _ORIGINAL_PREPARE(self, batch)
    return args if args.all_greedy else _only(args, greedy=torch.zeros_like(args.greedy))


def _prepare_seeds_dropped(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
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


def _prepare_top_k_one_greedy(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
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


def _unpack_inputs_decode_position(packed: torch.Tensor, layout: InputLayout, *rest: Any) -> BatchInputs:
    """A decode token's RoPE position is device_len (counted after the step's increment) instead of device_len - 1;
    its KV slot stays right. Inputs are unpacked inside a captured step too, so graph replays carry the bug.

    Shifting *every* position by one would be invisible (RoPE only sees differences); this shift is not, because
    the prefill positions stay right.
    """
    inputs = _ORIGINAL_UNPACK_INPUTS(packed, layout, *rest)
    if layout.decode:
        inputs.positions = inputs.positions + 1
    return inputs


def _rmsnorm_model_dtype(self: RMSNorm, x: torch.Tensor, ctx: Context) -> torch.Tensor:
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
    self: KVCachePool, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int, kernels: LayerKernels
) -> None:
    """With page_size > 1 the slot is decoded offset-major: slot s = page*P + o is written at o*(pages+1) + page.

    The layout [pages, page_size] is confused with [page_size, pages]; page_size 1 is unaffected.
    """
    loc = out_loc.long()
    if self.page_size > 1:
        loc = (loc % self.page_size) * (self.num_pages + 1) + loc // self.page_size
    _ORIGINAL_STORE_KV(self, k, v, loc, layer, kernels)


def _dummy_page_zero(self: KVCachePool) -> int:
    """The dummy page is page 0, which the allocator also hands out: padding rows overwrite a live request's KV."""
    return 0


# ---- laws (issue #11 classes 2, 4, 5, 7): seeds along positions, page accounting, KV isolation, logits ---------


def _step_seed_without_position(seed: int, position: int) -> int:
    """The step seed ignores the position: a seeded request draws the same noise at every step."""
    return _ORIGINAL_STEP_SEED(seed, 0)


def _finish_keeps_abort_reservation(self: Requests, seq: RequestState, reason: str) -> None:
    """An aborted request gives back its mapped pages, but the unmapped rest of its reservation stays reserved."""
    if reason == "abort":
        seq.reserved_pages = len(seq.pages)  # the bug: the unused reservation is forgotten, never released
    _ORIGINAL_FINISH(self, seq, reason)


def _finish_drops_last_page_on_eos(self: Requests, seq: RequestState, reason: str) -> None:
    """A request that stops on EOS never returns its last mapped page to the free list (its reservation is right)."""
    if reason == "eos" and seq.pages:
        seq.pages = seq.pages[:-1]
        seq.reserved_pages -= 1  # the page counts as released from the reservation, but is in no list
    _ORIGINAL_FINISH(self, seq, reason)


def _store_kv_spills_single_token(
    self: KVCachePool, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer: int, kernels: LayerKernels
) -> None:
    """A one-token batch (a lone decode, a 1-token prefill chunk) also writes its K/V one page further on, a slot
    of whichever request owns that page; its own slot is right, so its own outputs are too."""
    _ORIGINAL_STORE_KV(self, k, v, out_loc, layer, kernels)
    if out_loc.numel() == 1:
        spill = (out_loc.long() + self.page_size) % (self.num_pages * self.page_size)  # stays in the real pages
        _ORIGINAL_STORE_KV(self, k, v, spill, layer, kernels)


_SHARED_LOGITS: weakref.WeakKeyDictionary[Engine, torch.Tensor] = weakref.WeakKeyDictionary()


@torch.inference_mode()
def _forward_batch_into_shared_logits(self: Engine, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
    """The logits come back as a view of one buffer per engine, which every later step overwrites."""
    out = _ORIGINAL_FORWARD_BATCH(self, batch, args)
    rows = self.config.max_running_req
    if self not in _SHARED_LOGITS:
        _SHARED_LOGITS[self] = out.logits.new_empty(rows, out.logits.shape[1])
    shared = _SHARED_LOGITS[self][: out.logits.shape[0]]
    shared.copy_(out.logits)
    return dataclasses.replace(out, logits=shared)


def _replay_hands_out_static_output(self: GraphRunner, batch: Batch, mode: Mode) -> StepOutputs:
    """A replay returns the graph's static logits and tokens themselves, not copies: the next replay overwrites
    them."""
    _ORIGINAL_REPLAY(self, batch, mode)
    return self.outputs[mode][batch.padded_size]


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
    return _swap(BaseSampler, "prepare", _prepare_greedy_lost)


def seed_ignored() -> contextlib.AbstractContextManager[None]:
    return _swap(BaseSampler, "prepare", _prepare_seeds_dropped)


def rope_off_by_one() -> contextlib.AbstractContextManager[None]:
    # The engine reaches unpack_inputs through engine.engine's module-level name, eagerly and in graph capture.
    return _swap(engine_module, "unpack_inputs", _unpack_inputs_decode_position)


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


# ---- batch composition, chunked prefill and batched decode (issue #11) ------------------------------------------

_ORIGINAL_DECODE = TorchAttnBackend._decode


def _prepare_batch_extend_positions_from_zero(self: Engine, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, Any]:
    """A prefill chunk's RoPE positions restart at 0 instead of continuing at cached_len; its KV slots stay right."""
    batch, args = _ORIGINAL_PREPARE_BATCH(self, reqs, phase)
    if phase == "prefill":
        cached = torch.tensor([r.cached_len for r in reqs])
        lengths = torch.tensor([r.extend_len for r in reqs])
        batch.positions = batch.positions - torch.repeat_interleave(cached, lengths).to(batch.positions.device)
    return batch, args


def _prepare_batch_sorted_by_length(self: Engine, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, Any]:
    """A prefill batch is sorted longest first, and its rows come back in that order, not in the caller's."""
    ordered = sorted(reqs, key=lambda r: -r.extend_len) if phase == "prefill" else reqs
    return _ORIGINAL_PREPARE_BATCH(self, ordered, phase)


def _decode_keys_unmasked(
    q: torch.Tensor, meta: torch_backend.TorchAttnMetadata, k_slots: torch.Tensor, v_slots: torch.Tensor, gqa: bool
) -> torch.Tensor:
    """Batched decode pads every request's keys to the longest one (with slot 0) but builds no key mask, so the
    shorter requests also attend to the padding."""
    if meta.decode_slots is None:
        meta.decode_slots = torch.nn.utils.rnn.pad_sequence(meta.kv_slots, batch_first=True)
    return _ORIGINAL_DECODE(q, meta, k_slots, v_slots, gqa)


def _unpack_inputs_pad_slot_zero(packed: torch.Tensor, layout: InputLayout, *rest: Any) -> BatchInputs:
    """The dummy rows that pad a decode batch write their K/V to slot 0 (a convention of engines that reserve slot 0
    for padding) instead of the dummy page; here slot 0 is a real request's."""
    inputs = _ORIGINAL_UNPACK_INPUTS(packed, layout, *rest)
    if layout.padded:
        padding = packed[layout.span("device_len")] == 0
        inputs.out_loc = torch.where(padding, 0, inputs.out_loc)
    return inputs


def _prepare_metadata_gather_past_end(self: TorchAttnBackend, batch: Batch) -> None:
    """The last-token index of each request is its query end (cu_seqlens[1:]) instead of end - 1, clamped to the
    batch: every request but the last reads the next request's first token; a lone request is unaffected."""
    _ORIGINAL_PREPARE_METADATA(self, batch)
    meta = batch.attn_metadata
    if isinstance(meta, torch_backend.TorchAttnMetadata):
        meta.last_indices = (meta.last_indices + 1).clamp(max=meta.q_ranges[-1][1] - 1)


def extend_positions_restart() -> contextlib.AbstractContextManager[None]:
    return _swap(Engine, "prepare_batch", _prepare_batch_extend_positions_from_zero)


def batch_rows_sorted_by_length() -> contextlib.AbstractContextManager[None]:
    return _swap(Engine, "prepare_batch", _prepare_batch_sorted_by_length)


def decode_keys_unmasked() -> contextlib.AbstractContextManager[None]:
    return _swap(TorchAttnBackend, "_decode", staticmethod(_decode_keys_unmasked))


def pad_slot_zero() -> contextlib.AbstractContextManager[None]:
    return _swap(engine_module, "unpack_inputs", _unpack_inputs_pad_slot_zero)


def last_token_gather_off_by_one() -> contextlib.AbstractContextManager[None]:
    return _swap(TorchAttnBackend, "prepare_metadata", _prepare_metadata_gather_past_end)


def _map_pages_committing_first(self: Pages, seqs: list[RequestState], upto: list[int]) -> list[RequestState]:
    grants = self.grants(seqs, upto)
    writes = []
    for seq in grants:  # bug: each page is taken and appended before the page table is written
        page = self.allocator.take()
        writes.append((seq.req.table_idx, len(seq.pages) * self.page_size, page))
        seq.pages.append(page)
    if writes:
        self.write(writes)
    return grants


def pages_mapped_before_table_write() -> contextlib.AbstractContextManager[None]:
    return _swap(Pages, "map", _map_pages_committing_first)


def pages_leak_on_abort() -> contextlib.AbstractContextManager[None]:
    return _swap(Requests, "finish", _finish_keeps_abort_reservation)


def pages_leak_on_eos() -> contextlib.AbstractContextManager[None]:
    return _swap(Requests, "finish", _finish_drops_last_page_on_eos)


def kv_write_spills_single_token() -> contextlib.AbstractContextManager[None]:
    return _swap(KVCachePool, "store_kv", _store_kv_spills_single_token)


def seed_position_lost() -> contextlib.AbstractContextManager[None]:
    # BaseSampler.prepare reaches step_seed through engine.sample's module-level name; only that name is rebound.
    return _swap(sample, "step_seed", _step_seed_without_position)


def logits_alias_buffer() -> contextlib.AbstractContextManager[None]:
    return _swap(Engine, "forward_batch", _forward_batch_into_shared_logits)


def graph_logits_alias() -> contextlib.AbstractContextManager[None]:
    return _swap(GraphRunner, "replay", _replay_hands_out_static_output)


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
    return _swap(BaseSampler, "prepare", _prepare_top_k_one_greedy)


def flashinfer_joint_order() -> contextlib.AbstractContextManager[None]:
    return _swap(Sampler, "flashinfer_draw", _flashinfer_draw_joint)


# ---- GPU path: FlashInfer's paged-KV index and graph replay inputs ----------------------------------------------


def _paged_kv_index_modulo_last_page(reqs: Sequence[Req], page_size: int) -> flashinfer_backend.PagedKVIndex:
    """kv_last_page_len = kv_len % page_size: a request whose KV fills its last page exactly (always, at page_size 1)
    attends to one page fewer than it holds."""
    index = _ORIGINAL_PAGED_KV_INDEX(reqs, page_size)
    kv_lens = torch.tensor([r.device_len for r in reqs], dtype=torch.int32)
    return dataclasses.replace(index, kv_last_page_len=kv_lens % page_size)


def flashinfer_last_page_len_modulo() -> contextlib.AbstractContextManager[None]:
    # The backend looks the function up by its module-level name, so rebinding that name is enough.
    return _swap(flashinfer_backend, "build_paged_kv_index", _paged_kv_index_modulo_last_page)


def _load_inputs_keeping_positions(self: GraphRunner, batch: Batch) -> None:
    """A replay copies the step's packed inputs except its positions block: every replay runs on the positions
    the static buffer held before (the capture's, 0)."""
    positions = self.layouts[batch.padded_size].span("positions")
    assert self.inputs is not None
    kept = self.inputs[positions].clone()
    _ORIGINAL_LOAD_INPUTS(self, batch)
    self.inputs[positions].copy_(kept)


def graph_positions_stale() -> contextlib.AbstractContextManager[None]:
    return _swap(GraphRunner, "load_inputs", _load_inputs_keeping_positions)


def _triton_lengths_of_capture(self: TritonDecodeBackend, batch: Batch) -> None:
    """The Triton decode lengths are fixed when the graph is captured (its dummy requests' one token) instead of
    computed from each replay's positions."""
    _ORIGINAL_TRITON_GRAPH_METADATA(self, batch)
    meta = batch.attn_metadata
    if isinstance(meta, TritonDecodeMetadata):
        meta.seq_lens = torch.ones_like(batch.positions)


def triton_decode_lengths_frozen() -> contextlib.AbstractContextManager[None]:
    return _swap(TritonDecodeBackend, "graph_metadata", _triton_lengths_of_capture)


@contextlib.contextmanager
def gemv_gate_unactivated() -> Iterator[None]:
    """The small-batch GEMV's gated form (down_proj of a decode step of up to 8 rows) multiplies by up alone,
    without SiLU(gate); the cuBLAS path of larger batches is right."""
    kernels = importlib.import_module("engine.layers.triton_kernels")  # imports triton: CUDA machines only
    original = kernels.gemv

    def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gated: bool) -> torch.Tensor:
        if gated:
            return original(x[..., x.shape[-1] // 2 :], weight, bias, False)
        return original(x, weight, bias, gated)

    with _swap(kernels, "gemv", gemv):
        yield



# ---- bad input: the live-row guard, atomic generate, one driver per engine (issue #12) ------------------------


def _pack_inputs_without_live_rows(
    reqs: Sequence[Req], limits: Any, live_rows: Any, decode: bool, pad_to: int | None = None
) -> tuple[torch.Tensor, InputLayout]:
    """The slot checks leave out the live rows outside the batch (its `others` are empty): a new token may overwrite
    the cached KV of a running request that is not in this batch; the checks within the batch are unchanged."""
    return _ORIGINAL_PACK_INPUTS(reqs, limits, {}, decode, pad_to)


def _generate_admitting_eagerly(
    self: StaticDriver, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[Generation]:
    """generate() admits each prompt as soon as it is checked (while a row and its pages are free), so a bad prompt
    later in the list leaves the earlier ones admitted and running when the error propagates. Otherwise it is the
    real generate: the same checks, the same admission order, the same results, the same cleanup on a failed step."""
    with self._exclusive("generate"):
        pending: deque[Any] = deque()
        uids: list[int] = []
        first_uid = self.requests.next_uid
        for i, (prompt, sp) in enumerate(generate_pairs(prompts, params)):
            pending.append(self.requests.check(prompt, sp, (), f"prompt {i}: "))
            self.requests.admit_what_fits(pending, uids)  # the bug: before the later prompts are checked
        return self._run_admitting(pending, uids, first_uid)


def _driver_init_without_owner_check(self: StaticDriver, engine: Engine, *args: Any, **kwargs: Any) -> None:
    """A new StaticDriver takes the engine without looking at its claim: it is never refused while another driver
    has running requests, and that driver is not retired, so both hand out the same rows and pages."""
    claim = engine.claimed_by
    engine.claim(None)
    try:
        _ORIGINAL_DRIVER_INIT(self, engine, *args, **kwargs)
    except BaseException:
        engine.claim(claim)
        raise


def live_rows_unchecked() -> contextlib.AbstractContextManager[None]:
    # Engine.prepare_batch reaches pack_inputs through engine.engine's module-level name; only that name is rebound.
    return _swap(engine_module, "pack_inputs", _pack_inputs_without_live_rows)


def generate_admits_eagerly() -> contextlib.AbstractContextManager[None]:
    return _swap(StaticDriver, "generate", _generate_admitting_eagerly)


def second_driver_allowed() -> contextlib.AbstractContextManager[None]:
    return _swap(StaticDriver, "__init__", _driver_init_without_owner_check)


# ---- the overlapped driver (issue #13) ---------------------------------------------------------------------------


def _land_keeping_the_overrun(self: Loop, launch: Launch) -> dict[int, int]:
    """A request that finished (EOS) while the next pass was in flight keeps that pass's token: its output runs one
    token past the EOS."""
    overrun = [i for i, (seq, partial) in enumerate(zip(launch.seqs, launch.partial)) if seq.finished and not partial]
    produced = _ORIGINAL_LAND(self, launch)
    tokens = launch.out.result().tolist()
    for i in overrun:
        launch.seqs[i].output_ids.append(tokens[i])
    return produced


def _withdraw_nothing(launch: Launch) -> Launch:
    """The pass started on top of a failed one is left in flight: it lands later, built on requests and random
    streams that were put back underneath it."""
    return launch


def overrun_token_kept() -> contextlib.AbstractContextManager[None]:
    return _swap(Loop, "land", _land_keeping_the_overrun)


def failed_pass_successor_kept() -> contextlib.AbstractContextManager[None]:
    return _swap(Loop, "withdraw", staticmethod(_withdraw_nothing))


# ---- stop tokens ---------------------------------------------------------------------------------------------


def _generation_eos_unused(file: Path, vocab_size: int) -> tuple[int, ...] | None:
    """generation_config.json is read and checked, but its EOS ids are dropped: the stop set is config.json's alone,
    so a model stops on fewer tokens than HF's generate does."""
    _ORIGINAL_GENERATION_EOS(file, vocab_size)
    return None


def eos_from_config_only() -> contextlib.AbstractContextManager[None]:
    # ModelConfig.from_dir reaches generation_eos through its module-level name; only that name is rebound.
    return _swap(model_config_module, "generation_eos", _generation_eos_unused)
