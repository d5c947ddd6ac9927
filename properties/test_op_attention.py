"""Op-level properties of the target's attention backend: prefill, extend and decode over drawn page tables, with
lengths each side of the tile edges up to 1024 tokens and scores up to past float32's exp overflow, against float64
attention (oracle/ops/attention.py). Marker ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised
from oracle.ops import attention
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


def _floors(case: attention.AttnCase) -> None:
    exercised("attention: a sequence past 64 tokens", max(case.lengths) > 64, 0.3)
    exercised("attention: a sequence past 256 tokens", max(case.lengths) > 256, 0.1)
    exercised("attention: scores past float32's exp overflow", case.score_max > 88.8, 0.2)


@pytest.mark.parametrize("phase", ["prefill", "extend", "decode"])
@settings(max_examples=examples(1.0))
@given(data=st.data())
def test_attention(phase: str, data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(attention.attn_cases(op_bench.target.page_sizes, phase), label="case")
    _floors(case)
    attention.check_attention(op_bench, case)
