"""Fixtures of the unit tests: the shared ones (tiny models, SmolLM2, the HF oracle pool, the target) come from
:mod:`oracle.pytest_plugin`; ``tiny_model`` runs a test once per dense tiny architecture; ``verify_sections`` names
verify's model-level sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from oracle.zoo import TINY_ARCHS

DENSE_ARCHS = tuple(arch for arch in TINY_ARCHS if "moe" not in arch)


@pytest.fixture(scope="session", params=DENSE_ARCHS)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Path:
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def verify_sections() -> frozenset[str]:
    """The sections of a verify run on a tiny model besides "kernels" (and "run", where one raised)."""
    return frozenset({
        "greedy parity",
        "logit error",
        "decode ≡ prefill",
        "split prefill ≡ prefill",
        "seeded sampling",
        "bf16 norms",
        "large magnitude",
        "sampling",
    })
