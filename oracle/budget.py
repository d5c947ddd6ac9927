"""Budgets of the property suite: examples per test, and the false-failure (α) budget of statistical checks.

Examples: every test asks for a share of the active profile's max_examples (examples()), so `ci`, `deep` and
`dev` scale the whole suite together while the expensive properties (HF generate, many engine runs per example)
run fewer examples than the cheap ones.

α: a CI run must fail by chance with probability <= oracle.stats.FAMILY_ALPHA (1e-3) in total. properties/ spends
half of it (PROPERTIES_ALPHA); tests/ keeps the other half. Each statistical check below declares how many checks
one example may run; the per-check α is PROPERTIES_ALPHA split evenly (Bonferroni) over the most checks the
active profile can run, so by the union bound the suite fails a correct engine with probability <= 5e-4,
whatever the dependence between checks. A test that fails or is deselected only makes the bound looser.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings

from oracle.stats import FAMILY_ALPHA, AlphaBudget

PROPERTIES_ALPHA = FAMILY_ALPHA / 2


def examples(share: float) -> int:
    """max_examples for one test: `share` of the active profile's, at least 1."""
    return max(1, round(settings().max_examples * share))


@dataclass(frozen=True)
class StatPlan:
    """One statistical test function: its example count and the most checks an example runs."""

    examples: int
    checks_per_example: int


# Rows per example of the sampling properties; every sampled row runs a chi-square test and a support check.
SYNTHETIC_ROWS = 4
MODEL_ROWS = 3

SAMPLING_SYNTHETIC = StatPlan(examples(2.0), 2 * SYNTHETIC_ROWS)
SAMPLING_MODEL = StatPlan(examples(0.8), 2 * MODEL_ROWS)
SEEDED_DISTINCT = StatPlan(examples(0.8), 1)  # identical draws from two seeds, at most once per example
SEEDED_POSITIONS = StatPlan(examples(0.6), 3)  # a seeded row along positions: support, chi-square, repeats

_PLANS = (SAMPLING_SYNTHETIC, SAMPLING_MODEL, SEEDED_DISTINCT, SEEDED_POSITIONS)
STAT_ALPHA = AlphaBudget(tests=sum(p.examples * p.checks_per_example for p in _PLANS), total=PROPERTIES_ALPHA).per_test
"""α of each statistical check in properties/ under the active profile."""
