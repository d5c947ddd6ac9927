"""Op-level properties of the decode step's kernels: the greedy step (first argmax with exact ties, -1 on NaN,
+inf and all -inf rows, the rows' last tokens kept, the host payload) over vocabularies each side of the argmax
kernel's block and split edges, and the slot checks with their redirect over page tables with one planted fault
(a slot written twice, over cached or live KV, out of the pool, off its page). Marker ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops import step
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


TIE = "greedy_step: a tie at the max"
NOTHING = "greedy_step: a row with nothing to choose"
REFUSED = "slot_check: a batch the rules refuse"
ACCEPTED = "slot_check: a batch the rules accept"
TWICE = "slot_check: a slot written twice"


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({TIE: 0.3, NOTHING: 0.3})
def test_greedy_step(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.greedy_cases(), label="case")
    exercised(TIE, "tie" in case.kinds)
    exercised(NOTHING, bool({"nan", "posinf", "all_neginf"} & set(case.kinds)))
    step.check_greedy_step(op_bench, case)


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({REFUSED: 0.25, ACCEPTED: 0.2, TWICE: 0.05})
def test_slot_check(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.slot_cases(op_bench.target.page_sizes), label="case")
    refused = step.expected_slots(case)[2]
    exercised(REFUSED, refused)
    exercised(ACCEPTED, not refused)
    exercised(TWICE, case.fault == "duplicate" and refused)
    step.check_slot_check(op_bench, case)


PAST_TILE = "page_ids: a request with more pages than one 256-wide block of the kernel"


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({PAST_TILE: 0.1})
def test_page_ids(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.page_ids_cases(op_bench.target.page_sizes), label="case")
    exercised(PAST_TILE, max(case.counts) > 256)
    step.check_page_ids(op_bench, case)
