"""Shared fixtures: the tiny random models (built per session) and the real default model (cached)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oracle.hf import HFOracle

TINY_ARCHS = ("qwen3", "qwen2", "llama")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from oracle.zoo import tiny_model_dir

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: tiny_model_dir(arch, root) for arch in TINY_ARCHS}


@pytest.fixture(scope="session", params=TINY_ARCHS)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Path:
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from oracle.zoo import smollm2_dir

    return smollm2_dir(progress=False)


@pytest.fixture(scope="session")
def qwen3(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["qwen3"]


@pytest.fixture(scope="session")
def oracle(qwen3: Path) -> HFOracle:
    """HF in float32 on the tiny qwen3: the reference for tests that run the engine in float32."""
    return HFOracle(qwen3, dtype=torch.float32)

