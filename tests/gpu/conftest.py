"""Session fixtures of the GPU tests: the zoo's head_dim-64 tiny models (see gpu_support.py), built once."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import WIDE_ARCHS, WIDE_HEAD_DIM

from oracle.zoo import tiny_model_dir


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """zoo architecture -> its head_dim-64 tiny model."""
    root = tmp_path_factory.mktemp("wide-models")
    return {arch: tiny_model_dir(arch, root, head_dim=WIDE_HEAD_DIM) for arch in WIDE_ARCHS}


@pytest.fixture(scope="session", params=sorted(WIDE_ARCHS))
def wide_model(request: pytest.FixtureRequest, wide_models: dict[str, Path]) -> Path:
    return wide_models[request.param]
