"""Op-level properties of the target's attention backend: prefill, extend and decode over drawn page tables, with
lengths each side of the tile edges up to 1024 tokens and scores up to past float32's exp overflow, against float64
attention (oracle/ops/attention.py). Marker ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops import attention
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


PAST_64 = "attention: a sequence past 64 tokens"
PAST_256 = "attention: a sequence past 256 tokens"
OVERFLOW = "attention: scores past float32's exp overflow"


@pytest.mark.parametrize("phase", ["prefill", "extend", "decode"])
@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({PAST_64: 0.3, PAST_256: 0.1, OVERFLOW: 0.2})
def test_attention(phase: str, data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(attention.attn_cases(op_bench.target.page_sizes, phase), label="case")
    exercised(PAST_64, max(case.lengths) > 64)
    exercised(PAST_256, max(case.lengths) > 256)
    exercised(OVERFLOW, case.score_max > 88.8)
    attention.check_attention(op_bench, case)
