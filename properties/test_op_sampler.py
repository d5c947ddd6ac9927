"""Op-level properties of the target's sampler: filtered distributions over vocabularies each side of the block
edges (exact support, bounded probabilities) and seeded draws that depend on (seed, position) alone, seeds equal
modulo 2**32 included (oracle/ops/sampler.py; three in four seed pairs are such twins, 58-74% of examples under
``deep`` with two in three, floor 50%). Marker ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops import sampler
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel

SAMPLED = "sampler probs: a sampled row (not greedy)"
TWINS = "sampler seeded draw: seeds equal modulo 2**32"


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({SAMPLED: 0.8})
def test_sampler_probs(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(sampler.probs_cases(), label="case")
    exercised(SAMPLED, any(p.temperature > 0 for p in case.params))
    sampler.check_sampler_probs(op_bench, case)


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({TWINS: 0.5})
def test_seeded_draws(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(sampler.seed_cases(), label="case")
    exercised(TWINS, (case.other - case.seed) % 2**32 == 0)
    sampler.check_seeded_draws(op_bench, case)
