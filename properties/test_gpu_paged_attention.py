"""GPU property: the GPU target's paged attention (FlashInfer with CUDA graphs at cuda-bf16) computes what HF computes
on any page layout.

The target's page sizes ({1, 4, 16} for the CUDA presets); contiguous, shuffled and interleaved page orders, with
churn (earlier requests, finished or aborted, leave stale KV in the pages the real requests reuse); prefills split
into chunks, i.e. extends over a cached prefix; decode batches padded up to captured graph sizes. Two of oracle.zoo's
tiny models at the target's head_dim (64 for the CUDA presets): qwen3 (GQA group 2, CUDA-core decode) and
llama_gqa3 (GQA group 3, tensor-core decode). Every request is greedy, so each token is checked against HF float64
teacher-forced on the same sequence: logits within the harness's bound for the target's dtype and tokens equal to
its argmax up to a near-tie (oracle/tolerance.py).

Runs on the GPU target (the harness plugin's ``gpu_target``: ``--target``, else cuda-bf16; pytest -m gpu); skipped
where that is no CUDA target or cannot run here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.checks import check_teacher_forced
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, run_requests
from oracle.pytest_plugin import OraclePool
from oracle.strategies import batches, layouts, sampling_params
from oracle.target import Target
from oracle.zoo import tiny_model_dir

pytestmark = pytest.mark.gpu

MODELS = ("qwen3", "llama_gqa3")  # zoo architectures, at the target's head_dim


@pytest.fixture(scope="module")
def gpu_models(tmp_path_factory: pytest.TempPathFactory, gpu_target: Target) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu-property-models")
    return {name: tiny_model_dir(name, root, head_dim=gpu_target.head_dim) for name in MODELS}


@pytest.fixture(scope="module")
def gpu_engines(gpu_target: Target) -> Iterator[EnginePool]:
    pool = EnginePool(gpu_target)
    yield pool
    pool.close()


EXTENDED = "a prefill extends a cached prefix (cached_len > 0)"


@settings(max_examples=examples(0.4))
@given(data=st.data())
@floors({EXTENDED: 0.8})
def test_paged_attention_matches_hf(
    data: st.DataObject, gpu_target: Target, gpu_models: dict[str, Path], gpu_engines: EnginePool, oracle: OraclePool
) -> None:
    name = data.draw(st.sampled_from(MODELS), label="model")
    layout = data.draw(layouts(TINY_VOCAB, page_sizes=gpu_target.page_sizes), label="layout")
    greedy = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(1, 10))
    specs = data.draw(batches(TINY_VOCAB, 4, 40, layout.page_size, greedy, split=True, min_chunks=2), label="requests")
    exercised(EXTENDED, any(len(s.chunk_sizes) > 1 for s in specs))
    model = gpu_models[name]
    engine = gpu_engines.get(model, layout.page_size)
    assert engine.attn_backend.name == gpu_target.resolved("attention")
    for i, gen in enumerate(run_requests(engine, specs, layout)):
        check_teacher_forced(oracle(model), gen, gpu_target.tolerance, f"{name} {layout} request {i}")
