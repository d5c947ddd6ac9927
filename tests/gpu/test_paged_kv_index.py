"""FlashInfer's page metadata from the token-granular page table (eager and in a captured step), and the CPU-side
guards of the GPU path.

These run everywhere (no GPU needed): the metadata is plain index arithmetic, checked here against the page table
it must describe, for page sizes 1..16 and shuffled page orders.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ConfigError, Engine, EngineConfig, Req, SamplingParams
from engine.attention import ATTENTION_BACKENDS, Where
from engine.attention.flashinfer_backend import build_paged_kv_index, graph_page_ids, kv_page_ids
from engine.sample import Sampler


def _req(table_idx: int, cached: int, device_len: int) -> Req:
    return Req(torch.zeros(device_len, dtype=torch.int32), table_idx, cached, 1, table_idx, SamplingParams())


def test_index_counts_pages_and_last_page_len() -> None:
    reqs = [_req(0, 0, 1), _req(1, 0, 4), _req(2, 3, 5), _req(3, 15, 16), _req(4, 10, 17)]
    index = build_paged_kv_index(reqs, page_size=4)
    assert index.kv_indptr.tolist() == [0, 1, 2, 4, 8, 13]
    assert index.kv_last_page_len.tolist() == [1, 4, 1, 4, 1]
    assert index.qo_indptr.tolist() == [0, 1, 5, 7, 8, 15]
    assert index.pages.tolist() == [1, 1, 2, 4, 5]
    assert index.kv_indptr.dtype == index.kv_last_page_len.dtype == index.qo_indptr.dtype == torch.int32


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from((1, 2, 4, 16)),
    lengths=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_index_and_page_ids_describe_the_page_table(page_size: int, lengths: list[int], seed: int) -> None:
    """Rebuilding every request's slots from (kv_indices, kv_last_page_len) gives back its page-table row."""
    rows, width = len(lengths) + 1, 80
    pages_needed = sum(-(-n // page_size) for n in lengths)
    free = list(range(pages_needed + 3))
    random.Random(seed).shuffle(free)  # a shuffled layout: a request's pages are scattered over the pool
    table = torch.zeros(rows, width, dtype=torch.int32)
    for row, n in enumerate(lengths):
        for start in range(0, n, page_size):
            page = free.pop()
            table[row, start : start + page_size] = page * page_size + torch.arange(page_size)[: width - start]
    reqs = [_req(row, n - 1, n) for row, n in enumerate(lengths)]
    index = build_paged_kv_index(reqs, page_size)
    ids = kv_page_ids(table, torch.tensor([r.table_idx for r in reqs]), index, page_size)
    assert ids.dtype == torch.int32
    for row, n in enumerate(lengths):
        pages = ids[index.kv_indptr[row] : index.kv_indptr[row + 1]]
        last = int(index.kv_last_page_len[row])
        assert 1 <= last <= page_size
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()
        slots = slots[: (len(pages) - 1) * page_size + last]
        assert slots.tolist() == table[row, :n].tolist()
    # A captured step's page ids: fixed shapes (every column a row can hold), the same ids in kv_indices order.
    cols = torch.arange(-(-width // page_size))
    out = torch.full((len(lengths) * len(cols) + 1,), -7, dtype=torch.int32)
    graph_page_ids(table, torch.tensor([r.table_idx for r in reqs]), index.kv_indptr, cols, page_size, out)
    total = int(index.kv_indptr[-1])
    assert out[:total].tolist() == ids.tolist()
    assert (out[total:-1] == -7).all(), "columns past a request's pages land only in the last entry"


def test_flashinfer_is_refused_clearly_without_cuda() -> None:
    cpu = torch.device("cpu")
    assert ATTENTION_BACKENDS.unusable("flashinfer", Where(cpu, torch.bfloat16, 64)) is not None
    assert ATTENTION_BACKENDS.resolve("auto", Where(cpu, torch.float32, 64)) == "torch"
    with pytest.raises(ConfigError, match="flashinfer"):
        ATTENTION_BACKENDS.resolve("flashinfer", Where(cpu, torch.bfloat16, 64))
    cuda16 = Where(torch.device("cuda"), torch.bfloat16, 16)
    assert "head_dim in [64, 256], got 16" in (ATTENTION_BACKENDS.unusable("flashinfer", cuda16) or "")
    with pytest.raises(ConfigError, match="FlashInfer sampling"):
        Sampler(cpu, 32, seed=0, use_flashinfer=True)
    assert not Sampler(cpu, 32, seed=0).use_flashinfer


def test_engine_refuses_flashinfer_on_cpu_and_keeps_graphs_off(tiny_models: dict[str, object]) -> None:
    model = str(tiny_models["llama"])
    with pytest.raises(ConfigError, match="flashinfer"):
        Engine(EngineConfig(model, device="cpu", attention_backend="flashinfer", num_page_override=8))
    engine = Engine(EngineConfig(model, device="cpu", num_page_override=8, max_running_req=2))
    assert engine.attn_backend.name == "torch"
    assert not engine.graph_runner.enabled and engine.graph_runner.graphs == {}
    engine.shutdown()


def test_triton_attention_is_refused_clearly_where_it_cannot_run(tiny_models: dict[str, object]) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "CUDA device" in (ATTENTION_BACKENDS.unusable("triton", Where(cpu, torch.bfloat16, 64)) or "")
    assert "head_dim" in (ATTENTION_BACKENDS.unusable("triton", Where(cuda, torch.bfloat16, 96)) or "")
    assert "float16" in (ATTENTION_BACKENDS.unusable("triton", Where(cuda, torch.float64, 64)) or "")
    with pytest.raises(ConfigError, match="attention_backend='triton' cannot be used: it needs a CUDA device"):
        Engine(EngineConfig(str(tiny_models["llama"]), device="cpu", attention_backend="triton", num_page_override=8))
