"""Statistical tests comparing an engine's samples with a reference distribution.

* :func:`chi_square_gof`: Pearson chi-square goodness of fit, with small bins pooled and
  excluded (ambiguous) tokens dropped; see its docstring for the exact rules.
* :func:`support_check`: no sample outside the support, and every token that is all but
  certain to appear does appear.
* :func:`repeats_p_value`: whether successive draws repeat more often than independent draws would.
* :class:`AlphaBudget` / :func:`per_test_alpha`: a family-wise false-failure budget (<= 1e-3 per
  CI run) split over all statistical test invocations by Bonferroni.
* :func:`power` / :func:`required_samples`: sample sizes from the noncentral chi-square.

The reasoning, and a table of sample sizes, is in ``docs/statistics.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import torch
from scipy import stats as sps

FAMILY_ALPHA = 1e-3
"""Family-wise probability that one full CI run fails although the engine is correct."""

MIN_EXPECTED = 5.0
"""Cochran's rule: a chi-square bucket needs an expected count of about 5; smaller ones are pooled."""

MAX_BUCKETS = 32
"""A chi-square keeps at most this many buckets (df <= 31), so its power at a given n is known for every row."""

ArrayLike: TypeAlias = torch.Tensor | npt.NDArray[Any]

_WORST_SHOWN = 8  # bins listed in a failure message


def _to_numpy(x: ArrayLike) -> npt.NDArray[Any]:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {arr.shape}")
    return arr


