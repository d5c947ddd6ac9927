"""Engines for the micro-benchmarks, one per device and session, each of its device's target: the plugin's --target
(or $HFPARITY_TARGET) where one is named, whose device's cases run and the other's skip; else cpu-fp32 on CPU
(SmolLM2-135M) and cuda-bf16 on GPU (the Qwen3-0.6B shape, dummy weights, CUDA graphs for the benchmarked batch
sizes). GPU cases skip without CUDA."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from engine import Engine
from oracle.environment import COMMIT_ENV
from oracle.pytest_plugin import device_target
from oracle.target import Target

from .common import build_engine, has_cuda, model_for, torch_info

# Decode batch sizes per device, the decode context (prompt tokens) and the prefill lengths.
DECODE_BS = {"cpu": (1, 8), "cuda": (1, 8, 64, 256)}
DECODE_CONTEXT = {"cpu": 64, "cuda": 512}
PREFILL_LENS = (512, 2048)

needs_cuda = pytest.mark.skipif(not has_cuda(), reason="needs a CUDA GPU")


def device_params(cases: Mapping[str, Sequence[object]]) -> list[object]:
    """pytest params (device, n) for every case, the CUDA ones marked to skip without a GPU."""
    return [
        pytest.param(device, n, id=f"{device}-{n}", marks=[needs_cuda] if device == "cuda" else [])
        for device, sizes in cases.items()
        for n in sizes
    ]


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, object]) -> None:
    """Saved runs and baselines say which torch, CUDA, GPU and thread count produced them, next to pytest-benchmark's
    node, CPU and Python; a compare against a baseline made with others warns that machine_info differs."""
    machine_info.update(torch_info())


def pytest_benchmark_update_commit_info(config: pytest.Config, commit_info: dict[str, object]) -> None:
    """$HFPARITY_COMMIT names the commit when the checkout has no .git of its own (a copy on a GPU machine), where
    pytest-benchmark would read whatever repository lies above it."""
    if os.environ.get(COMMIT_ENV):
        commit_info.update(id=os.environ[COMMIT_ENV], dirty=False, source=COMMIT_ENV)


@pytest.fixture(scope="session")
def target_for(pytestconfig: pytest.Config) -> Callable[[str], Target]:
    """target_for(device) -> the target of that device's cases (the harness plugin's device_target)."""
    return lambda device: device_target(pytestconfig, device)


def _engine(target: Target) -> Engine:
    max_bs = max(DECODE_BS[target.device])
    kv_tokens = max_bs * (DECODE_CONTEXT[target.device] + 1) + max(PREFILL_LENS) + 1
    graph_bs = list(DECODE_BS[target.device])
    return build_engine(target, model_for(target), max_running_req=max_bs, kv_tokens=kv_tokens, graph_bs=graph_bs)


@pytest.fixture(scope="session")
def cpu_engine(target_for: Callable[[str], Target]) -> Iterator[Engine]:
    engine = _engine(target_for("cpu"))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def cuda_engine(target_for: Callable[[str], Target]) -> Iterator[Engine]:
    if not has_cuda():
        pytest.skip("needs a CUDA GPU")
    engine = _engine(target_for("cuda"))
    yield engine
    engine.shutdown()


@pytest.fixture
def engine_for(request: pytest.FixtureRequest) -> Callable[[str], Engine]:
    """engine_for(device) -> that device's session engine."""

    def get(device: str) -> Engine:
        return request.getfixturevalue(f"{device}_engine")

    return get
