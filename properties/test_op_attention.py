"""Op-level properties of the target's attention backend: prefill, extend and decode over drawn page tables, with
lengths each side of the tile edges up to 1024 tokens and scores up to past float32's exp overflow, against float64
attention; and, where the backend norms, rotates and stores a decode step's new tokens itself, that too
(oracle/ops/attention.py). Marker ``kernel``."""

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


NORMED = "attention with its new tokens: a q/k norm before RoPE"
TAKEN = "attention with its new tokens: the backend took them"


@settings(max_examples=examples(0.5))
@given(data=st.data())
@floors({PAST_64: 0.3, NORMED: 0.3, TAKEN: 0.4})
def test_attention_with_new_tokens(data: st.DataObject, op_bench: Bench) -> None:
    if not attention.fuses_new_tokens(op_bench):
        pytest.skip(f"not tested: {op_bench.target.name}'s attention leaves the new tokens to the layer kernels")
    case = data.draw(attention.attn_cases(op_bench.target.page_sizes, "decode", attention.LONE_OR_FEW), label="case")
    normed = data.draw(st.booleans(), label="q/k norm")
    exercised(PAST_64, max(case.lengths) > 64)
    exercised(NORMED, normed)
    exercised(TAKEN, attention.check_attention_new_tokens(op_bench, case, normed))
