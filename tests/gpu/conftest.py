"""Session fixtures of the GPU tests: the head_dim-64 tiny models (see gpu_support.py), built once."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import WIDE_SPECS, build_wide_model


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wide-models")
    return {name: build_wide_model(name, root / f"wide-{name}") for name in WIDE_SPECS}


@pytest.fixture(scope="session", params=sorted(WIDE_SPECS))
def wide_model(request: pytest.FixtureRequest, wide_models: dict[str, Path]) -> Path:
    return wide_models[request.param]
