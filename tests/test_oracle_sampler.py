"""The reference sampler on hand-checked examples (its property against transformers' own warpers, on Hypothesis
inputs, is properties/test_hf_processors.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import SamplingParams
from oracle.checks import bucketed_tokens, check_filtered_distribution, relax_until_testable
from oracle.sampler import reference_distribution, top2_gap
from oracle.tolerance import summation_bound


@st.composite
def distinct_logits_and_params(draw: st.DrawFn) -> tuple[torch.Tensor, SamplingParams]:
    values = draw(st.lists(st.floats(-20.0, 20.0, width=32), min_size=1, max_size=16, unique=True))
    params = st.builds(
        SamplingParams,
        temperature=st.sampled_from([1e-5, 0.7, 1.0, 3.0]),
        top_k=st.sampled_from([-1, 1, 2, len(values), len(values) + 3]),
        top_p=st.sampled_from([1.0, 1e-9, 0.5, 0.9]),
        min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    )
    return torch.tensor(values, dtype=torch.float32), draw(params)


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
    # A float64 softmax of two: exp(-1) (within one ulp: two roundings), the sum, the reciprocal, the product.
    exact = torch.tensor(math.e / (math.e + 1), dtype=torch.float64)  # 0.7311
    assert abs(ref.probs[0] - exact) <= summation_bound(exact, 5, torch.float64)
    assert ref.probs[0].item() == pytest.approx(0.731, abs=1e-3)
    assert ref.support.tolist() == [True, True, False, False, False, False]
    assert not ref.ambiguous.any()
    assert ref.probs.dtype == torch.float64


def test_top_k_keeps_all_ties_with_kth_decided_not_ambiguous() -> None:
    # Exact ties are decided by HF's rule (>= the k-th), identically on every device; only a sampler deciding on
    # probabilities could keep fewer of them (prob_ties).
    ref = reference_distribution(torch.tensor([3.0, 2.0, 2.0, 1.0]), SamplingParams(temperature=1.0, top_k=2))
    assert ref.support.tolist() == [True, True, True, False]
    assert not ref.ambiguous.any()
    assert ref.prob_ties.tolist() == [False, True, True, False]


def test_top_k_one_keeps_every_tied_maximum() -> None:
    ref = reference_distribution(torch.tensor([1.0, 3.0, 3.0, 0.0]), SamplingParams(temperature=0.8, top_k=1))
    assert not ref.is_greedy
    assert ref.probs.tolist() == [0.0, 0.5, 0.5, 0.0]
    assert not ref.ambiguous.any()
    assert ref.prob_ties.tolist() == [False, True, True, False]


def test_near_tie_at_the_kth_value_is_ambiguous() -> None:
    below = torch.nextafter(torch.tensor(2.0), torch.tensor(0.0)).item()  # one float32 ulp under 2
    ref = reference_distribution(torch.tensor([3.0, 2.0, below, 1.0]), SamplingParams(temperature=1.0, top_k=2))
    assert ref.support.tolist() == [True, True, False, False]
    assert ref.ambiguous.tolist() == [False, False, True, False]


def test_top_p_keeps_only_top_token_when_it_exceeds_p() -> None:
    logits = torch.tensor([3.0, 0.0, 0.0, -1.0])  # top token ~0.9
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert ref.support.tolist() == [True, False, False, False]
    assert ref.probs[0].item() == 1.0


def test_top_p_keeps_the_highest_indices_of_a_split_tie() -> None:
    # probs [0.4, 0.2, 0.2, 0.2], top_p 0.7: ascending, the ties come first in index order; cumulative masses 0.2,
    # 0.4, 0.6 against the cut 0.3 remove token 1 only. Not ambiguous (far from the cut); FlashInfer sees one tie.
    logits = torch.tensor([0.4, 0.2, 0.2, 0.2]).log()
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert ref.support.tolist() == [True, False, True, True]
    assert not ref.ambiguous.any()
    assert ref.prob_ties.tolist() == [False, True, True, True]


def test_top_p_mass_at_the_cut_is_ambiguous() -> None:
    # probs [0.5, 0.25, 0.25], top_p 0.5: token 2's cumulative mass is the cut 0.5 itself, within rounding.
    logits = torch.tensor([0.5, 0.25, 0.25]).log()
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert ref.support[0] and ref.ambiguous.tolist() == [False, False, True]


def test_huge_temperature_decides_in_float32() -> None:
    # At T = 1e30 every float32 probability is exactly 1/4 although the scores differ: HF's top-p still orders by
    # score (ascending 3, 2, 1, 0; cumulative 0.25, 0.5, ...) and removes token 3 only; float64 would agree here,
    # but min-p = 1 keeps all four in float32 (ties with the max) where float64 keeps one: ambiguous there.
    row = torch.tensor([3.0, 2.0, 1.0, 0.0])
    ref = reference_distribution(row, SamplingParams(temperature=1e30, top_p=0.6))
    assert ref.support.tolist() == [True, True, True, False]
    assert not ref.ambiguous.any()
    assert ref.prob_ties.tolist() == [True, True, True, True]
    flat = reference_distribution(row, SamplingParams(temperature=1e30, min_p=1.0))
    assert flat.support.all()
    assert flat.ambiguous.tolist() == [False, True, True, True]


def test_min_p_drops_below_scaled_threshold() -> None:
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05], dtype=torch.float64))
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, min_p=0.1))
    assert ref.support.tolist() == [True, True, False, False]  # 0.05 < 0.1 * 0.6
    torch.testing.assert_close(ref.probs[:2], torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    assert not ref.ambiguous.any()


def test_min_p_one_keeps_exact_ties_at_the_top_and_flags_near_ones() -> None:
    ref = reference_distribution(torch.tensor([1.0, 1.0, 0.0]), SamplingParams(temperature=1.0, min_p=1.0))
    assert ref.support.tolist() == [True, True, False]
    assert not ref.ambiguous.any()
    above = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item()
    near = reference_distribution(torch.tensor([1.0, above, 0.0]), SamplingParams(temperature=1.0, min_p=1.0))
    assert near.support.tolist() == [False, True, False]
    assert near.ambiguous.tolist() == [True, False, False]


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
    # Tokens 2 and 3 are near-tied (distinct float32 logits) at the k-th value. The reference keeps tokens 0, 1, 3
    # (mass 1.0): token 1's cumulative mass 0.45 <= the cut 0.455, removed; a device that also keeps token 2 sees
    # 0.4554 > 0.455 and keeps it. So token 1 is ambiguous too; token 3 (cumulative 0.01) is removed either way.
    logits = torch.log(torch.tensor([0.55, 0.44, 0.01, 0.01 * (1 + 3e-6)], dtype=torch.float64))
    ref = reference_distribution(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.545))
    assert ref.support.tolist() == [True, False, False, False]
    assert ref.ambiguous.tolist() == [False, True, True, False]


def test_greedy_is_the_first_argmax_and_never_ambiguous() -> None:
    ref = reference_distribution(torch.tensor([0.5, 2.0, 1.0]), SamplingParams(temperature=0.0, top_p=0.1))
    assert ref.is_greedy
    assert ref.probs.tolist() == [0.0, 1.0, 0.0]
    tie = reference_distribution(torch.tensor([2.0, 1.0, 2.0]), SamplingParams(temperature=0.0))
    assert tie.probs.tolist() == [1.0, 0.0, 0.0]
    assert not ref.ambiguous.any() and not tie.ambiguous.any()


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
    with pytest.raises(ValueError, match="overflow"):
        reference_distribution(torch.tensor([1e3, 0.0]), SamplingParams(temperature=1e-37))


def test_filtered_distribution_check_sees_one_lost_tail_token_and_a_shifted_probability() -> None:
    row = torch.tensor([0.0, -25.0, 1.0])  # token 1 carries ~1e-11
    ref = reference_distribution(row, SamplingParams(temperature=1.0))
    probs = torch.softmax(row, dim=-1)
    assert check_filtered_distribution(probs, ref) is None
    lost = probs.clone()
    lost[1] = 0.0
    assert "tokens [1] dropped" in str(check_filtered_distribution(lost, ref))
    shifted = probs * torch.tensor([1.001, 1.0, 1.0])
    assert "beyond the bound" in str(check_filtered_distribution(shifted / shifted.sum(), ref))


def test_relax_until_testable_turns_off_what_leaves_one_bucket() -> None:
    row = torch.tensor([3.0, 0.0, 0.0, -1.0])
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1e-6)
    assert bucketed_tokens(row, params, 1000) == 1
    relaxed = relax_until_testable(row, params, 1000)
    assert (relaxed.top_p, relaxed.top_k) == (1.0, 3) and bucketed_tokens(row, relaxed, 1000) >= 2
    greedy = SamplingParams(temperature=0.0, top_p=1e-6)
    assert relax_until_testable(row, greedy, 1000) == greedy


def test_relax_until_testable_heats_a_row_that_temperature_1_leaves_one_token() -> None:
    # ci-random seed 14 drew this row: at temperature 1 its runner-up gets 1e-8 of the mass, no bucket in 12,000 draws.
    row = torch.tensor([15.41, -2.93])
    params = SamplingParams(temperature=0.7, top_k=1)
    relaxed = relax_until_testable(row, params, 12_000)
    assert (relaxed.top_k, relaxed.temperature) == (-1, 4.0) and bucketed_tokens(row, relaxed, 12_000) == 2


def test_probability_ties_include_near_ties_another_softmax_may_merge() -> None:
    # At T = 1e7 the float32 probabilities differ in their last ulp only: the GPU's softmax rounds them otherwise,
    # so FlashInfer (which cuts on probabilities) may keep any two; all four are ties for it, none at T = 1.
    row = torch.tensor([1.0, 0.5, 0.25, 0.0])
    hot = reference_distribution(row, SamplingParams(temperature=1e7, top_k=2))
    assert hot.support.tolist() == [True, True, False, False] and bool(hot.prob_ties.all())
    assert not bool(reference_distribution(row, SamplingParams(temperature=1.0, top_k=2)).prob_ties.any())
