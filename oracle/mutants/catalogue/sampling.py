"""Sampler mutants: filter order, ties, temperature, greedy rows and seeds. Most call the engine's own
``filtered_probs`` with some filters switched off, so each differs from the real sampler in exactly the one way its bug
describes; probabilities are fed back in as logits via ``probs.log()``: softmax returns the same distribution, and
dropped tokens become -inf."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from engine import sample_noise, sample_rows
from engine.core import Batch
from engine.sample import BaseSampler, BatchSamplingArgs, Sampler

from .base import swap

_ORIGINAL_FILTERED_PROBS = Sampler.filtered_probs
_ORIGINAL_PREPARE = BaseSampler.prepare
_ORIGINAL_PREPARE_PARAMS = BaseSampler._prepare_params
_ORIGINAL_FLASHINFER_DRAW = Sampler.flashinfer_draw
_ORIGINAL_STEP_SEED = sample_noise.step_seed
try:  # the seeded noise's Triton kernel exists only where triton does (CUDA builds of torch)
    from engine import sample_triton

    _ORIGINAL_SEEDED_NOISE = sample_triton.seeded_noise_
    _ORIGINAL_SEEDED_RACE = sample_triton.seeded_race
except ImportError:
    sample_triton = None  # type: ignore[assignment]


def _only(args: BatchSamplingArgs, **changes: Any) -> BatchSamplingArgs:
    return dataclasses.replace(args, **changes)


def _no_temperature(args: BatchSamplingArgs) -> torch.Tensor:
    return torch.ones_like(args.temperature)


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


def top_p_off_by_one() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _top_p_inclusive)


def _top_k_after_top_p(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Top-p on the full distribution first, then top-k: the nucleus is cut before top-k renormalizes."""
    nucleus = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, top_k=None, min_p=None))
    return _ORIGINAL_FILTERED_PROBS(self, nucleus.log(), _only(args, temperature=_no_temperature(args), top_p=None))


def top_k_after_top_p() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _top_k_after_top_p)