def _counts_and_probs(
    counts: ArrayLike, probs: ArrayLike, mask: ArrayLike | None
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    c = _to_numpy(counts).astype(np.int64)
    p = _to_numpy(probs).astype(np.float64)
    m = np.zeros(len(p), dtype=np.bool_) if mask is None else _to_numpy(mask).astype(np.bool_)
    if not (len(c) == len(p) == len(m)):
        raise ValueError(f"length mismatch: counts {len(c)}, probs {len(p)}, mask {len(m)}")
    if (c < 0).any():
        raise ValueError("counts must be non-negative")
    if not np.isfinite(p).all() or (p < 0).any():
        raise ValueError("probs must be finite and non-negative")
    return c, p, m


@dataclass(frozen=True)
class Bin:
    """One chi-square bucket: a single token, or several pooled tokens (``token`` is then None)."""

    token: int | None
    size: int
    observed: int
    expected: float

    @property
    def contribution(self) -> float:
        return (self.observed - self.expected) ** 2 / self.expected

    @property
    def label(self) -> str:
        return f"token {self.token}" if self.token is not None else f"pooled({self.size} tokens)"


@dataclass(frozen=True)
class ChiSquareResult:
    """Outcome of :func:`chi_square_gof`. ``n`` counts the samples tested (after dropping)."""

    statistic: float
    df: int
    p_value: float
    alpha: float
    n: int
    bins: tuple[Bin, ...]
    dropped: int  # samples on excluded or zero-probability tokens, left out of the test
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    def message(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        head = (
            f"chi-square {verdict}: statistic={self.statistic:.4g}, df={self.df}, "
            f"p={self.p_value:.3g} (alpha={self.alpha:.3g}), n={self.n}, dropped={self.dropped}"
        )
        if self.note:
            head += f" [{self.note}]"
        worst = sorted(self.bins, key=lambda b: b.contribution, reverse=True)[:_WORST_SHOWN]
        lines = [head]
        if worst and not self.passed:
            lines.append("worst bins (observed vs expected, contribution):")
            lines += [
                f"  {b.label}: observed={b.observed} expected={b.expected:.2f} contribution={b.contribution:.3g}"
                for b in worst
            ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.message()


def chi_square_gof(
    counts: ArrayLike,
    probs: ArrayLike,
    alpha: float,
    exclude: ArrayLike | None = None,
    min_expected: float = MIN_EXPECTED,
    max_buckets: int = MAX_BUCKETS,
) -> ChiSquareResult:
    """Pearson chi-square test that ``counts`` (per token) were drawn from ``probs``.

    Rules, in order:

    1. Excluded tokens (the oracle's ambiguous mask) and tokens with ``probs == 0`` are dropped:
       both their observed and expected counts leave the test, the expected distribution is
       renormalized over the remaining tokens and ``n`` shrinks to the samples that fell on them.
       This tests the distribution *conditional on* landing on a clear token, which is exactly what
       an ambiguous decision cannot change (flipping it only rescales the other tokens). Pooling
       excluded tokens into a bucket of their own would instead test their reference mass, which
       is the one quantity we do not trust. Samples outside the support are the business of
       :func:`support_check`.
    2. Tokens whose expected count is below ``min_expected`` are pooled into one remainder bucket;
       if that bucket's expected count is itself below ``min_expected`` it is merged into the kept
       bin with the smallest expected count. Then, while more than ``max_buckets`` remain, the
       smallest-expected buckets are pooled into one, so ``df <= max_buckets - 1`` and the power
       stated for that df holds for any row (fine per-token support errors are the exact checks'
       business). Pooling looks only at expected counts, never at the observations, so the
       chi-square null distribution is unaffected.
    3. Expected counts are rescaled in float64 to sum to the tested total (up to rounding);
       ``df = buckets - 1``. A single bucket (all mass on one token, or no samples left) leaves
       nothing to test: the result passes with ``df = 0`` and says so in ``note``.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r} must lie in (0, 1)")
    if max_buckets < 2:
        raise ValueError(f"max_buckets={max_buckets!r} must be >= 2")
    c, p, excluded = _counts_and_probs(counts, probs, exclude)
    tested = ~excluded & (p > 0)
    n = int(c[tested].sum())
    dropped = int(c.sum()) - n
    tokens = np.flatnonzero(tested)
    if n == 0 or len(tokens) == 0:
        return ChiSquareResult(0.0, 0, 1.0, alpha, n, (), dropped, "no samples on tested tokens: trivially passed")

    expected = p[tokens] / p[tokens].sum() * n
    big = expected >= min_expected
    bins = [Bin(int(t), 1, int(c[t]), float(e)) for t, e in zip(tokens[big], expected[big], strict=True)]
    small = tokens[~big]
    if len(small):
        rest = Bin(None, len(small), int(c[small].sum()), float(expected[~big].sum()))
        if rest.expected >= min_expected or not bins:
            bins.append(rest)
        else:
            i = min(range(len(bins)), key=lambda j: bins[j].expected)
            b = bins[i]
            bins[i] = Bin(None, b.size + rest.size, b.observed + rest.observed, b.expected + rest.expected)
    if len(bins) > max_buckets:
        bins.sort(key=lambda b: b.expected)
        cut = len(bins) - max_buckets + 1
        pooled = bins[:cut]
        bins = [Bin(None, sum(b.size for b in pooled), sum(b.observed for b in pooled),
                    math.fsum(b.expected for b in pooled)), *bins[cut:]]
    if len(bins) == 1:
        return ChiSquareResult(
            0.0, 0, 1.0, alpha, n, tuple(bins), dropped, "single bucket: nothing to test, trivially passed"
        )
    statistic = math.fsum(b.contribution for b in bins)
    df = len(bins) - 1
    p_value = float(sps.chi2.sf(statistic, df))
    return ChiSquareResult(statistic, df, p_value, alpha, n, tuple(bins), dropped)


@dataclass(frozen=True)
class SupportResult:
    """Outcome of :func:`support_check`.

    ``outside`` lists ``(token, count)`` for samples on zero-probability, non-ambiguous tokens;
    ``missing`` lists ``(token, prob, miss_prob)`` for required tokens never drawn.
    """

    n: int
    alpha: float
    required: int
    outside: tuple[tuple[int, int], ...]
    missing: tuple[tuple[int, float, float], ...]

    @property
    def passed(self) -> bool:
        return not self.outside and not self.missing

    def message(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"support check {verdict}: n={self.n}, alpha={self.alpha:.3g}, {self.required} tokens required"]
        if self.outside:
            lines.append("samples outside the support (token: count):")
            lines += [f"  token {t}: {k}" for t, k in self.outside[:_WORST_SHOWN]]
            if len(self.outside) > _WORST_SHOWN:
                lines.append(f"  ... and {len(self.outside) - _WORST_SHOWN} more tokens")
        if self.missing:
            lines.append("required tokens never drawn (token: prob, P(miss by chance)):")
            lines += [f"  token {t}: p={q:.4g}, P(miss)={m:.3g}" for t, q, m in self.missing[:_WORST_SHOWN]]
            if len(self.missing) > _WORST_SHOWN:
                lines.append(f"  ... and {len(self.missing) - _WORST_SHOWN} more tokens")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.message()


def support_check(
    counts: ArrayLike, probs: ArrayLike, n: int, alpha: float, ambiguous: ArrayLike | None = None
) -> SupportResult:
    """Check that samples stay inside the support and that near-certain tokens show up.

    A sample on a token with ``probs == 0`` that is not ambiguous fails outright (no false failures
    possible). For missing tokens, with ``m`` samples on clear tokens each clear token ``t`` has
    conditional probability ``q_t = p_t / sum(clear p)`` and misses with probability
    ``(1 - q_t)^m``. Tokens are required in order of increasing miss probability while the *sum* of
    those probabilities stays <= ``alpha``, so by the union bound a correct sampler fails this part
    with probability <= ``alpha`` (a per-token ``(1-q)^m < alpha`` rule would not bound the family).
    Conditioning on clear tokens makes the check immune to how ambiguous decisions fall.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r} must lie in (0, 1)")
    c, p, amb = _counts_and_probs(counts, probs, ambiguous)
    if int(c.sum()) != n:
        raise ValueError(f"counts sum to {int(c.sum())}, expected n={n}")
    out_mask = (p == 0) & ~amb & (c > 0)
    outside = tuple((int(t), int(c[t])) for t in np.flatnonzero(out_mask))

    clear = ~amb & (p > 0)
    m = int(c[clear].sum())
    tokens = np.flatnonzero(clear)
    missing: list[tuple[int, float, float]] = []
    required = 0
    if m > 0 and len(tokens):
        q = p[tokens] / p[tokens].sum()
        # exp(m * log1p(-q)) keeps precision for tiny q; q == 1 gives exactly 0.
        with np.errstate(divide="ignore"):
            miss = np.exp(m * np.log1p(-q))
        order = np.argsort(miss, kind="stable")
        required = int(np.searchsorted(np.cumsum(miss[order]), alpha, side="right"))
        for i in order[:required]:
            t = int(tokens[i])
            if c[t] == 0:
                missing.append((t, float(p[t]), float(miss[i])))
    return SupportResult(n, alpha, required, outside, tuple(missing))


def repeats_p_value(repeats: int, pairs: int, collision: float) -> float:
    """P(at least ``repeats`` of ``pairs`` disjoint pairs of draws are equal) when the draws are independent.

    Two independent draws from q are equal with probability ``collision`` = sum_i q_i^2, so the count of equal
    pairs is Binomial(pairs, collision): a small value says the draws of a pair share their randomness.
    """
    if not 0 <= repeats <= pairs or not 0.0 <= collision <= 1.0:
        raise ValueError(f"invalid arguments repeats={repeats}, pairs={pairs}, collision={collision}")
    return float(sps.binom.sf(repeats - 1, pairs, collision))


def per_test_alpha(n_tests: int, family_alpha: float = FAMILY_ALPHA) -> float:
    """Bonferroni share of ``family_alpha`` for one of ``n_tests`` statistical test invocations."""
    if n_tests < 1:
        raise ValueError(f"n_tests={n_tests!r} must be >= 1")
    if not 0.0 < family_alpha < 1.0:
        raise ValueError(f"family_alpha={family_alpha!r} must lie in (0, 1)")
    return family_alpha / n_tests


@dataclass(frozen=True)
class AlphaBudget:
    """Family-wise false-failure budget for one CI run, split evenly (Bonferroni) over ``tests``.

    ``tests`` counts every statistical test invocation planned in the run (each chi-square and each
    support check on each example). If each uses ``per_test``, the probability that a correct
    engine fails any of them is <= ``total`` by the union bound, whatever their dependence.
    """

    tests: int
    total: float = FAMILY_ALPHA

    def __post_init__(self) -> None:
        per_test_alpha(self.tests, self.total)  # validates both fields

    @property
    def per_test(self) -> float:
        return per_test_alpha(self.tests, self.total)


def _power(n: int, w: float, df: int, alpha: float) -> float:
    critical = sps.chi2.isf(alpha, df)
    return float(sps.ncx2.sf(critical, df, n * w * w))


def power(n: int, w: float, df: int, alpha: float) -> float:
    """Power of the chi-square test with ``n`` samples against Cohen's effect size ``w``.

    ``w^2 = sum_i (p1_i - p0_i)^2 / p0_i``; under the alternative the statistic is approximately
    noncentral chi-square with ``df`` degrees of freedom and noncentrality ``n w^2``.
    """
    if n < 0 or w < 0 or df < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"invalid arguments n={n}, w={w}, df={df}, alpha={alpha}")
    return _power(n, w, df, alpha)


def required_samples(w: float, df: int, alpha: float, power: float = 0.9) -> int:
    """Smallest ``n`` whose chi-square test at level ``alpha`` detects effect ``w`` with ``power``."""
    if w <= 0 or df < 1 or not 0.0 < alpha < 1.0 or not alpha < power < 1.0:
        raise ValueError(f"invalid arguments w={w}, df={df}, alpha={alpha}, power={power}")
    # Power grows monotonically with n: double to bracket, then bisect.
    hi = 1
    while _power(hi, w, df, alpha) < power:
        hi *= 2
    lo = hi // 2  # power(lo) < target, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _power(mid, w, df, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


def detectable_effect(n: int, df: int, alpha: float, power: float = 0.99) -> float:
    """Smallest Cohen's ``w`` that the chi-square test with ``n`` samples detects with ``power`` at ``alpha``."""
    if n < 1 or df < 1 or not 0.0 < alpha < 1.0 or not alpha < power < 1.0:
        raise ValueError(f"invalid arguments n={n}, df={df}, alpha={alpha}, power={power}")
    lo, hi = 0.0, 1.0
    while _power(n, hi, df, alpha) < power:
        hi *= 2
    for _ in range(60):  # bisection to ~1e-18 relative: power is monotone in w
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _power(n, mid, df, alpha) >= power else (mid, hi)
    return hi

