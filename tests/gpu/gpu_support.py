"""What the GPU tests share: skip markers, engines of the GPU target, greedy runs and the bf16 tolerance.

Every GPU test carries ``gpu`` (selected by ``pytest -m gpu``) and a skip condition, so it skips cleanly on a
machine without CUDA (or without flashinfer, where it needs it). Engines and models come from the target, as the
properties' do: the harness plugin's ``gpu_target`` fixture (``--target``, else cuda-bf16; the tests that take it
skip where it is no CUDA target), whose backends a test overrides only where it exercises one on purpose.

The zoo's tiny models have head_dim 16 by default, below FlashInfer's smallest kernel (64); the GPU tests use the
zoo's same architectures and init at the target's head_dim (64 for the CUDA presets), among them ``llama_gqa3``,
with 6 query heads per 2 KV heads: a GQA group of 3, which (like SmolLM2's 9/3) is not a power of two and takes the
tensor-core decode path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine, SamplingParams
from engine.device import flashinfer_installed
from engine.driver import Generation, PageLayout, StaticDriver
from oracle.target import Target
from oracle.tolerance import logit_tolerance

HAS_CUDA = torch.cuda.is_available()
HAS_FLASHINFER = HAS_CUDA and flashinfer_installed()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
requires_flashinfer = pytest.mark.skipif(not HAS_FLASHINFER, reason="needs a CUDA GPU and flashinfer (see docs/gpu.md)")
needs_cuda = [pytest.mark.gpu, requires_cuda]  # module-level pytestmark
needs_flashinfer = [pytest.mark.gpu, requires_flashinfer]
# The Triton kernel tests run on CUDA, or with KERNEL_TEST_DEVICE=cpu and TRITON_INTERPRET=1 in Triton's interpreter.
KERNEL_DEVICE = os.environ.get("KERNEL_TEST_DEVICE", "cuda")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
requires_kernel_device = pytest.mark.skipif(KERNEL_DEVICE == "cuda" and not HAS_CUDA, reason="needs a CUDA GPU")
needs_kernel_device = [pytest.mark.gpu, requires_kernel_device]  # module-level pytestmark

# The zoo architectures of the target's head_dim models: all but qwen3_moe, whose attention is Qwen3's.
WIDE_ARCHS = ("qwen3", "qwen2", "llama", "llama_gqa3")


def gpu_engine(target: Target, model: Path, **fields: Any) -> Engine:
    """An engine of the target with a small fixed pool; keyword arguments set other EngineConfig fields."""
    settings: dict[str, Any] = {"num_page_override": 512, "max_running_req": 8, "max_seq_len_override": 256}
    return Engine(target.engine_config(model, **settings | fields), sampler_seed=0)


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


TOL = logit_tolerance(torch.bfloat16)  # the harness's bf16 bound and near-tie rule (oracle.tolerance)
