"""FlashInfer attention and the Triton decode backend against the torch backend and against HF in float64, for page
sizes 1, 4 and 16.

Tolerance: the harness's bf16 bound, max |Δlogit| <= 0.06 * max(1, max |reference logit|) (oracle/tolerance.py).
Against the torch backend both sides are bf16, so the bound covers two roundings of the same math; the measured
worst error is recorded as a junit property (max_logit_diff_*). Greedy tokens must agree except at a near-tie
(oracle.tolerance.LogitTolerance.near_tie), after which the sequences are no longer comparable.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import TOL, generate, gpu_engine, needs_flashinfer, random_prompt

from engine.driver import Generation, PageLayout
from oracle.checks import assert_logits_close, check_teacher_forced, compare_greedy
from oracle.pytest_plugin import OraclePool
from oracle.target import Target

pytestmark = needs_flashinfer
# Lengths around page boundaries of 4 and 16, and one long enough for many KV tiles (and split-KV decode); three
# prompts prefill in chunks, i.e. extend over a cached prefix.
PROMPT_LENS = (1, 5, 16, 17, 40, 700)
CHUNKS = ((), (), (), (9, 8), (7, 20, 13), (500, 200))
LONG = {"max_seq_len_override": 1024, "num_page_override": 2048}


def assert_runs_match(ours: list[Generation], ref: list[Generation], what: str) -> float:
    """Tokens equal up to a near-tie of ref, logits rows within TOL while both saw the same tokens; returns the
    largest logit difference."""
    worst = 0.0
    for i, (a, b) in enumerate(zip(ours, ref)):
        result = compare_greedy(a.output_ids, a.logits, b.output_ids, b.logits, TOL)
        assert result.ok, f"{what}, request {i}: {result.failure}"
        upto = result.compared
        for j in range(upto):
            worst = max(worst, assert_logits_close(a.logits[j], b.logits[j], TOL, f"{what}, request {i} token {j}"))
    return worst


def _prompts(vocab: int) -> list[list[int]]:
    return [random_prompt(100 + i, n, vocab) for i, n in enumerate(PROMPT_LENS)]


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_backend_matches_torch_backend(
    gpu_target: Target, wide_model: Path, backend: str, page_size: int, record_property: pytest.RecordProperty
) -> None:
    layout = PageLayout("shuffled", seed=page_size)
    runs = {}
    for name in (backend, "torch"):
        engine = gpu_engine(gpu_target, wide_model, attention_backend=name, page_size=page_size, cuda_graph_bs=[],
                            **LONG)
        assert engine.attn_backend.name == name
        runs[name] = generate(engine, _prompts(engine.model_config.vocab_size), 12, layout, CHUNKS)
        engine.shutdown()
    worst = assert_runs_match(runs[backend], runs["torch"], f"{backend} {wide_model.name} page_size={page_size}")
    record_property(f"max_logit_diff_{backend}_vs_torch_{wide_model.name}_ps{page_size}", round(worst, 5))


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("kind", ["shuffled", "interleaved"])
def test_page_sweep_matches_hf64(
    gpu_target: Target, wide_model: Path, backend: str, page_size: int, kind: str, oracle: OraclePool,
    record_property: pytest.RecordProperty,
) -> None:
    """The engine (CUDA graphs as the target has them) on scattered pages, checked token by token against HF."""
    engine = gpu_engine(gpu_target, wide_model, attention_backend=backend, page_size=page_size, **LONG)
    assert engine.attn_backend.name == backend and engine.graph_runner.enabled == gpu_target.graphs
    gens = generate(engine, _prompts(engine.model_config.vocab_size), 10, PageLayout(kind, seed=7), CHUNKS)
    engine.shutdown()
    what = f"{backend} {wide_model.name} {kind} page_size={page_size}"
    worst = max(max(check_teacher_forced(oracle(wide_model), g, TOL, what)) for g in gens)
    record_property(f"max_logit_err_vs_hf64_{backend}_{wide_model.name}_{kind}_ps{page_size}", round(worst, 5))


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_decode_one_request_at_a_time_matches_hf64(
    gpu_target: Target, wide_model: Path, page_size: int, oracle: OraclePool, record_property: pytest.RecordProperty,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One request per batch, so every decode step is bs 1, which the triton backend runs on its own kernel (the
    other tests' batches decode on FlashInfer): eager, counting the kernel's calls, and replayed from its graph;
    each checked token by token against HF."""
    from engine.attention import triton_decode

    calls: list[int] = []
    original = triton_decode.paged_decode
    monkeypatch.setattr(triton_decode, "paged_decode",
                        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    worst = 0.0
    for graphs in ([], None):
        engine = gpu_engine(gpu_target, wide_model, attention_backend="triton", page_size=page_size,
                            cuda_graph_bs=graphs, **LONG)
        prompts = _prompts(engine.model_config.vocab_size)
        layout = PageLayout("shuffled", seed=page_size)
        gens = [generate(engine, [p], 6, layout, [chunk])[0] for p, chunk in zip(prompts, CHUNKS)]
        if graphs == []:
            assert calls, "the Triton decode kernel never ran"
        else:
            assert engine.graph_runner.has_graph(1) and engine.attn_backend.decodes(1)
        engine.shutdown()
        what = f"triton bs 1 {wide_model.name} page_size={page_size} graphs={graphs != []}"
        worst = max(worst, *(max(check_teacher_forced(oracle(wide_model), g, TOL, what)) for g in gens))
    record_property(f"max_logit_err_vs_hf64_triton_bs1_{wide_model.name}_ps{page_size}", round(worst, 5))
