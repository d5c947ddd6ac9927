"""Property 3: decode ≡ teacher-forced prefill.

The engine generates (greedy, seeded or unseeded sampling, batched, under random page layouts) and records the
logits of every step. HF float64 then runs the full sequence (prompt + generated tokens) in one forward pass;
its logits at the position before each generated token must match the engine's logits of that step. So every
decode step, reading the KV cache written by the prefill and by earlier decode steps, computes what one full
prefill computes.

Tolerance: the float32 logit bound of oracle.tolerance (rel 5e-5 of the row's largest |logit|), the same as for
prefill: KV read back from the cache is bit-for-bit what was written, so decoding adds no error of its own.

Bug classes: decode positions or KV lengths off by one (rope_off_by_one, decode_kv_len_off_by_one), a batched decode
of requests of different lengths without the key mask, so the shorter ones attend to padding (decode_keys_unmasked).
Vacuity floors: every example decodes 2+ requests for 2+ steps (90%: a decode step reads KV an earlier decode step
wrote), and in 60% of examples their lengths differ (equal lengths, the unmasked path, keep the rest). In a minority
of the examples one long request at a kernel tile or page edge (oracle.drive.add_long_request) makes decode steps
read KV across a partial last tile: at least 15% of examples pass 64 tokens, 5% pass 256 (record_lengths).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.checks import assert_logits_close
from oracle.coverage import exercised, floors
from oracle.drive import (
    LENGTH_FLOORS,
    TINY_VOCAB,
    EnginePool,
    add_long_request,
    continuous_archs,
    record_lengths,
    run_requests,
)
from oracle.hf import HFOracle
from oracle.strategies import batches, layouts, sampling_params, seeds
from oracle.tolerance import logit_tolerance

DECODE_READS_DECODE = "a decode step reads KV an earlier decode step wrote"
MIXED_LENGTHS = "requests of different lengths decode in one batch"


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({DECODE_READS_DECODE: 0.9, MIXED_LENGTHS: 0.6, **LENGTH_FLOORS})
def test_decode_matches_teacher_forced_prefill(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    layout = data.draw(layouts(TINY_VOCAB, engines.target.page_sizes), label="layout")
    # 2+ requests with 2+ decode steps each: decode reads KV of earlier decode steps, in batches of mixed lengths.
    params = sampling_params(TINY_VOCAB, max_tokens=st.integers(3, 16))
    specs = data.draw(batches(TINY_VOCAB, 4, 48, layout.page_size, params, min_size=2), label="requests")
    specs, max_seq_len = add_long_request(data, specs, layout.page_size, params)
    record_lengths(specs)
    exercised(DECODE_READS_DECODE, any(s.params.max_tokens > 2 for s in specs))
    lengths = {len(s.prompt) for s in specs}
    exercised(MIXED_LENGTHS, len(lengths) > 1)
    engine = engines.get(tiny_models[arch], layout.page_size, max_seq_len=max_seq_len)
    gens = run_requests(engine, specs, layout, sampler_seed=data.draw(seeds, label="sampler_seed"))
    tol = logit_tolerance(engine.dtype)
    for i, (spec, gen) in enumerate(zip(specs, gens)):
        forced = oracle(tiny_models[arch]).teacher_forced_logits([*spec.prompt, *gen.output_ids])
        start = len(spec.prompt) - 1
        for step, row in enumerate(gen.logits):
            assert_logits_close(
                row, forced[start + step], tol, f"request {i}, step {step} (position {start + step}), {spec.params}"
            )
