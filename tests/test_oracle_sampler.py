"""The reference sampler against HF transformers' own logits warpers, plus hand-checked examples."""

from __future__ import annotations

import math

import pytest
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

from engine.core import SamplingParams
from oracle.sampler import ReferenceDistribution, reference_distribution, top2_gap

# Small enough for the whole module to run in a few seconds on 2 cores.
HYPOTHESIS = settings(max_examples=150, deadline=None)


def hf_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """The warpers ``generate`` would build for ``params`` with ``do_sample=True``, in its order.

    Verified against transformers 5.17 ``generation/utils.py``, ``GenerationMixin._get_logits_processor``
    (lines ~1424-1457): Temperature (only if != 1.0), TopK (only if != 0/None), TopP (only if < 1.0),
    MinP (if not None), each with ``min_tokens_to_keep=1`` when ``num_beams == 1``. Our ``top_k == -1``
    is HF's ``top_k=None`` and our ``min_p == 0`` is HF's ``min_p=None``.
    """
    procs: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(float(params.temperature)))
    if params.top_k != -1:
        procs.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    if params.min_p > 0.0:
        procs.append(MinPLogitsWarper(min_p=params.min_p, min_tokens_to_keep=1))
    return procs


def hf_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """HF's sampling distribution; the warpers run on float64 so the comparison is exact math."""
    scores = logits.to(torch.float64).unsqueeze(0)
    input_ids = torch.zeros((1, 1), dtype=torch.long)
    for proc in hf_processors(params):
        scores = proc(input_ids, scores)
    return torch.softmax(scores, dim=-1)[0]


def assert_matches_hf(logits: torch.Tensor, params: SamplingParams) -> ReferenceDistribution:
    ref = reference_distribution(logits, params, mode="hf")
    hf = hf_probs(logits, params)
    clear = ~ref.ambiguous
    mismatch = (hf > 0) != ref.support
    assert not (mismatch & clear).any(), (logits, params, hf, ref)
    if not ref.ambiguous.any():
        torch.testing.assert_close(ref.probs, hf, rtol=0, atol=1e-6)
    elif ref.probs[clear].sum() > 0:
        # Ambiguous tokens may fall on either side of a cut, which changes only the normalizer of
        # the rest; so the distributions conditioned on the clear tokens must agree.
        ours = ref.probs[clear] / ref.probs[clear].sum()
        theirs = hf[clear] / hf[clear].sum()
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert math.isclose(float(ref.probs.sum()), 1.0, rel_tol=1e-12)
    return ref


def params_strategy(vocab: int) -> st.SearchStrategy[SamplingParams]:
    return st.builds(
        SamplingParams,
        temperature=st.sampled_from([1e-5, 0.7, 1.0, 3.0]),
        top_k=st.sampled_from([-1, 1, 2, vocab, vocab + 3]),
        top_p=st.sampled_from([1.0, 1e-9, 0.5, 0.9]),
        min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    )


@st.composite
def distinct_logits_and_params(draw: st.DrawFn) -> tuple[torch.Tensor, SamplingParams]:
    values = draw(
        st.lists(st.floats(-20.0, 20.0, allow_nan=False, allow_infinity=False), min_size=1, max_size=16, unique=True)
    )
    return torch.tensor(values, dtype=torch.float64), draw(params_strategy(len(values)))


@st.composite
def tied_logits_and_params(draw: st.DrawFn) -> tuple[torch.Tensor, SamplingParams]:
    # A few distinct levels repeated many times, plus masked (-inf) tokens: exact ties at every cut.
    levels = draw(st.lists(st.sampled_from([-3.0, -1.0, 0.0, 0.5, 2.0]), min_size=1, max_size=3, unique=True))
    values = draw(st.lists(st.sampled_from([*levels, -math.inf]), min_size=1, max_size=16))
    values.append(levels[0])  # at least one finite logit
    return torch.tensor(values, dtype=torch.float64), draw(params_strategy(len(values)))


@HYPOTHESIS
@given(distinct_logits_and_params())
def test_hf_mode_matches_hf_warpers_distinct(case: tuple[torch.Tensor, SamplingParams]) -> None:
    assert_matches_hf(*case)


@HYPOTHESIS
@given(tied_logits_and_params())
def test_hf_mode_matches_hf_warpers_ties(case: tuple[torch.Tensor, SamplingParams]) -> None:
    assert_matches_hf(*case)


@settings(max_examples=100, deadline=None)
@given(st.one_of(distinct_logits_and_params(), tied_logits_and_params()))
def test_fp32_hf_differs_only_at_ambiguous_tokens(case: tuple[torch.Tensor, SamplingParams]) -> None:
    # HF's warpers on float32 logits stand in for an fp32 engine: with the default tol, every support
    # decision they take differently from the float64 reference must be flagged ambiguous.
    logits, params = case
    logits32 = logits.to(torch.float32)
    scores = logits32.unsqueeze(0)
    for proc in hf_processors(params):
        scores = proc(torch.zeros((1, 1), dtype=torch.long), scores)
    support32 = torch.softmax(scores.to(torch.float64), dim=-1)[0] > 0
    ref = reference_distribution(logits32, params)
    assert not ((support32 != ref.support) & ~ref.ambiguous).any(), (logits32, params, scores, ref)


