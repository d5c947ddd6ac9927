"""Chi-square with pooling, the support check, the alpha budget and sample-size planning.

Every random draw uses a seeded torch.Generator, so these tests are deterministic; the stated alpha
and n say how unlikely a failure would have been had the seed been random.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oracle.stats import (
    AlphaBudget,
    chi_square_gof,
    detectable_effect,
    per_test_alpha,
    power,
    repeats_p_value,
    required_samples,
    support_check,
)

# A head of large tokens and a tail of 30 tokens with 0.1% each, so pooling is exercised at n below.
TRUE = torch.tensor([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03] + [0.001] * 30, dtype=torch.float64)
TRUE = TRUE / TRUE.sum()


def draw_counts(probs: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    samples = torch.multinomial(probs, n, replacement=True, generator=gen)
    return torch.bincount(samples, minlength=probs.numel())


def effect_size(p0: torch.Tensor, p1: torch.Tensor) -> float:
    """Cohen's w of ``p1`` measured against ``p0``."""
    return math.sqrt(float(((p1 - p0) ** 2 / p0).sum()))


def test_passes_on_true_distribution() -> None:
    n, alpha = 2000, 1e-3  # tail expected 2 each: pooled into one bucket
    result = chi_square_gof(draw_counts(TRUE, n, seed=1), TRUE, alpha)
    assert result.passed, result.message()
    assert result.n == n
    assert result.df == 8  # 8 head tokens + 1 pooled bucket - 1
    assert any(b.token is None and b.size == 30 for b in result.bins)
    assert math.isclose(sum(b.expected for b in result.bins), n, rel_tol=1e-12)


def test_fails_on_perturbed_distribution() -> None:
    n, alpha = 2000, 1e-3
    shifted = TRUE.clone()
    shifted[0] -= 0.08
    shifted[1] += 0.08
    w = effect_size(TRUE, shifted)
    assert w > 0.2 and power(n, w, df=8, alpha=alpha) > 0.9999  # failure all but certain
    result = chi_square_gof(draw_counts(shifted, n, seed=2), TRUE, alpha)
    assert not result.passed
    text = str(result)
    assert "FAILED" in text and "token 1" in text and "contribution" in text


def test_false_failure_rate_matches_alpha() -> None:
    # Pooling must not break the null distribution: over 400 seeded runs at alpha = 0.1 the
    # rejection count is Binomial(400, 0.1) (mean 40, sd 6); [18, 65] is about +-3.7 sd.
    n, alpha = 300, 0.1
    rejections = sum(not chi_square_gof(draw_counts(TRUE, n, seed=s), TRUE, alpha).passed for s in range(400))
    assert 18 <= rejections <= 65


WIDE = torch.full((200,), 1 / 200, dtype=torch.float64)  # 200 tokens of expected 50 each at n = 10000


def test_buckets_are_capped_so_df_is_bounded() -> None:
    result = chi_square_gof(draw_counts(WIDE, 10_000, seed=3), WIDE, 1e-3, max_buckets=32)
    assert result.passed and result.df == 31 and len(result.bins) == 32
    assert sum(b.size for b in result.bins) == 200 and math.isclose(sum(b.expected for b in result.bins), 10_000)


def test_capped_buckets_keep_the_null_distribution() -> None:
    # As above, Binomial(400, 0.1) rejections at alpha = 0.1 with 200 tokens pooled into 8 buckets.
    rejections = sum(
        not chi_square_gof(draw_counts(WIDE, 2000, seed=s), WIDE, 0.1, max_buckets=8).passed for s in range(400)
    )
    assert 18 <= rejections <= 65


def test_small_remainder_merges_into_smallest_kept_bin() -> None:
    probs = torch.tensor([0.6, 0.3, 0.08, 0.02], dtype=torch.float64)
    counts = torch.tensor([60, 30, 8, 2])  # n = 100: expected 60, 30, 8, 2
    result = chi_square_gof(counts, probs, alpha=0.01, min_expected=5.0)
    # Token 3 (expected 2) cannot stand alone and is merged with token 2 (expected 8).
    assert result.df == 2
    merged = [b for b in result.bins if b.token is None]
    assert len(merged) == 1 and merged[0].size == 2 and merged[0].expected == pytest.approx(10.0)


