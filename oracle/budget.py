"""Budgets of the property suite: examples per test, the false-failure (α) budget of statistical checks, and the
power those checks must have.

Examples: every test asks for a share of the active profile's max_examples (examples()), so `ci`, `deep` and
`dev` scale the whole suite together while the expensive properties (HF generate, many engine runs per example)
run fewer examples than the cheap ones.

α: a CI run must fail by chance with probability <= oracle.stats.FAMILY_ALPHA (1e-3) in total. properties/ spends
half of it (PROPERTIES_ALPHA); tests/ keeps the other half. Each statistical check below declares how many checks
one example may run; the per-check α is PROPERTIES_ALPHA split evenly (Bonferroni) over the most checks the
active profile can run, so by the union bound the suite fails a correct engine with probability <= 5e-4,
whatever the dependence between checks. A test that fails or is deselected only makes the bound looser.

Power: every chi-square of properties/ draws CHI_SQUARE_DRAWS samples, so at its α and df <= 31 (oracle.stats'
MAX_BUCKETS) it detects an effect of Cohen's w = DETECT_W (0.1) with probability >= DETECT_POWER (0.99), under `ci`
and `deep` alike (tests/test_budget.py checks both); detectable_w() gives the exact smallest w.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings

from oracle.stats import FAMILY_ALPHA, MAX_BUCKETS, AlphaBudget, detectable_effect

PROPERTIES_ALPHA = FAMILY_ALPHA / 2


DETECT_W = 0.1
DETECT_POWER = 0.99
CHI_SQUARE_DRAWS = 12_000


def examples(share: float, max_examples: int | None = None) -> int:
    """max_examples for one test: `share` of the active profile's (or of `max_examples`), at least 1."""
    return max(1, round((settings().max_examples if max_examples is None else max_examples) * share))


@dataclass(frozen=True)
class StatPlan:
    """One statistical test function: its share of examples, the most checks an example runs, and the draws behind
    each chi-square (0: it runs none)."""

    share: float
    checks_per_example: int
    draws: int = 0

    @property
    def examples(self) -> int:
        return examples(self.share)


# Rows per example of the sampling properties; every sampled row runs a chi-square test and a support check.
SYNTHETIC_ROWS = 4
MODEL_ROWS = 3

SAMPLING_SYNTHETIC = StatPlan(2.0, 2 * SYNTHETIC_ROWS, CHI_SQUARE_DRAWS)
SAMPLING_MODEL = StatPlan(0.8, 2 * MODEL_ROWS, CHI_SQUARE_DRAWS)
SEEDED_DISTINCT = StatPlan(0.8, 1)  # identical draws from two seeds, at most once per example
SEEDED_POSITIONS = StatPlan(0.6, 3, CHI_SQUARE_DRAWS)  # a seeded row along positions: support, chi-square, repeats

PLANS = (SAMPLING_SYNTHETIC, SAMPLING_MODEL, SEEDED_DISTINCT, SEEDED_POSITIONS)


def stat_alpha(max_examples: int | None = None) -> float:
    """α of each statistical check in properties/ under a profile of `max_examples` (default: the active one)."""
    checks = sum(examples(p.share, max_examples) * p.checks_per_example for p in PLANS)
    return AlphaBudget(tests=checks, total=PROPERTIES_ALPHA).per_test


STAT_ALPHA = stat_alpha()
"""α of each statistical check in properties/ under the active profile."""


def detectable_w(plan: StatPlan, alpha: float = STAT_ALPHA) -> float:
    """The smallest Cohen's w the plan's chi-square detects with DETECT_POWER at `alpha` (any row: df <= 31)."""
    return detectable_effect(plan.draws, MAX_BUCKETS - 1, alpha, DETECT_POWER)
