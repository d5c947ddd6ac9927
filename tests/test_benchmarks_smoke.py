"""benchmarks/compare end to end on a tiny model, on CPU, so CI notices when the comparison breaks.

No time is asserted (speed lives in the benchmarks); what is checked is that both sides ran the same work: each
contender made exactly n tokens per request (benchmarks/compare raises otherwise), and with the same real weights the
engine's greedy tokens equal HF generate's token for token (the tiny models have no near-ties). The same holds
with HF eager in a child process of its own (--isolate), as HF static+compile runs on GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.common import critical_path, layer_critical_path, model_for, write_record
from benchmarks.compare import ENGINE_EAGER, HF_EAGER, IsolatedHF, Plan, main
from benchmarks.compare.sampling import GREEDY, MIXED, MODES, SEEDED, request_params
from oracle.target import parse


@pytest.mark.parametrize("isolated", [[], [HF_EAGER]], ids=["in-process", "isolated"])
def test_compare_grid_runs_the_same_work_on_both_sides(
    tiny_models: dict[str, Path], tmp_path: Path, isolated: list[str]
) -> None:
    out = tmp_path / "compare.json"
    args = ["--device", "cpu", "--quick", "--model", str(tiny_models["qwen3"]), "--json", str(out)]
    # Without --isolate only HF static+compile is isolated, and it runs on GPU alone.
    assert main(args + (["--isolate", ",".join(isolated)] if isolated else [])) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["isolated"] == isolated
    assert result["meta"]["target"]["name"] == "cpu-fp32" and result["meta"]["dtype"] == "float32"
    assert result["meta"]["machine_info"]["torch"] == torch.__version__ and result["meta"]["machine_info"]["cpu"]
    plan = Plan.for_device(torch.device("cpu"), quick=True)
    assert result["meta"]["plan"]["batch_sizes"] == list(plan.batch_sizes)
    grid = result["grid"]
    expected = {(b, m) for b in plan.batch_sizes for m in (ENGINE_EAGER, HF_EAGER)}
    assert {(r["batch"], r["method"]) for r in grid["rows"]} == expected
    assert grid["greedy_agreement"] == {f"{ENGINE_EAGER} = {HF_EAGER}": {str(b): 1.0 for b in plan.batch_sizes}}
    for row in grid["rows"]:  # an isolated contender's times were measured in its child and sent back
        assert len(row["t_n_s"]) == plan.repeats and row["tokens_per_s"] > 0
        assert all(t > 0 for key in ("t_n_s", "t_1_s", "cpu_n_s", "cpu_1_s") for t in row[key])
    pairs = {(q["batch"], q["a"], q["b"]) for q in grid["ratios"]}
    assert pairs == {(b, ENGINE_EAGER, HF_EAGER) for b in plan.batch_sizes}
    assert "roofline" not in result and "offline" not in result  # GPU-only sections


def test_skipped_contenders_leave_the_grid(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    args = ["--device", "cpu", "--quick", "--model", str(tiny_models["qwen3"]), "--json", str(out)]
    assert main([*args, "--batch-sizes", "2", "--skip", HF_EAGER]) == 0
    result = json.loads(out.read_text())
    assert result["meta"]["skipped"] == [HF_EAGER]
    assert [r["method"] for r in result["grid"]["rows"]] == [ENGINE_EAGER]
    assert result["grid"]["ratios"] == [] and result["grid"]["greedy_agreement"] == {}
    with pytest.raises(SystemExit):
        main([*args, "--skip", "vllm"])
    with pytest.raises(SystemExit):  # a target of another device than --device's
        main([*args, "--target", "cuda-bf16"])


def test_sampled_rows_their_ratios_and_the_step_profile(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    args = ["--device", "cpu", "--quick", "--model", str(tiny_models["qwen3"]), "--json", str(out), "--skip", HF_EAGER]
    sampling = ["--sampling", "seeded,greedy,mixed", "--sampled-batch-sizes", "2", "--profile"]
    assert main([*args, "--batch-sizes", "1,2", *sampling]) == 0
    grid = json.loads(out.read_text())["grid"]
    labels = [ENGINE_EAGER, f"{ENGINE_EAGER} [mixed]", f"{ENGINE_EAGER} [seeded]"]
    assert grid["sampling"] == list(MODES)
    assert [(r["batch"], r["method"]) for r in grid["rows"]] == [(1, ENGINE_EAGER)] + [(2, x) for x in labels]
    assert {(q["batch"], q["a"], q["b"]) for q in grid["ratios"]} == {(2, x, ENGINE_EAGER) for x in labels[1:]}
    profiled = [(p["batch"], p["sampling"], p["method"]) for p in grid["profile"]]
    assert profiled == [(1, GREEDY, ENGINE_EAGER)] + [(2, mode, label) for mode, label in zip(MODES, labels)]
    for p in grid["profile"]:  # no device kernels on CPU
        assert p["kernels_per_step"] is None and p["device_ms_per_step"] is None and p["host_ms_per_step"] > 0
        assert p["graph_ms_per_step"] is None and p["critical_kernels"] == []
    with pytest.raises(SystemExit):
        main([*args, "--sampling", "greedy,beam"])


def test_sampling_modes_make_the_requested_batches() -> None:
    mixed = request_params(MIXED, [5] * 5)
    assert [(p.temperature, p.top_k, p.top_p, p.min_p) for p in mixed] == [
        (0.8, 20, 1.0, 0.0), (0.8, -1, 0.9, 0.0), (0.8, -1, 1.0, 0.05), (0.0, -1, 1.0, 0.0), (0.8, 20, 1.0, 0.0)
    ]
    assert not request_params(MIXED, [5])[0].is_greedy, "a mixed batch of one samples"
    seeded = request_params(SEEDED, [3, 4])
    assert [p.seed for p in seeded] == [0, 1] and all(p.temperature == 0.8 and p.top_p == 0.9 for p in seeded)
    assert all(p.ignore_eos and p.seed is None for p in mixed + request_params(GREEDY, [1]))
    assert [p.max_tokens for p in seeded] == [3, 4]


def test_an_isolated_contender_that_fails_raises_with_the_childs_traceback(tiny_models: dict[str, Path]) -> None:
    cpu = torch.device("cpu")
    with IsolatedHF(model_for(parse("cpu-fp32"), str(tiny_models["qwen3"])), cpu, HF_EAGER, None) as child:
        wall, cpu_s, tokens = child.run([[1, 2, 3]], 2)
        assert wall > 0 and cpu_s > 0 and len(tokens[0]) == 2
        with pytest.raises(RuntimeError, match=f"{HF_EAGER}: its child process failed") as failed:
            child.run([[10**9]], 2)  # no such token: the embedding lookup raises in the child
        assert "Traceback" in str(failed.value) and "IndexError" in str(failed.value)
        with pytest.raises(RuntimeError, match=f"{HF_EAGER}: its child process died"):
            child.run([[1, 2, 3]], 2)  # a failure ends the child
    assert not child.proc.is_alive()


def test_profile_step_reports_every_phase_and_restores_the_engine(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from benchmarks import profile_step

    out = tmp_path / "profile.json"
    args = ["--device", "cpu", "--model", str(tiny_models["qwen3"]), "--batch-sizes", "1,3", "--context", "8"]
    assert profile_step.main([*args, "--steps", "4", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["meta"]["machine_info"]["torch"] == torch.__version__ and written["meta"]["device"] == "cpu"
    results = written["results"]
    assert [r["batch"] for r in results] == [1, 3]
    for r in results:
        assert r["step_ms"] > 0 and r["graph_device_ms"] is None  # no graphs on CPU
        phases = r["phases_ms"]
        assert phases["forward_batch"] > 0 and phases["driver: waiting for the tokens"] > 0 and r["waited_step_ms"] > 0
        assert phases["prepare: packed inputs (host)"] > 0
        assert phases["prepare: inputs + slot checks (device, eager passes)"] > 0
        assert sum(v for k, v in phases.items() if k.startswith("prepare")) < r["step_ms"]
    import engine.engine as engine_module
    from engine.step.inputs import pack_inputs

    assert engine_module.pack_inputs is pack_inputs, "the phase timers were not removed"
    assert engine_module.ForwardOutput.wait.__name__ == "wait", "the timer on a class method was not removed"


def test_critical_path_charges_each_kernel_the_device_time_it_adds() -> None:
    # Two steps: b overlaps a (PDL) and adds 2 µs; c starts after a 1 µs launch gap; d lies inside c and adds nothing.
    step = [("a", 0.0, 5.0), ("b", 3.0, 7.0), ("c", 8.0, 12.0), ("d", 9.0, 11.0)]
    spans = step + [(n, s + 20.0, e + 20.0) for n, s, e in step]
    got = {k["name"]: (k["per_step"], k["us_per_step"]) for k in critical_path(reversed(spans), steps=2)}
    assert got == {"a": (1.0, 5.0 + 8.0 / 2), "b": (1.0, 2.0), "c": (1.0, 5.0), "d": (1.0, 0.0)}
    assert sum(us for _, us in got.values()) * 2 == 32.0  # the span from the first start to the last end


def test_layer_critical_path_averages_each_layer_position_over_the_inner_layers() -> None:
    # A step: embed, 4 layers of (norm, attn, mlp) back to back, head; layer i's attn adds 1 + i µs, each other
    # kernel 1 µs. The inner layers (1 and 2) average attn to 2.5; the outer ones are left out.
    names = ["embed"] + ["norm", "attn", "mlp"] * 4 + ["head"]
    costs = [1.0] + [c for i in range(4) for c in (1.0, 1.0 + i, 1.0)] + [1.0]
    spans, t = [], 0.0
    for _ in range(2):
        for name, cost in zip(names, costs):
            spans.append((name, t, t + cost))
            t += cost
    got = layer_critical_path(reversed(spans), steps=2, layers=4)
    assert [(k["name"], k["us"]) for k in got] == [("norm", 1.0), ("attn", 2.5), ("mlp", 1.0)]
    # A first layer that launches one more kernel: the other three are found, and their inner one averaged.
    odd = ["embed", "norm", "rope", "attn", "mlp"] + ["norm", "attn", "mlp"] * 3 + ["head"]
    spans = [(name, float(i), i + 1.0 + (name == "attn")) for i, name in enumerate(odd)]
    assert [k["name"] for k in layer_critical_path(spans, steps=1, layers=4)] == ["norm", "attn", "mlp"]
    assert layer_critical_path([("a", 0.0, 1.0), ("b", 1.0, 2.0)], steps=1, layers=4) == []


def test_a_probes_record_names_its_commit_and_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HFPARITY_COMMIT", "abc1234")
    monkeypatch.setattr("sys.argv", ["benchmarks/two_batch_probe.py", "--parts", "2"])
    write_record(tmp_path / "r.json", "benchmarks.two_batch_probe", [{"ms": 1.0}])
    record = json.loads((tmp_path / "r.json").read_text())
    assert (record["commit"], record["results"]) == ("abc1234", [{"ms": 1.0}])
    assert record["command"].endswith(" -m benchmarks.two_batch_probe --parts 2") and "cpu" in record["machine"]
