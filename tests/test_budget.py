"""The property suite's budget: every chi-square has the power oracle.budget states, under ci and under deep."""

from __future__ import annotations

import pytest

from oracle.budget import DETECT_W, PLANS, PROPERTIES_ALPHA, detectable_w, stat_alpha
from oracle.stats import MAX_BUCKETS, power


@pytest.mark.parametrize("profile_examples", [25, 400], ids=["ci", "deep"])
def test_every_chi_square_detects_w_0_1_with_power_0_99(profile_examples: int) -> None:
    alpha = stat_alpha(profile_examples)
    assert alpha < PROPERTIES_ALPHA
    for plan in (p for p in PLANS if p.draws):
        assert detectable_w(plan, alpha) <= DETECT_W, plan
        assert power(plan.draws, DETECT_W, MAX_BUCKETS - 1, alpha) >= 0.99, plan


def test_more_examples_spend_less_alpha_per_check() -> None:
    assert stat_alpha(400) < stat_alpha(25) < stat_alpha(5)