def test_all_mass_on_one_token_is_trivially_passed() -> None:
    probs = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    result = chi_square_gof(torch.tensor([0, 500, 0]), probs, alpha=1e-3)
    assert result.passed and result.df == 0 and "trivially" in result.note


def test_excluded_tokens_are_dropped_and_the_rest_renormalized() -> None:
    # Token 2 is ambiguous: the engine legitimately gave it far more mass than the oracle. The
    # rest, conditioned on not landing on it, still follows the oracle's 2:1 ratio.
    probs = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    counts = torch.tensor([400, 200, 400])
    exclude = torch.tensor([False, False, True])
    assert not chi_square_gof(counts, probs, alpha=1e-3).passed
    result = chi_square_gof(counts, probs, alpha=1e-3, exclude=exclude)
    assert result.passed and result.n == 600 and result.dropped == 400
    assert [b.expected for b in result.bins] == pytest.approx([400.0, 200.0])


def test_accepts_numpy_inputs() -> None:
    result = chi_square_gof(np.array([50, 50]), np.array([0.5, 0.5]), alpha=0.05)
    assert result.passed and result.statistic == 0.0


def test_support_check_catches_sample_outside_support() -> None:
    probs = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    result = support_check(torch.tensor([49, 50, 1, 0]), probs, n=100, alpha=1e-3)
    assert not result.passed and result.outside == ((2, 1),)
    assert "outside the support" in result.message() and "token 2: 1" in result.message()
    ambiguous = torch.tensor([False, False, True, False])
    assert support_check(torch.tensor([49, 50, 1, 0]), probs, n=100, alpha=1e-3, ambiguous=ambiguous).passed


def test_support_check_catches_missing_high_probability_token() -> None:
    probs = torch.tensor([0.7, 0.2, 0.1, 1e-6], dtype=torch.float64)
    n = 1000
    result = support_check(torch.tensor([800, 200, 0, 0]), probs, n=n, alpha=1e-3)
    assert not result.passed
    assert [t for t, _, _ in result.missing] == [2]  # (0.9)^1000 ~ 2e-46; token 3 is not required
    assert "never drawn" in str(result)


def test_support_check_passes_on_true_samples() -> None:
    n = 5000
    assert support_check(draw_counts(TRUE, n, seed=3), TRUE, n=n, alpha=1e-3).passed


def test_alpha_budget() -> None:
    budget = AlphaBudget(tests=200)
    assert budget.total == 1e-3
    assert budget.per_test == pytest.approx(5e-6) == per_test_alpha(200)
    with pytest.raises(ValueError):
        AlphaBudget(tests=0)


def test_required_samples_matches_cohen_table() -> None:
    # Cohen (1988), Table 7.4.6: w = 0.3, df = 1, alpha = 0.05, power = 0.8 -> n = 87.
    assert abs(required_samples(0.3, df=1, alpha=0.05, power=0.8) - 87) <= 2


def test_required_samples_is_minimal_and_monotone() -> None:
    n = required_samples(0.1, df=10, alpha=1e-4, power=0.9)
    assert power(n, 0.1, 10, 1e-4) >= 0.9 > power(n - 1, 0.1, 10, 1e-4)
    sizes = [required_samples(w, df=5, alpha=1e-3) for w in (0.05, 0.1, 0.2, 0.4)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4


def test_detectable_effect_inverts_required_samples() -> None:
    w = detectable_effect(9789, df=31, alpha=1e-6, power=0.99)
    assert math.isclose(w, 0.1, rel_tol=1e-3)
    assert required_samples(w, 31, 1e-6, 0.99) <= 9789 < required_samples(w * 0.999, 31, 1e-6, 0.99)



def test_repeats_p_value_is_the_binomial_tail() -> None:
    # 3 pairs repeating with probability 1/2 each: P(>= 2 repeats) = 3/8 + 1/8.
    assert repeats_p_value(2, 3, 0.5) == pytest.approx(0.5)
    assert repeats_p_value(0, 3, 0.5) == 1.0
    assert repeats_p_value(500, 500, 0.9) == pytest.approx(0.9**500)
    with pytest.raises(ValueError):
        repeats_p_value(4, 3, 0.5)
