"""Session fixtures of the GPU tests: tiny models at the GPU target's head_dim (see gpu_support.py) and at the zoo's
own, built once."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import WIDE_ARCHS

from oracle.target import Target
from oracle.zoo import TINY_ARCHS, tiny_model_dir


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> the zoo's tiny model at its default head_dim (16, below FlashInfer's kernels), whatever the target:
    here it stands for the models only the torch backend serves."""
    root = tmp_path_factory.mktemp("narrow-models")
    return {arch: tiny_model_dir(arch, root) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory, gpu_target: Target) -> dict[str, Path]:
    """zoo architecture -> its tiny model at the GPU target's head_dim."""
    root = tmp_path_factory.mktemp("wide-models")
    return {arch: tiny_model_dir(arch, root, head_dim=gpu_target.head_dim) for arch in WIDE_ARCHS}


@pytest.fixture(scope="session", params=sorted(WIDE_ARCHS))
def wide_model(request: pytest.FixtureRequest, wide_models: dict[str, Path]) -> Path:
    return wide_models[request.param]
