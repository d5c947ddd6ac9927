"""Op-level properties of the decode step's kernels: the greedy step (first argmax with exact ties, -1 on NaN,
+inf and all -inf rows, the rows' last tokens kept, the host payload) over vocabularies each side of the argmax
kernel's block and split edges, and the slot checks with their redirect over page tables with one planted fault
(a slot written twice, over cached or live KV, out of the pool, off its page). Marker ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised
from oracle.ops import step
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


@settings(max_examples=examples(2.0))
@given(data=st.data())
def test_greedy_step(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.greedy_cases(), label="case")
    exercised("greedy_step: a tie at the max", "tie" in case.kinds, 0.3)
    exercised("greedy_step: a row with nothing to choose", bool({"nan", "posinf", "all_neginf"} & set(case.kinds)),
              0.3)
    step.check_greedy_step(op_bench, case)


@settings(max_examples=examples(4.0))
@given(data=st.data())
def test_slot_check(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.slot_cases(op_bench.target.page_sizes), label="case")
    refused = step.expected_slots(case)[2]
    exercised("slot_check: a batch the rules refuse", refused, 0.25)
    exercised("slot_check: a batch the rules accept", not refused, 0.2)
    exercised("slot_check: a slot written twice", case.fault == "duplicate" and refused, 0.05)
    step.check_slot_check(op_bench, case)
