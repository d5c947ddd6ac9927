"""Property: oracle.sampler's distribution is the one transformers' own logits warpers define, ties included.

For a float32 logits row and SamplingParams, transformers' TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper and MinPLogitsWarper run in generate's order (5.17, GenerationMixin._get_logits_processor:
temperature if != 1, top-k if set, top-p if < 1, min-p if set, each with min_tokens_to_keep = 1 as without beam
search) on the row as generate runs them: float32, a batch of one. oracle.reference_distribution must give

* the support of HF's processed scores, token for token wherever HF's own ascending torch.sort left tied scores in
  index order (it is introsort on CPU, stable only up to 16 elements); elsewhere the same number of survivors in
  every group of identical float32 scores, since which of them survive is an artefact of that sort
  (oracle.sampler's module doc);
* probabilities equal to the float64 softmax of HF's processed scores (the same float32 scores) up to the order
  of the softmax's float64 sum (twice oracle.tolerance.summation_bound over the row, relative), each group of
  identical scores compared as a multiset.

A second law checks that `ambiguous` is sound: the warpers run with another device's rounding (float64 throughout,
or float32 logits multiplied by float32(1 / T), as CUDA divides by a Python scalar) change the support only at
ambiguous tokens (per group of identical scores where their sort left ties out of index order).

Inputs: tie-heavy rows (1..4 repeated levels, or bf16-rounded Gaussians, with a share of -inf) and tie-free
Gaussians of 1..40 tokens; tiny (1e-30..1e-5), ordinary and huge (1e4..1e30, where float32 probabilities tie
although the logits differ) temperatures; top-k, top-p and min-p each off or drawn with their edges
(oracle.sampling_strategies.filter_params). Deterministic comparisons, so no α; CPU math only: examples(5.0)
examples, 125 under `ci` and 2000 under `deep`, in seconds.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessor,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine import SamplingParams
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.sampler import reference_distribution
from oracle.sampling_strategies import HUGE_TEMPERATURES, filter_params, tie_heavy_rows
from oracle.strategies import logits_rows
from oracle.tolerance import summation_bound


def hf_warpers(params: SamplingParams, temperature: bool = True) -> list[LogitsProcessor]:
    """The warpers generate builds for params with do_sample=True, in its order (temperature=False leaves it out).
    Our top_k == -1 is HF's top_k=None and our min_p == 0 its min_p=None."""
    warpers: list[LogitsProcessor] = []
    if temperature and params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(float(params.temperature)))
    if params.top_k != -1:
        warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    if params.min_p > 0.0:
        warpers.append(MinPLogitsWarper(min_p=params.min_p, min_tokens_to_keep=1))
    return warpers


def run_warpers(scores: torch.Tensor, warpers: list[LogitsProcessor]) -> tuple[torch.Tensor, bool]:
    """The processed scores of one row, and whether top-p's ascending sort (if any) kept tied scores in index order."""
    ids = torch.zeros((1, 1), dtype=torch.long)
    x = scores.unsqueeze(0)
    in_index_order = True
    for warper in warpers:
        if isinstance(warper, TopPLogitsWarper):
            in_index_order = torch.equal(torch.sort(x).indices, torch.sort(x, stable=True).indices)
        x = warper(ids, x)
    return x[0], in_index_order


def unexplained(
    theirs: torch.Tensor, ours: torch.Tensor, scores: torch.Tensor, token_exact: bool, ambiguous: torch.Tensor
) -> torch.Tensor:
    """Tokens where two supports disagree beyond `ambiguous`. Without token_exact, a group of identical float32
    scores (the sort's key) may differ in which members survive, and in how many by at most its ambiguous members."""
    differ = (theirs != ours) & ~ambiguous
    if token_exact:
        return differ
    for value in scores[differ].unique():
        group = scores == value
        if abs(int(theirs[group].sum()) - int(ours[group].sum())) <= int(ambiguous[group].sum()):
            differ &= ~group
    return differ


@st.composite
def rows_and_params(draw: st.DrawFn) -> tuple[torch.Tensor, SamplingParams]:
    vocab = draw(st.integers(1, 40), label="vocab")
    tie_free = draw(st.integers(0, 3), label="kind") == 0
    row = draw(logits_rows(vocab) if tie_free else tie_heavy_rows(vocab), label="row")
    return row, draw(filter_params(vocab), label="params")


TIE = "tie in float32 probability at a top-k or top-p cut"
HUGE = "huge temperature (>= 1e4)"
UNORDERED = "HF's top-p sort left ties out of index order"
FLIPS = "another rounding flips a decision (at an ambiguous token)"


@settings(max_examples=examples(5.0), deadline=None)
@given(rows_and_params())
@floors({TIE: 0.3, HUGE: 0.15, UNORDERED: 0.02})
def test_oracle_is_transformers_warpers(case: tuple[torch.Tensor, SamplingParams]) -> None:
    row, params = case
    ref = reference_distribution(row, params)
    scores, in_index_order = run_warpers(row, hf_warpers(params))
    hf_probs = torch.softmax(scores.double(), dim=-1)
    tempered = row / float(params.temperature)
    exercised(TIE, bool(ref.prob_ties.any()))
    exercised(HUGE, params.temperature >= min(HUGE_TEMPERATURES))
    exercised(UNORDERED, not in_index_order)
    wrong = unexplained(hf_probs > 0, ref.support, tempered, in_index_order, torch.zeros_like(ref.support))
    assert not wrong.any(), f"{params}: support differs from HF's at tokens {wrong.nonzero().flatten().tolist()}"
    # The same float32 scores on both sides: each probability e_k / sum is off by the sum's order and one rounding.
    for value in tempered.unique():
        group = tempered == value
        ours, theirs = ref.probs[group].sort().values, hf_probs[group].sort().values
        excess = (ours - theirs).abs() - 2 * summation_bound(theirs, len(row), torch.float64)
        assert not (excess > 0).any(), f"{params}: probabilities {ours.tolist()} vs HF's {theirs.tolist()}"


@settings(max_examples=examples(5.0), deadline=None)
@given(rows_and_params())
@floors({FLIPS: 0.02})
def test_other_rounding_changes_only_ambiguous_tokens(case: tuple[torch.Tensor, SamplingParams]) -> None:
    row, params = case
    ref = reference_distribution(row, params)
    reciprocal = row * (1.0 / torch.tensor(float(params.temperature), dtype=torch.float32))
    variants = {
        "float64": run_warpers(row.double(), hf_warpers(params)),
        "float32 x * (1 / T)": run_warpers(reciprocal, hf_warpers(params, temperature=False)),
    }
    flips = False
    for name, (scores, in_index_order) in variants.items():
        support = torch.softmax(scores.double(), dim=-1) > 0
        flips |= bool((support != ref.support).any())
        wrong = unexplained(support, ref.support, row / float(params.temperature), in_index_order, ref.ambiguous)
        assert not wrong.any(), f"{params}, {name}: support flips outside ambiguous at {wrong.nonzero().tolist()}"
    exercised(FLIPS, flips)
