"""oracle.drive.run_placed: the KV slots it reports are where each request's computed positions live, so the page
layout property's vacuity label (two runs placing the KV differently) measures what it says."""

from __future__ import annotations

from pathlib import Path

from engine import SamplingParams
from engine.driver import PageLayout
from oracle.drive import EnginePool, run_placed, run_requests
from oracle.strategies import LayoutSpec, RequestSpec

SPECS = [
    RequestSpec((1, 2, 3, 4, 5), SamplingParams(max_tokens=3, ignore_eos=True)),
    RequestSpec((6, 7), SamplingParams(max_tokens=1, ignore_eos=True)),
]


def test_contiguous_slots_follow_the_page_order(tiny_models: dict[str, Path], engines: EnginePool) -> None:
    engine = engines.get(tiny_models["qwen3"], page_size=4)
    gens, slots = run_placed(engine, SPECS)
    # Request 0 computes 5 prompt + 2 fed-back tokens on pages 0-1; request 1 its 2 prompt tokens on page 2.
    assert slots == [tuple(range(7)), (8, 9)]
    assert [g.output_ids for g in gens] == [g.output_ids for g in run_requests(engine, SPECS)]


def test_a_shuffled_layout_reports_other_slots(tiny_models: dict[str, Path], engines: EnginePool) -> None:
    engine = engines.get(tiny_models["qwen3"], page_size=4)
    shuffled = LayoutSpec(4, PageLayout("shuffled", seed=3))
    _, slots = run_placed(engine, SPECS, shuffled)
    _, contiguous = run_placed(engine, SPECS)
    assert [len(s) for s in slots] == [7, 2] and slots != contiguous
    assert all(s // 4 == slots[0][0] // 4 for s in slots[0][:4])  # one page holds 4 consecutive positions
