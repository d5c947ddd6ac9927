"""Property: batch invariance, exact (issue #27). Runs only on a target with ``invariant=on``.

Requests, greedy or seeded, run together, on a drawn page size and page layout (after churn that frees pages for
reuse), some with a chunked prefill, optionally under a prefill token budget, and leave the batch at different steps.
Each one then runs alone, unchunked, on a page-size-1 engine with contiguous pages. Its logits at every step must be
``torch.equal`` to the solo run's, and so its tokens, seeded draws included: no tolerance, so the property holds only
where no reduction's order depends on the batch. With CUDA graphs up to 8 requests run together (the engines' largest
captured size), so decode batches fall on each side of every captured size (1, 2, 4, 8) and are padded to the next.

Negative control: the same check on the same target with invariant off (and the device's default attention and
kernels) finds a difference for a fixed example (two requests, 9 and 5 prompt tokens, 3 new tokens each): on CPU
fp32 the batched projections round differently; on CUDA bf16 cuBLAS, the GEMV and FlashInfer choose by the batch.

Bug classes: a product, norm, attention or LM head whose reduction order depends on the number of rows, the padding
or the chunking (mutants linear_rows_by_count, attention_decode_padded; on CUDA matmul_split_k_by_rows). Every example
batches two to four requests (eight with graphs); vacuity floors: some decode requests of different lengths together,
chunk a prefill, reuse freed pages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from engine import SamplingParams
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, continuous_archs, run_requests
from oracle.strategies import LayoutSpec, RequestSpec, batches, layouts, sampling_params
from oracle.target import Target

RAGGED = "requests of different lengths decode together"
CHUNKED = "a prefill is chunked (drawn chunks or a prefill budget)"
CHURNED = "the requests reuse pages freed by churn"


def differences(
    engines: EnginePool, model: Path, specs: Sequence[RequestSpec], layout: LayoutSpec, budget: int | None
) -> list[str]:
    """Where a request's batched logits are not bitwise its solo run's (empty when invariant)."""
    batched = run_requests(engines.get(model, layout.page_size), specs, layout, max_prefill_tokens=budget)
    solo_engine = engines.get(model, 1)
    found = []
    for i, (spec, ours) in enumerate(zip(specs, batched)):
        solo = run_requests(solo_engine, [RequestSpec(spec.prompt, spec.params)])[0]
        if ours.output_ids != solo.output_ids:
            found.append(f"request {i}: tokens {ours.output_ids} batched, {solo.output_ids} alone")
            continue
        for step, (row, ref) in enumerate(zip(ours.logits, solo.logits)):
            if not torch.equal(row, ref):
                worst = (row - ref).abs().max().item()
                found.append(f"request {i} step {step}: logits differ from its solo run's (max |diff| {worst:.3g})")
    return found


@dataclass(frozen=True)
class Case:
    arch: str
    layout: LayoutSpec
    specs: list[RequestSpec]
    budget: int | None  # max_prefill_tokens


@st.composite
def cases(draw: st.DrawFn, target: Target) -> Case:
    """Two to four requests (eight with graphs: the engines' max_running_req, so decode batches fall on each side
    of every captured size), greedy or seeded, on a drawn layout, some chunked, under a drawn prefill budget."""
    layout = draw(layouts(TINY_VOCAB, target.page_sizes))
    params = sampling_params(TINY_VOCAB, seeded=True, max_tokens=st.integers(1, 6))
    most = 8 if target.graphs else 4
    specs = draw(batches(TINY_VOCAB, most, 40, layout.page_size, params, draw(st.booleans()), min_size=2))
    budget = draw(st.none() | st.integers(1, 24))
    return Case(draw(st.sampled_from(continuous_archs(target))), layout, specs, budget)


@pytest.fixture(scope="module")
def invariant_target(target: Target) -> Target:
    if not target.invariant:
        pytest.skip("needs a target with invariant=on (e.g. --target cpu-fp32,invariant=on)")
    return target


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({RAGGED: 0.3, CHUNKED: 0.3, CHURNED: 0.3})
def test_logits_are_bitwise_those_of_the_solo_run(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool, invariant_target: Target
) -> None:
    case = data.draw(cases(invariant_target), label="case")
    decoding = [len(s.prompt) for s in case.specs if s.params.max_tokens > 1]
    exercised(RAGGED, len(set(decoding)) > 1)
    exercised(CHUNKED, case.budget is not None or any(len(s.chunk_sizes) > 1 for s in case.specs))
    exercised(CHURNED, bool(case.layout.churn))
    found = differences(engines, tiny_models[case.arch], case.specs, case.layout, case.budget)
    assert not found, "; ".join(found)


CONTROL_SPECS = [
    RequestSpec(tuple(range(1, 10)), SamplingParams(max_tokens=3, ignore_eos=True)),
    RequestSpec(tuple(range(20, 25)), SamplingParams(max_tokens=3, ignore_eos=True)),
]


def test_negative_control_finds_a_difference_with_invariant_off(
    tiny_models: dict[str, Path], invariant_target: Target
) -> None:
    """The fixed example, else the property's own search with the mode off; prints the shrunk example (-rP)."""
    # The device's default attention and kernels: on CUDA the invariant target names its own.
    pool = EnginePool(dataclasses.replace(invariant_target, invariant=False, attention="auto", kernels="auto"))

    def differs(case: Case) -> list[str]:
        return differences(pool, tiny_models[case.arch], case.specs, case.layout, case.budget)

    try:
        found = differs(Case("qwen3", LayoutSpec(1), CONTROL_SPECS, None))
        if not found:
            search = settings(max_examples=examples(4.0), deadline=None, database=None)
            shrunk = find(cases(invariant_target), lambda case: bool(differs(case)), settings=search)
            found = differs(shrunk)
            print(f"negative control, shrunk: {shrunk}: {'; '.join(found)}")
    except NoSuchExample:
        found = []
    finally:
        pool.close()
    assert found, "with invariant off the batched runs matched the solo runs bitwise: the control shows nothing"
