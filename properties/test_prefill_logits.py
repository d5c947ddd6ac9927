"""Property 2: prefill logits are within tolerance of HF transformers in float64.

The engine prefills a batch of prompts (lengths around page boundaries, random page sizes) and its logits for the
token after each prompt are compared with HF's float64 forward pass of that prompt alone.

Tolerance, per engine dtype (properties.checks.LOGIT_TOLERANCES, with the measurements behind them):
max |engine - ref| <= rel * max(1, max |ref|), rel = 5e-5 for float32 and 0.06 for bfloat16 (CPU bf16 runs here
too, on the tiny models, so the looser dtype is exercised as well).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from oracle.hf import HFOracle
from properties.budget import examples
from properties.checks import assert_logits_close, logit_tolerance
from properties.drive import TINY_ARCHS, TINY_VOCAB, EnginePool, run_requests
from properties.strategies import PAGE_SIZES, RequestSpec, batches, sampling_params


def check_prefill(engine: Engine, ref: HFOracle, specs: list[RequestSpec]) -> None:
    tol = logit_tolerance(engine.dtype)
    for i, (spec, gen) in enumerate(zip(specs, run_requests(engine, specs))):
        expected = ref.prefill_logits(spec.prompt)
        assert_logits_close(gen.logits[0], expected, tol, f"request {i} of {len(specs)}, prompt {list(spec.prompt)}")


@settings(max_examples=examples(1.0))
@given(data=st.data())
def test_prefill_logits_match_hf_tiny(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    arch = data.draw(st.sampled_from(TINY_ARCHS), label="arch")
    dtype = data.draw(st.sampled_from(("float32", "bfloat16")), label="dtype")
    page_size = data.draw(st.sampled_from(PAGE_SIZES), label="page_size")
    one_token = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.just(1))
    specs = data.draw(batches(TINY_VOCAB, 8, 64, page_size, one_token), label="requests")
    check_prefill(engines.get(tiny_models[arch], page_size, dtype), oracle(tiny_models[arch], torch.float64), specs)


@pytest.mark.model
@settings(max_examples=examples(0.08))
@given(data=st.data())
def test_prefill_logits_match_hf_smollm2(
    data: st.DataObject, smollm2: Path, engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    vocab = engines.get(smollm2).model_config.vocab_size
    one_token = sampling_params(vocab, greedy=True, max_tokens=st.just(1))
    specs = data.draw(batches(vocab, 3, 48, 1, one_token), label="requests")
    check_prefill(engines.get(smollm2), oracle(smollm2, torch.float64), specs)
