"""Hypothesis profiles and the session fixtures of the property suite.

Profiles (pick one with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``; default ``ci``):

* ``ci``: derandomized (the same examples on every run, so CI is reproducible), no example database, no deadline
  (a forward pass on a loaded 2-core machine takes what it takes), print_blob so a failure can be replayed with
  ``@reproduce_failure``; 25 examples per test before the per-test shares in ``budget.py``.
* ``deep``: 400 examples per test, random (a new seed each run), the local example database kept.
  ``HYPOTHESIS_PROFILE=deep pytest properties/`` or ``make properties-deep``; expect about 45 minutes on a
  2-core machine (measured: 20 minutes for the page-layout, batch, split, padding, seeded, decode and scheduler
  properties).
* ``dev``: 5 examples per test, derandomized: a quick smoke run while editing.
* ``ci-random``: ``ci``'s example counts (so the same α per check) with a random seed, or the one given by
  ``--hypothesis-seed``: runs the statistical properties under many seeds to count false failures.

HealthCheck.too_slow is suppressed in every profile: one example runs whole forward passes (and HF generate),
which Hypothesis counts as slow data generation for strategies that draw inside the test; the CI machine is shared,
so timing-based health checks would fail at random.

Threads: unless OMP_NUM_THREADS is set, the suite runs torch single-threaded (and the engine, which leaves the
thread count alone when OMP_NUM_THREADS is set, follows). The models here are small, so a second thread gains
little, and on a loaded machine every OpenMP barrier can wait a whole scheduler time slice: measured on the shared
2-core box, a SmolLM2 generation took 16 s with 2 threads and 1.8 s with 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from oracle.hf import HFOracle

from .drive import TINY_ARCHS, EnginePool

PROFILE_ENV = "HYPOTHESIS_PROFILE"

_COMMON = settings(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", _COMMON, max_examples=25, derandomize=True, database=None)
settings.register_profile("deep", _COMMON, max_examples=400, derandomize=False)
settings.register_profile("dev", _COMMON, max_examples=5, derandomize=True, database=None)
settings.register_profile("ci-random", _COMMON, max_examples=25, derandomize=False, database=None)


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("OMP_NUM_THREADS"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    # --hypothesis-profile (handled by Hypothesis' own plugin) wins over the environment variable.
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> directory of the deterministic tiny random model (oracle.zoo), built once per session."""
    from oracle.zoo import tiny_model_dir

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: tiny_model_dir(arch, root) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from oracle.zoo import smollm2_dir

    return smollm2_dir(progress=False)


@pytest.fixture(scope="session")
def engines() -> Iterator[EnginePool]:
    pool = EnginePool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def oracle() -> Callable[..., HFOracle]:
    """oracle(model_dir, dtype=float64) -> the session's HFOracle for that model and dtype (results cached)."""
    cache: dict[tuple[str, torch.dtype], HFOracle] = {}

    def get(model: str | Path, dtype: torch.dtype = torch.float64) -> HFOracle:
        key = (str(model), dtype)
        if key not in cache:
            cache[key] = HFOracle(model, dtype=dtype)
        return cache[key]

    return get
