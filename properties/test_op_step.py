"""Op-level properties of the decode step's kernels: the input ids (pending tokens from the rows' last tokens, counts
each side of the kernel's blocks), a replay's hand-out (the batch's rows, logits upcast bit for bit, in tensors of their
own, vocabularies each side of the kernel's blocks), the greedy step (first argmax with exact ties, -1 on NaN, +inf and
all -inf rows, the rows' last tokens kept, the host payload) over vocabularies each side of the argmax kernel's block
and split edges, a sampled step's keep (-1 tokens kept as 0, the payload, tokens strided), and the slot checks with
their redirect over page tables with one planted fault (a slot written twice, over cached or live KV, out of the pool,
off its page), in a decode batch's layout (one new token each: the Triton check's two-launch path, whose flag one bench
carries from example to example) and in others. Marker ``kernel``.

Floors hold for random examples too (tests/test_random_floors.py): under ``deep`` the pending-and-packed batches are
30-36% of input_ids' examples (floor 20%), strided keeps of two or more tokens 18-32% with half the keeps strided (now
two in three; floor 15%), vocabularies past the hand-out's first block and off its multiples 58-72% (floor 30%)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops import step
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


SOME_PENDING = "input_ids: a batch with pending and packed tokens"
PAST_BLOCK = "input_ids: more tokens than one 1024-wide block of the kernel"
TIE = "greedy_step: a tie at the max"
SIXTEEN_BIT = "greedy_step: bfloat16 logits (a captured step's)"
NOTHING = "greedy_step: a row with nothing to choose"
NOTHING_SAMPLED = "keep_tokens: a row with nothing sampled (-1, kept as 0)"
STRIDED_TOKENS = "keep_tokens: two or more tokens in a strided view (a sampler plugin's)"
PAST_VOCAB_BLOCK = "hand_out: a vocabulary past one 4096-wide block of the kernel, not a multiple of it"
PADDED = "hand_out: padding rows left out (fewer batch rows than the graph's)"
LOGITS_MODE = "hand_out: no tokens (a logits-mode replay)"
REFUSED = "slot_check: a batch the rules refuse"
ACCEPTED = "slot_check: a batch the rules accept"
TWICE = "slot_check: a slot written twice"
ONE_EACH = "slot_check: one new token per request (a decode batch's layout)"
TWICE_ONE_EACH = "slot_check: two requests' one new tokens on one slot"


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({SOME_PENDING: 0.2, PAST_BLOCK: 0.2})
def test_input_ids(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.input_ids_cases(), label="case")
    packed = case.pending.numel() - int(case.pending.count_nonzero())
    exercised(SOME_PENDING, case.kind == "some" and packed > 0 and bool(case.pending.any()))
    exercised(PAST_BLOCK, len(case.ids) > 1024)
    step.check_input_ids(op_bench, case)


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({TIE: 0.3, NOTHING: 0.3, SIXTEEN_BIT: 0.3})
def test_greedy_step(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.greedy_cases(), label="case")
    exercised(SIXTEEN_BIT, case.logits.dtype == torch.bfloat16)
    exercised(TIE, "tie" in case.kinds)
    exercised(NOTHING, bool({"nan", "posinf", "all_neginf"} & set(case.kinds)))
    step.check_greedy_step(op_bench, case)


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({NOTHING_SAMPLED: 0.2, STRIDED_TOKENS: 0.15})
def test_keep_tokens(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.keep_cases(), label="case")
    exercised(NOTHING_SAMPLED, bool((case.tokens < 0).any()))
    exercised(STRIDED_TOKENS, case.tokens_gap > 0 and len(case.tokens) > 1)
    step.check_keep_tokens(op_bench, case)


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({PAST_VOCAB_BLOCK: 0.3, PADDED: 0.3, LOGITS_MODE: 0.2})
def test_hand_out(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.hand_out_cases(), label="case")
    vocab = case.logits.shape[1]
    exercised(PAST_VOCAB_BLOCK, vocab > step.HAND_OUT_EDGES[0] and vocab % step.HAND_OUT_EDGES[0] != 0)
    exercised(PADDED, case.n < case.logits.shape[0])
    exercised(LOGITS_MODE, case.tokens is None)
    step.check_hand_out(op_bench, case)


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({REFUSED: 0.25, ACCEPTED: 0.2, TWICE: 0.05, ONE_EACH: 0.25, TWICE_ONE_EACH: 0.04})
def test_slot_check(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.slot_cases(op_bench.target.page_sizes), label="case")
    refused = step.expected_slots(case)[2]
    one_each = all(d - c == 1 for c, d in zip(case.cached, case.device_len))
    exercised(REFUSED, refused)
    exercised(ACCEPTED, not refused)
    exercised(TWICE, case.fault == "duplicate" and refused)
    exercised(ONE_EACH, one_each)
    exercised(TWICE_ONE_EACH, one_each and case.fault == "duplicate" and refused and len(case.rows) > 1)
    step.check_slot_check(op_bench, case)


PAST_TILE = "page_ids: a request with more pages than one 256-wide block of the kernel"


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors({PAST_TILE: 0.1})
def test_page_ids(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(step.page_ids_cases(op_bench.target.page_sizes), label="case")
    exercised(PAST_TILE, max(case.counts) > 256)
    step.check_page_ids(op_bench, case)
