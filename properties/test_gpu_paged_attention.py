"""GPU property: FlashInfer paged attention, with CUDA graphs on, computes what HF computes on any page layout.

Page sizes {1, 4, 16}; contiguous, shuffled and interleaved page orders, with churn (earlier requests, finished or
aborted, leave stale KV in the pages the real requests reuse); prefills split into chunks, i.e. extends over a
cached prefix; decode batches padded up to captured graph sizes. Two of oracle.zoo's tiny models at head_dim 64:
qwen3 (GQA group 2, CUDA-core decode) and llama_gqa3 (GQA group 3, tensor-core decode). Every request is greedy, so
each token is checked against HF float64 teacher-forced on the same sequence: logits within the harness's bf16 bound
and tokens equal to its argmax up to a near-tie (oracle/tolerance.py).

Runs only with CUDA and flashinfer (pytest -m gpu); skipped elsewhere. The engine settings come from
tests/gpu/gpu_support.py, imported when the property runs (the repository root must be importable, as it is under
`python -m pytest` and `tox -e gpu`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.device import flashinfer_installed
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.drive import MAX_SEQ_LEN, TINY_VOCAB, run_requests
from oracle.strategies import batches, layouts, sampling_params

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and flashinfer_installed()), reason="needs a CUDA GPU and flashinfer"
    ),
]

MODELS = ("qwen3", "llama_gqa3")  # zoo architectures, widened to head_dim 64
PAGE_SIZES = (1, 4, 16)

EngineFor = Callable[[str, int], tuple[Path, Engine]]


@pytest.fixture(scope="module")
def gpu_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFor]:
    from oracle.zoo import tiny_model_dir
    from tests.gpu.gpu_support import WIDE_HEAD_DIM, gpu_engine

    root = tmp_path_factory.mktemp("gpu-property-models")
    models = {name: tiny_model_dir(name, root, head_dim=WIDE_HEAD_DIM) for name in MODELS}
    engines: dict[tuple[str, int], Engine] = {}

    def get(name: str, page_size: int) -> tuple[Path, Engine]:
        if (name, page_size) not in engines:
            pages = 8 * -(-MAX_SEQ_LEN // page_size)
            engines[name, page_size] = gpu_engine(
                models[name], page_size=page_size, max_seq_len_override=MAX_SEQ_LEN, num_page_override=pages
            )
        return models[name], engines[name, page_size]

    yield get
    for engine in engines.values():
        engine.shutdown()

EXTENDED = "a prefill extends a cached prefix (cached_len > 0)"


@settings(max_examples=examples(0.4))
@given(data=st.data())
@floors({EXTENDED: 0.8})
def test_flashinfer_paged_attention_matches_hf(data: st.DataObject, gpu_engines: EngineFor) -> None:
    from tests.gpu.gpu_support import check_against_hf64

    name = data.draw(st.sampled_from(MODELS), label="model")
    layout = data.draw(layouts(TINY_VOCAB, page_sizes=PAGE_SIZES), label="layout")
    greedy = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(1, 10))
    specs = data.draw(batches(TINY_VOCAB, 4, 40, layout.page_size, greedy, split=True, min_chunks=2), label="requests")
    exercised(EXTENDED, any(len(s.chunk_sizes) > 1 for s in specs))
    model, engine = gpu_engines(name, layout.page_size)
    assert engine.attn_backend.name == "flashinfer" and engine.graph_runner.enabled
    for i, gen in enumerate(run_requests(engine, specs, layout)):
        check_against_hf64(model, gen, f"{name} {layout} request {i}")