def _temperature_after_softmax(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Temperature divides probabilities instead of logits; renormalizing undoes it, so T is silently ignored."""
    probs = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, temperature=_no_temperature(args)))
    probs = probs / args.temperature.unsqueeze(1)
    return probs / probs.sum(dim=-1, keepdim=True)


def temperature_after_softmax() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _temperature_after_softmax)


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


def min_p_wrong_max() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _min_p_untempered_max)


def _prepare_greedy_lost(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
    """The greedy mask is dropped in a mixed batch: greedy rows (temperature 1.0 in the args) are sampled too."""
    args = _ORIGINAL_PREPARE(self, batch)
    return args if args.all_greedy else _only(args, greedy=torch.zeros_like(args.greedy))


def greedy_rows_sampled() -> contextlib.AbstractContextManager[None]:
    return swap(BaseSampler, "prepare", _prepare_greedy_lost)


def _prepare_seeds_dropped(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
    """Per-request seeds are dropped: every row draws its noise from the engine-wide generator."""
    args = _ORIGINAL_PREPARE(self, batch)
    return _only(args, row_seeds=[None] * len(args.row_seeds))


def seed_ignored() -> contextlib.AbstractContextManager[None]:
    return swap(BaseSampler, "prepare", _prepare_seeds_dropped)


def _step_seed_without_position(seed: int, position: int) -> int:
    """The step seed ignores the position: a seeded request draws the same noise at every step."""
    return _ORIGINAL_STEP_SEED(seed, 0)


def _noise_without_position(
    noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> None:
    _ORIGINAL_SEEDED_NOISE(noise, rows, seeds, torch.zeros_like(positions))


def _race_without_position(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return _ORIGINAL_SEEDED_RACE(probs, seeds, torch.zeros_like(positions))


@contextlib.contextmanager
def seed_position_lost() -> Iterator[None]:
    """Both keyings lose it: the host's step_seed (generator noise) and the Triton noise's positions (CUDA)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(swap(sample_noise, "step_seed", _step_seed_without_position))
        if sample_triton is not None:
            stack.enter_context(swap(sample_triton, "seeded_noise_", _noise_without_position))
            stack.enter_context(swap(sample_triton, "seeded_race", _race_without_position))
        yield


def _top_p_removed_chunk_carry_dropped(
    values: torch.Tensor, kth: torch.Tensor | None, cut: torch.Tensor
) -> torch.Tensor:
    """engine/sample_rows.top_p_removed with each chunk's cumulative mass starting from 0: the mass of the chunks
    before it is dropped, so a row whose cut lies past its first chunk removes too many tokens."""
    from engine import sample_rows_triton

    if kth is not None:
        values = values.masked_fill(values < kth.unsqueeze(1), float("-inf"))
    chunks = values.softmax(dim=-1).split(sample_rows_triton.CHUNK, dim=-1)
    restarted = torch.cat([chunk.cumsum(dim=-1) for chunk in chunks], dim=-1)
    return (restarted[:, :-1] <= cut.unsqueeze(1)).sum(dim=-1)


def top_p_chunk_carry_dropped() -> contextlib.AbstractContextManager[None]:
    from engine import sample_rows_triton

    return swap(sample_rows_triton, "top_p_removed", _top_p_removed_chunk_carry_dropped)


@contextlib.contextmanager
def top_p_keys_from_rounded_scores() -> Any:
    """The key-count filter bins the tempered scores rounded to the logits' 16-bit dtype, not the logits: distinct
    logits whose scores round alike share a bin, where a cut splits them by index."""
    from engine import sample_keys_triton

    original = sample_keys_triton.filtered_probs_by_keys

    def by_rounded_scores(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                          top_p: torch.Tensor, min_p: torch.Tensor | None, key_dtype: torch.dtype) -> torch.Tensor:
        scores = logits / temperature.unsqueeze(1)
        binned = original(scores.to(key_dtype).float(), torch.ones_like(temperature), top_k, top_p, min_p, key_dtype)
        return scores.masked_fill(binned == 0, float("-inf")).softmax(dim=-1)

    with swap(sample_keys_triton, "filtered_probs_by_keys", by_rounded_scores):
        yield


@contextlib.contextmanager
def key_counts_signed_zeros_apart() -> Any:
    """The key-count filter gives -0.0 a bin of its own, below +0.0's (as the smallest negative subnormal here): a
    cut through a run of zeros removes the negative ones first, where HF's stable sort ties them with +0.0."""
    from engine import sample_keys_triton

    original = sample_keys_triton.filtered_probs_by_keys

    def apart(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor,
              min_p: torch.Tensor | None, key_dtype: torch.dtype) -> torch.Tensor:
        below_zero = -torch.finfo(key_dtype).smallest_normal * torch.finfo(key_dtype).eps
        negative_zero = (logits == 0) & logits.signbit()
        return original(logits.masked_fill(negative_zero, below_zero), temperature, top_k, top_p, min_p, key_dtype)

    with swap(sample_keys_triton, "filtered_probs_by_keys", apart):
        yield


def _tempered_softmax_last_tie(
    logits: torch.Tensor, temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """engine/sample_rows.tempered_softmax with the argmax at the last of a row's tied maxima, not the first."""
    probs, _, finite = sample_rows.tempered_softmax(logits, temperature)
    scores = logits / temperature.unsqueeze(1)
    return probs, (scores.shape[1] - 1 - scores.flip(-1).argmax(dim=-1)).to(torch.int32), finite


def tempered_argmax_last_tie() -> contextlib.AbstractContextManager[None]:
    from engine import sample_rows_triton

    return swap(sample_rows_triton, "tempered_softmax", _tempered_softmax_last_tie)


# ---- ties and filter order -------------------------------------------------------------------------------------------


def _min_p_before_top_p(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Min-p runs before top-p: top-p then sees a distribution renormalized over min-p's survivors and cuts earlier."""
    if args.top_p is None or args.min_p is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    # The survivors' own logits (not their probabilities) go on, so top-p still orders them by score.
    survivors = _ORIGINAL_FILTERED_PROBS(self, logits, _only(args, top_p=None))
    kept = logits.masked_fill(survivors == 0, float("-inf"))
    return _ORIGINAL_FILTERED_PROBS(self, kept, _only(args, top_k=None, min_p=None))


def min_p_before_top_p() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _min_p_before_top_p)


def _top_p_off_rows_truncated(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Rows without top-p get the batch's descending cut at p = 1: where the float32 mass above reaches 1.0, their
    tail tokens are dropped (the fp32 cumulative-mass bug, guard removed)."""
    return _descending_top_p(self, logits, args, own_mass=False, off_rows=True)


def top_p_off_rows_truncated() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _top_p_off_rows_truncated)


def _top_p_lowest_index_ties(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """The old rule: a descending stable sort, so of the ties top-p splits the lowest indices stay (HF: highest)."""
    return _descending_top_p(self, logits, args, own_mass=False, off_rows=False)


def top_p_ties_lowest_index() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _top_p_lowest_index_ties)


def _prepare_top_k_one_greedy(self: BaseSampler, batch: Batch) -> BatchSamplingArgs:
    """Rows with top_k = 1 are treated as greedy: the argmax, where HF samples among tied maxima."""
    args = _ORIGINAL_PREPARE(self, batch)
    top_k_one = torch.tensor([r.sampling_params.top_k == 1 for r in batch.reqs], device=args.greedy.device)
    greedy = args.greedy | top_k_one
    return _only(args, greedy=greedy, all_greedy=bool(greedy.all()))


def top_k_one_is_greedy() -> contextlib.AbstractContextManager[None]:
    return swap(BaseSampler, "prepare", _prepare_top_k_one_greedy)


def _top_k_exactly_k(self: Sampler, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Top-k keeps exactly k tokens (the first k of a sort): tokens tied with the k-th value beyond k are dropped."""
    if args.top_k is None:
        return _ORIGINAL_FILTERED_PROBS(self, logits, args)
    ranks = (logits / args.temperature.unsqueeze(1)).argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
    return _ORIGINAL_FILTERED_PROBS(
        self, logits.masked_fill(ranks >= args.top_k.unsqueeze(1), float("-inf")), _only(args, top_k=None)
    )


def top_k_drops_ties() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "filtered_probs", _top_k_exactly_k)


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


def flashinfer_joint_order() -> contextlib.AbstractContextManager[None]:
    return swap(Sampler, "flashinfer_draw", _flashinfer_draw_joint)


def _prepare_params_any(self: BaseSampler, params: list[Any], pad: int) -> Any:
    """The parameter-block cache checks the batch size only: a batch of new params gets the block of the last one."""
    kept = self._prepared.get(len(params) + pad)
    return kept if kept is not None else _ORIGINAL_PREPARE_PARAMS(self, params, pad)


def param_block_stale() -> contextlib.AbstractContextManager[None]:
    return swap(BaseSampler, "_prepare_params", _prepare_params_any)


def _params_not_loaded(self: BaseSampler, args: BatchSamplingArgs) -> None:
    """A captured sampled step runs on whatever parameters its static buffer held before: this batch's never land."""


def graph_params_unloaded() -> contextlib.AbstractContextManager[None]:
    return swap(BaseSampler, "load_graph_params", _params_not_loaded)


def _noise_keyed_by_row(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> None:
    """A seeded row's noise keyed by its place in the batch, not by its seed."""
    _ORIGINAL_SEEDED_NOISE(noise, rows, rows.to(torch.int64), positions)


def _race_keyed_by_row(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return _ORIGINAL_SEEDED_RACE(probs, torch.arange(probs.shape[0], device=probs.device), positions)


@contextlib.contextmanager
def seeded_noise_by_row() -> Iterator[None]:
    """Both Triton consumers of the seeded noise: the written noise (eager draws) and the race (captured steps)."""
    if sample_triton is None:
        raise RuntimeError("seeded_noise_by_row patches the Triton seeded noise: it needs triton (CUDA)")
    with (swap(sample_triton, "seeded_noise_", _noise_keyed_by_row),
          swap(sample_triton, "seeded_race", _race_keyed_by_row)):
        yield