@settings(max_examples=100, deadline=None)
@given(distinct_logits_and_params(), st.sampled_from(["top_k", "top_p", "min_p"]))
def test_joint_equals_hf_with_one_filter(case: tuple[torch.Tensor, SamplingParams], keep: str) -> None:
    logits, params = case
    single = SamplingParams(
        temperature=params.temperature,
        top_k=params.top_k if keep == "top_k" else -1,
        top_p=params.top_p if keep == "top_p" else 1.0,
        min_p=params.min_p if keep == "min_p" else 0.0,
    )
    hf = reference_distribution(logits, single, mode="hf")
    joint = reference_distribution(logits, single, mode="joint")
    assert torch.equal(hf.probs, joint.probs)
    assert torch.equal(hf.ambiguous, joint.ambiguous)


def test_top_k_six_tokens() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -2.0, -3.0])
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert ref.probs[0].item() == pytest.approx(math.e / (math.e + 1))  # 0.7311
    assert ref.probs[0].item() == pytest.approx(0.731, abs=1e-3)
    assert ref.support.tolist() == [True, True, False, False, False, False]
    assert not ref.ambiguous.any()
    assert ref.probs.dtype == torch.float64


def test_top_k_keeps_all_ties_with_kth_and_marks_them() -> None:
    ref = reference_distribution(torch.tensor([3.0, 2.0, 2.0, 1.0]), SamplingParams(temperature=1.0, top_k=2))
    assert ref.support.tolist() == [True, True, True, False]
    assert ref.ambiguous.tolist() == [False, True, True, False]


def test_top_p_keeps_only_top_token_when_it_exceeds_p() -> None:
    logits = torch.tensor([3.0, 0.0, 0.0, -1.0])  # top token ~0.9
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert ref.support.tolist() == [True, False, False, False]
    assert ref.probs[0].item() == 1.0


def test_top_p_boundary_is_exclusive_and_ambiguous() -> None:
    # probs [0.5, 0.25, 0.25]: mass above the 2nd token is exactly p, so HF drops it; being on the
    # threshold it is ambiguous, and so is the 3rd token, tied with it across the cut.
    logits = torch.log(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert ref.support.tolist() == [True, False, False]
    assert ref.ambiguous.tolist() == [False, True, True]


def test_min_p_drops_below_scaled_threshold() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05], dtype=torch.float64))
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, min_p=0.1))
    assert ref.support.tolist() == [True, True, False, False]  # 0.05 < 0.1 * 0.6
    torch.testing.assert_close(ref.probs[:2], torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    assert not ref.ambiguous.any()


def test_min_p_one_with_near_tie_at_top() -> None:
    ref = reference_distribution(
        torch.tensor([1.0, 1.0 + 1e-9, 0.0], dtype=torch.float64), SamplingParams(temperature=1.0, min_p=1.0)
    )
    assert ref.support.tolist() == [False, True, False]
    assert ref.ambiguous.tolist() == [True, True, False]


def test_joint_differs_from_hf() -> None:
    # probs [0.4, 0.3, 0.2, 0.1], top_k=3, top_p=0.75. hf renormalizes over the top 3 first
    # ([4/9, 3/9, 2/9]; mass above the 3rd = 7/9 >= 0.75, dropped); joint sees mass above the 3rd
    # as 0.7 < 0.75 on the original distribution and keeps it.
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64))
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.75)
    hf = reference_distribution(logits, params, mode="hf")
    joint = reference_distribution(logits, params, mode="joint")
    assert hf.support.tolist() == [True, True, False, False]
    assert joint.support.tolist() == [True, True, True, False]
    torch.testing.assert_close(joint.probs[:3], torch.tensor([4 / 9, 3 / 9, 2 / 9], dtype=torch.float64))
    assert not hf.ambiguous.any() and not joint.ambiguous.any()


def test_ambiguous_top_k_widens_top_p_tolerance() -> None:
    # Tokens 2 and 3 are near-tied at the k-th value. The reference keeps 3 tokens (total mass 1.0),
    # so token 1 has mass above 0.55 >= p and is dropped; an engine that also keeps token 2 sees
    # 0.55 / 1.01 < p and keeps token 1. So token 1's top-p decision must be ambiguous too.
    logits = torch.log(torch.tensor([0.55, 0.44, 0.01, 0.01 * (1 + 1e-9)], dtype=torch.float64))
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.545)
    ref = assert_matches_hf(logits, params)
    assert ref.support.tolist() == [True, False, False, False]
    assert ref.ambiguous.tolist() == [False, True, True, True]


def test_greedy_one_hot_and_near_tie() -> None:
    ref = reference_distribution(torch.tensor([0.5, 2.0, 1.0]), SamplingParams(temperature=0.0, top_p=0.1))
    assert ref.is_greedy
    assert ref.probs.tolist() == [0.0, 1.0, 0.0]
    assert not ref.ambiguous.any()
    tie = reference_distribution(
        torch.tensor([2.0, 2.0 + 1e-7, 1.0], dtype=torch.float64), SamplingParams(temperature=0.0)
    )
    assert tie.probs.tolist() == [0.0, 1.0, 0.0]
    assert tie.ambiguous.tolist() == [True, True, False]


def test_masked_logits_are_never_support_nor_ambiguous() -> None:
    logits = torch.tensor([0.0, -math.inf, 0.0, -math.inf])
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_k=4))
    assert ref.support.tolist() == [True, False, True, False]
    assert not ref.ambiguous.any()


def test_top2_gap() -> None:
    assert top2_gap(torch.tensor([1.0, 3.5, 3.0])) == pytest.approx(0.5)
    assert top2_gap(torch.tensor([2.0])) == math.inf


def test_rejects_bad_input() -> None:
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError):
        reference_distribution(torch.tensor([[1.0, 2.0]]), params)
    with pytest.raises(ValueError):
        reference_distribution(torch.tensor([1.0, math.nan]), params)
    with pytest.raises(ValueError):
        reference_distribution(torch.tensor([-math.inf, -math.inf]), params)
