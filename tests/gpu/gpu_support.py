"""What the GPU tests share: skip markers, tiny models FlashInfer can serve, and engine settings.

Every GPU test carries ``gpu`` (selected by ``pytest -m gpu``) and a skip condition, so it skips cleanly on a
machine without CUDA (or without flashinfer, where it needs it).

The zoo's tiny models have head_dim 16 by default, below FlashInfer's smallest kernel (64); the GPU tests use the
zoo's same architectures and init widened to head_dim 64 (``oracle.zoo.tiny_model_dir(arch, root, head_dim=64)``),
among them ``llama_gqa3``, with 6 query heads per 2 KV heads: a GQA group of 3, which (like SmolLM2's 9/3) is not a
power of two and takes the tensor-core decode path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.device import flashinfer_installed
from engine.driver import Generation, PageLayout, StaticDriver
from oracle.pytest_plugin import OraclePool
from oracle.tolerance import logit_tolerance, logits_error

HAS_CUDA = torch.cuda.is_available()
HAS_FLASHINFER = HAS_CUDA and flashinfer_installed()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
requires_flashinfer = pytest.mark.skipif(not HAS_FLASHINFER, reason="needs a CUDA GPU and flashinfer (see docs/gpu.md)")
needs_cuda = [pytest.mark.gpu, requires_cuda]  # module-level pytestmark
needs_flashinfer = [pytest.mark.gpu, requires_flashinfer]

# The zoo architectures of the head_dim-64 models: all but qwen3_moe, whose attention is Qwen3's.
WIDE_ARCHS = ("qwen3", "qwen2", "llama", "llama_gqa3")
WIDE_HEAD_DIM = 64


def gpu_engine(model: Path, **overrides: Any) -> Engine:
    """A bf16 CUDA engine with a small fixed pool; keyword arguments override EngineConfig fields."""
    settings: dict[str, Any] = {
        "dtype": "bfloat16",
        "device": "cuda",
        "num_page_override": 512,
        "max_running_req": 8,
        "max_seq_len_override": 256,
    }
    settings.update(overrides)
    return Engine(EngineConfig(str(model), **settings), sampler_seed=0)


def random_prompt(seed: int, length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def generate(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    max_tokens: Sequence[int] | int,
    layout: PageLayout | None = None,
    chunks: Sequence[Sequence[int]] | None = None,
) -> list[Generation]:
    """Greedy generations (EOS ignored) with their logits rows; all requests are admitted together."""
    counts = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    driver = StaticDriver(engine, layout, record_logits=True)
    uids = [
        driver.add(prompt, SamplingParams(max_tokens=n, ignore_eos=True), chunk_sizes=tuple(ch))
        for prompt, n, ch in zip(prompts, counts, chunks or [()] * len(prompts))
    ]
    driver.run()
    return [driver.result(uid) for uid in uids]


hf_oracle = OraclePool()  # hf_oracle(model, dtype=float64, device="cpu"), built once per process


TOL = logit_tolerance(torch.bfloat16)  # the harness's bf16 bound and near-tie rule (oracle.tolerance)


def check_against_hf64(
    model: Path, gen: Generation, what: str, yardstick: Sequence[float] | None = None
) -> list[float]:
    """The engine's bf16 greedy run against HF in float64 teacher-forced on the same tokens (so every position is
    compared): each token is the argmax of the engine's own row and a near-tie of HF's; each row is within TOL of
    HF's, or, where `yardstick` gives HF bf16's own error on that row, within TOL.yardstick_bound. Returns the
    per-row errors."""
    prompt, out = list(gen.prompt_ids), list(gen.output_ids)
    forced = hf_oracle(model).teacher_forced_logits(prompt + out)[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    errors = []
    for i, (token, ours, ref) in enumerate(zip(out, gen.logits, forced)):
        assert ours[token] == ours.max(), f"{what} token {i}: {token} is not the argmax of the engine's own logits"
        assert TOL.near_tie(ref, token), f"{what} token {i}: {token} is {float(ref.max() - ref[token]):.3g} below best"
        err = logits_error(ours, ref)
        allowed = TOL.yardstick_bound(ref, yardstick[i] if yardstick else None)
        assert err <= allowed, (
            f"{what} token {i}: max |logit error| vs HF float64 {err:.3g} exceeds {allowed:.3g} (bf16 bound "
            f"{TOL.bound(ref):.3g}, HF bf16's own error {yardstick[i] if yardstick else float('nan'):.3g})"
        )
        errors.append(err)
    return errors
