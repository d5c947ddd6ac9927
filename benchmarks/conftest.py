"""Engines for the micro-benchmarks, one per device and session: SmolLM2-135M fp32 on CPU, the Qwen3-0.6B shape
(dummy weights, bf16, CUDA graphs for the benchmarked batch sizes) on GPU. GPU cases skip without CUDA."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest
import torch

from engine import Engine
from oracle.environment import COMMIT_ENV

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


def _engine(device: str) -> Engine:
    dev = torch.device(device)
    max_bs = max(DECODE_BS[device])
    kv_tokens = max_bs * (DECODE_CONTEXT[device] + 1) + max(PREFILL_LENS) + 1
    graph_bs = list(DECODE_BS[device]) if device == "cuda" else None
    return build_engine(
        model_for(dev), dev, max_running_req=max_bs, kv_tokens=kv_tokens, cuda_graph_bs=graph_bs
    )


@pytest.fixture(scope="session")
def cpu_engine() -> Iterator[Engine]:
    engine = _engine("cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def cuda_engine() -> Iterator[Engine]:
    if not has_cuda():
        pytest.skip("needs a CUDA GPU")
    engine = _engine("cuda")
    yield engine
    engine.shutdown()


@pytest.fixture
def engine_for(request: pytest.FixtureRequest) -> Callable[[str], Engine]:
    """engine_for(device) -> that device's session engine."""

    def get(device: str) -> Engine:
        return request.getfixturevalue(f"{device}_engine")

    return get
