"""benchmarks/compare.py end to end on a tiny model, on CPU, so CI notices when the comparison breaks.

No time is asserted (speed lives in the benchmarks); what is checked is that both sides ran the same work: each
contender made exactly n tokens per request (compare.py raises otherwise), and with the same real weights the
engine's greedy tokens equal HF generate's token for token (the tiny models have no near-ties).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from benchmarks.compare import ENGINE_EAGER, HF_EAGER, Plan, main


def test_compare_grid_runs_the_same_work_on_both_sides(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    assert main(["--device", "cpu", "--quick", "--model", str(tiny_models["qwen3"]), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    plan = Plan.for_device(torch.device("cpu"), quick=True)
    assert result["meta"]["plan"]["batch_sizes"] == list(plan.batch_sizes)
    grid = result["grid"]
    expected = {(b, m) for b in plan.batch_sizes for m in (ENGINE_EAGER, HF_EAGER)}
    assert {(r["batch"], r["method"]) for r in grid["rows"]} == expected
    assert grid["greedy_agreement"] == {f"{ENGINE_EAGER} = {HF_EAGER}": {str(b): 1.0 for b in plan.batch_sizes}}
    for row in grid["rows"]:
        assert len(row["t_n_s"]) == plan.repeats and row["tokens_per_s"] > 0
    pairs = {(q["batch"], q["a"], q["b"]) for q in grid["ratios"]}
    assert pairs == {(b, ENGINE_EAGER, HF_EAGER) for b in plan.batch_sizes}
    assert "roofline" not in result and "offline" not in result  # GPU-only sections
