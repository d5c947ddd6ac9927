"""Negative controls: a catalogue of bugs real engines shipped, and the harness must catch every one.

Each :class:`Mutant` is a reversible monkeypatch of one engine function (see :mod:`oracle.mutants.catalogue`),
plus the pytest targets that should kill it. ``python -m oracle.mutants`` runs each mutant's targets in a fresh
pytest process with the mutant active (via the :mod:`oracle.mutants.plugin` plugin and ``$ENGINE_MUTANT``) and
prints a kill table; ``with activate("top_p_off_by_one"): ...`` applies one in-process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from . import catalogue as c


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the patched engine does wrong
    seen: str  # where this bug class shipped (a public fix), so the catalogue is not made up
    patch: c.Patch
    # pytest arguments: `targets` for the full run (the properties and tests that should kill it), `fast` for the
    # CI configuration (the cheapest killers, run with -x under the dev Hypothesis profile).
    targets: tuple[str, ...]
    fast: tuple[str, ...]


_SAMPLER_TESTS = "tests/test_sampler.py"
_MODEL_TESTS = "tests/test_models.py"
_KV_TESTS = "tests/test_kvcache.py"

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "top_p_off_by_one",
            "top-p masks on the inclusive cumulative mass, so the token that crosses p is dropped",
            "ggml-org/llama.cpp#1953, Biohub/esm#360, fishaudio/fish-speech#1171",
            c.top_p_off_by_one,
            (_SAMPLER_TESTS,),
            (f"{_SAMPLER_TESTS}::test_top_p_keeps_only_the_top_token_when_it_exceeds_p",),
        ),
        Mutant(
            "top_k_after_top_p",
            "top-p runs on the full distribution and top-k after it (HF applies top-k first, then renormalizes)",
            "llama.cpp/vLLM sampler-order discussions; joint vs sequential order in FlashInfer",
            c.top_k_after_top_p,
            (_SAMPLER_TESTS,),
            (_SAMPLER_TESTS,),
        ),
        Mutant(
            "temperature_after_softmax",
            "temperature divides probabilities after softmax; renormalizing cancels it, so T is ignored",
            "ggml-org/llama.cpp#7498 (temperature applied at a different stage than the filters)",
            c.temperature_after_softmax,
            (_SAMPLER_TESTS,),
            (_SAMPLER_TESTS,),
        ),
        Mutant(
            "min_p_wrong_max",
            "the min-p threshold scales the max of the raw softmax instead of the tempered distribution",
            "state-spaces/mamba#1010 (min-p threshold from the wrong maximum)",
            c.min_p_wrong_max,
            (_SAMPLER_TESTS,),
            (_SAMPLER_TESTS,),
        ),
        Mutant(
            "greedy_rows_sampled",
            "in a batch mixing greedy and sampled rows, greedy rows are sampled too",
            "FlashML-org/FreeToken#471, vllm-project/vllm-ascend#16430",
            c.greedy_rows_sampled,
            (_SAMPLER_TESTS,),
            (f"{_SAMPLER_TESTS}::test_greedy_rows_in_a_mixed_batch_are_argmax",),
        ),
        Mutant(
            "seed_ignored",
            "per-request seeds are dropped: seeded rows draw from the engine-wide generator",
            "per-request seeding regressions in batched samplers (seeded rows must not depend on the batch)",
            c.seed_ignored,
            (_SAMPLER_TESTS,),
            (f"{_SAMPLER_TESTS}::test_seeded_requests_reproduce_and_differ_by_seed",),
        ),
        Mutant(
            "rope_off_by_one",
            "decode tokens get RoPE position device_len instead of device_len - 1 (prefill positions are right)",
            "position ids taken after the sequence-length increment in decode loops",
            c.rope_off_by_one,
            (_MODEL_TESTS,),
            (f"{_MODEL_TESTS}::test_prefill_logits_match_hf",),
        ),
        Mutant(
            "causal_mask_off_by_one_extend",
            "on an extend (cached_len > 0) the causal diagonal is shifted by one: each new token sees the next",
            "gittensor-ai-lab/sparkinfer#3, pytorch/executorch#21749, onnx/onnx#8068 (mask misaligned on extends)",
            c.causal_mask_off_by_one_extend,
            (_MODEL_TESTS,),
            (f"{_MODEL_TESTS}::test_extend_in_two_chunks_equals_one_prefill",),
        ),
        Mutant(
            "decode_kv_len_off_by_one",
            "decode attends over the pre-step KV length, leaving out the new token's own K/V",
            "kv length / seq_lens taken before the step's increment",
            c.decode_kv_len_off_by_one,
            (_MODEL_TESTS,),
            (f"{_MODEL_TESTS}::test_greedy_matches_hf_generate",),
        ),
        Mutant(
            "kv_wrong_slot_paged",
            "with page_size > 1, K/V are written with page and offset strides swapped (wrong slot)",
            "paged-KV slot-mapping bugs that only show with block size > 1",
            c.kv_wrong_slot_paged,
            (_MODEL_TESTS,),
            (f"{_MODEL_TESTS}::test_greedy_matches_hf_generate",),
        ),
        Mutant(
            "dummy_page_overlap",
            "the dummy page is the last real page (num_pages - 1), so padding rows overwrite live KV",
            "CUDA-graph padding requests writing into a real request's KV pages",
            c.dummy_page_overlap,
            (_KV_TESTS,),
            (f"{_KV_TESTS}::test_dummy_request_writes_only_the_dummy_page",),
        ),
        Mutant(
            "rmsnorm_model_dtype",
            "RMSNorm's mean of squares and rsqrt run in the model dtype (bf16) instead of fp32",
            "sgl-project/sglang#27540, meta-llama/llama#1048, NVIDIA/TransformerEngine#1132",
            c.rmsnorm_model_dtype,
            (_MODEL_TESTS,),
            (_MODEL_TESTS,),
        ),
    )
}


@contextlib.contextmanager
def activate(name: str) -> Iterator[None]:
    """Apply the mutant ``name`` for the duration of the block; the engine is restored exactly afterwards."""
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    with MUTANTS[name].patch():
        yield


__all__ = ["MUTANTS", "Mutant", "activate"]
