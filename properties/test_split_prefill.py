"""Property 6: split prefill ≡ single prefill.

Each request's prompt is prefilled in 1..4 chunks (extend steps with cached_len > 0), optionally further cut by a
per-step prefill token budget (max_prefill_tokens), under a random page layout; the same requests then run with
one-shot prefill and the contiguous layout. Every recorded step (the logits after the last chunk, then each decode
step) must agree.

Tolerance: the float32 logit bound of oracle.tolerance (rel 5e-5); the chunked run computes the earlier tokens' KV
in smaller matmuls, which may round differently, so bitwise equality is reported as an event, not required.
Greedy tokens must be identical up to a near-tie (vLLM rule).

Bug classes: an extend computed at the wrong positions (a later chunk's RoPE positions restarting at 0, mutant
extend_positions_restart) or with a shifted causal diagonal (causal_mask_off_by_one_extend). Vacuity floor: at least
90% of examples extend a cached prefix (requests are cut into 2+ chunks where the prompt allows). In a minority of
the examples one long request at a kernel tile or page edge (oracle.drive.add_long_request) has chunks that end
inside a tile and extends that attend across several: at least 15% of examples pass 64 tokens, 5% pass 256
(record_lengths).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.checks import assert_logits_close, compare_greedy
from oracle.coverage import exercised, floors
from oracle.drive import (
    LENGTH_FLOORS,
    MAX_SEQ_LEN,
    TINY_VOCAB,
    EnginePool,
    add_long_request,
    continuous_archs,
    record_lengths,
    run_requests,
)
from oracle.strategies import RequestSpec, batches, layouts, sampling_params
from oracle.tolerance import logit_tolerance

EXTENDED = "a prefill extends a cached prefix (cached_len > 0)"


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({EXTENDED: 0.9, **LENGTH_FLOORS})
def test_split_prefill_matches_single_prefill(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    layout = data.draw(layouts(TINY_VOCAB, engines.target.page_sizes, max_churn=1), label="layout")
    greedy = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(1, 6))
    specs = data.draw(batches(TINY_VOCAB, 3, 48, layout.page_size, greedy, split=True, min_chunks=2), label="requests")
    specs, max_seq_len = add_long_request(data, specs, layout.page_size, greedy, split=True, min_chunks=2)
    record_lengths(specs)
    # A long prompt under a budget of a few tokens would take hundreds of steps; 24..96 still cuts it mid-tile.
    budgets = st.integers(1, 24) if max_seq_len == MAX_SEQ_LEN else st.integers(24, 96)
    budget = data.draw(st.none() | budgets, label="max_prefill_tokens")
    # A prompt cut into chunks, or longer than the per-step budget, is prefilled over several steps.
    extended = any(len(s.chunk_sizes) > 1 or (budget is not None and len(s.prompt) > budget) for s in specs)
    exercised(EXTENDED, extended)
    engine = engines.get(tiny_models[arch], layout.page_size, max_seq_len=max_seq_len)
    split = run_requests(engine, specs, layout, max_prefill_tokens=budget)
    single = run_requests(engine, [RequestSpec(s.prompt, s.params) for s in specs])
    tol = logit_tolerance(engine.dtype)
    bitwise = True
    for i, (ours, ref) in enumerate(zip(split, single)):
        result = compare_greedy(ours.output_ids, ours.logits, ref.output_ids, ref.logits, tol)
        assert result.ok, f"request {i}, chunks {specs[i].chunk_sizes}, budget {budget}: {result.failure}"
        for step, (a, b) in enumerate(list(zip(ours.logits, ref.logits))[: result.compared]):
            assert_logits_close(a, b, tol, f"request {i}, chunks {specs[i].chunk_sizes}, budget {budget}, step {step}")
            bitwise &= torch.equal(a, b)
    event(f"split logits bitwise equal to single prefill: {bitwise}")
