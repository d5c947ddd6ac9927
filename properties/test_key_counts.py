"""Property: the filter by counts of 16-bit keys (RowPasses.probs_by_keys, what the CUDA sampler runs where the
model's logits are bf16 or fp16 values: top-k, top-p, min-p and the softmax in one, docs/sampling.md keys) gives
oracle.sampler's distribution on every row: the support exactly outside the tokens another device's rounding could
flip, and the probabilities within oracle.checks' float32 bound.

Rows are Gaussians rounded to the dtype at scales from its subnormals (fp16 rounds them to zeros of both signs) to
tens, or ladders of adjacent values of the dtype, dense with ties, a drawn share of them -inf; temperatures run from
0.05 up to just under KEYS_EXACT_BELOW; vocabularies straddle the row passes' 4096-token chunks. Each example files
whether a row's cut split a run of tied scores (the cut bin's tokens ranked by index across chunks), whether one fell
among distinct logits whose scores round to one 16-bit value (what binning the rounded scores gets wrong: the mutant
`top_p_keys_from_rounded_scores`), and whether one split zeros of both signs (which must share a bin: the mutant
`key_counts_signed_zeros_apart`). Targets whose row passes have no key-count path (CPU's) skip: nothing to test.

Deterministic comparisons, so no α; examples(1.0) examples (25 under `ci`).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.sample_rows import KEYS_EXACT_BELOW, row_passes_for
from oracle.budget import examples
from oracle.checks import check_filtered_distribution
from oracle.coverage import exercised, floors
from oracle.ops.strategies import BLOCK_EDGES, edge_sizes
from oracle.sampler import reference_distribution
from oracle.sampling_strategies import MASKED_SHARES, with_dead_tokens
from oracle.strategies import seeds
from oracle.target import Target

SCALES = (2.0**-140, 1e-3, 0.3, 1.0, 3.0, 30.0)  # 2**-140: bf16 subnormals (fp16 rounds them to signed zeros)
TEMPERATURES = st.sampled_from((0.05, 0.8, 1.0, 1.3, 3.0, 1000.0, KEYS_EXACT_BELOW - 1.0)) | st.floats(0.05, 100.0)
TIED_CUT = "a batch where a row's cut splits a run of tied scores"
ROUNDED_CUT = "a batch where a row's cut falls among distinct logits whose scores round to one 16-bit value"
ZERO_CUT = "a batch where a row's cut splits zeros of both signs"


@st.composite
def keyed_rows(draw: st.DrawFn, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """A Gaussian rounded to dtype, or a ladder: each token one of 2..16 adjacent values of dtype from a Gaussian
    start (where dividing by T rounds neighbours together most often)."""
    gen = torch.Generator().manual_seed(draw(seeds))
    row = (torch.randn(vocab, generator=gen) * draw(st.sampled_from(SCALES))).to(dtype)
    if draw(st.booleans()):
        rungs = torch.randint(draw(st.integers(2, 16)), (vocab,), generator=gen, dtype=torch.int16)
        start = row[:1].abs().view(torch.int16)
        row = (start + rungs).view(dtype) * (1.0 if draw(st.booleans()) else -1.0)
    return with_dead_tokens(row, draw(st.sampled_from(MASKED_SHARES)), gen)


@st.composite
def row_params(draw: st.DrawFn, vocab: int) -> SamplingParams:
    """A sampled row's filters: top-p on all but one row in eight (which keep their tails beside the others), top-k
    and min-p on about half."""
    top_p_off = draw(st.integers(0, 7)) == 0
    return SamplingParams(
        temperature=draw(TEMPERATURES),
        top_k=draw(st.just(-1) | st.integers(1, vocab)),
        top_p=1.0 if top_p_off else draw(st.floats(0.05, 0.99)),
        min_p=draw(st.just(0.0) | st.floats(0.001, 0.5)),
    )


def _cut_events(logits: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor) -> tuple[bool, bool, bool]:
    """(the cut splits tied scores, it splits distinct logits whose scores round alike, it splits zeros of both
    signs) for one row."""
    if not kept.any() or kept.all():
        return False, False, False
    edge = scores[kept].min()
    tied = scores == edge
    group = scores.to(logits.dtype) == edge.to(logits.dtype)
    distinct = logits[group].unique().numel() > 1
    split = bool((tied & ~kept).any())
    zeros = split and edge == 0 and logits[tied].signbit().unique().numel() == 2
    return split, bool(distinct and (group & ~kept).any() and (group & kept).any()), bool(zeros)


@settings(max_examples=examples(1.0), deadline=None)
@given(data=st.data())
@floors({TIED_CUT: 0.2, ROUNDED_CUT: 0.15, ZERO_CUT: 0.05})
def test_filter_by_16_bit_key_counts_is_hf_filter(data: st.DataObject, target: Target) -> None:
    dev = target.torch_device
    by_keys = row_passes_for(dev).probs_by_keys
    if by_keys is None:
        pytest.skip(f"the sampler's row passes on {dev} have no key-count filter (CUDA's Triton ones do)")
    dtype = data.draw(st.sampled_from((torch.bfloat16, torch.float16)), label="dtype")
    vocab = data.draw(edge_sizes(BLOCK_EDGES, 2, 5000), label="vocab")
    n = data.draw(st.integers(1, 4), label="rows")
    logits = torch.stack([data.draw(keyed_rows(vocab, dtype), label=f"logits[{r}]") for r in range(n)]).float()
    params = [data.draw(row_params(vocab), label=f"params[{r}]") for r in range(n)]
    temperature = torch.tensor([p.temperature for p in params])
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float64)
    min_p = torch.tensor([p.min_p for p in params])
    got = by_keys(logits.to(dev), temperature.to(dev), None if bool((top_k == vocab).all()) else top_k.to(dev),
                  top_p.to(dev), None if bool((min_p == 0).all()) else min_p.to(dev), dtype).cpu()
    scores = logits / temperature.unsqueeze(1)
    events = [_cut_events(logits[r].to(dtype), scores[r], got[r] > 0) for r in range(n)]
    exercised(TIED_CUT, any(e[0] for e in events))
    exercised(ROUNDED_CUT, any(e[1] for e in events))
    exercised(ZERO_CUT, any(e[2] for e in events))
    for r, p in enumerate(params):
        why = check_filtered_distribution(got[r], reference_distribution(logits[r], p))
        assert why is None, f"key-count filter, row {r} of {n}, {dtype} logits, vocab {vocab}, {p}: {why}"
