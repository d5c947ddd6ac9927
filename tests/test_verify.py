"""python -m oracle verify: it passes on a correct engine, writes a report CI can read (JSON schema 1, markdown,
JUnit), reports bad usage in one line with exit 2 before any engine is built, records an engine error with exit 3,
checks the target asked for (plugins included), and fails when a mutant is active (the harness catches real bugs):
among them an attention that drops a partial last tile (only the long prompt's checks fail) and a softmax without
max subtraction (only the large-magnitude section fails)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine import ModelLoadError
from engine.attention import torch_backend
from engine.engine import Engine
from oracle import __version__
from oracle.__main__ import main, verify_main, verify_parser
from oracle.mutants import activate
from oracle.stats import chi_square_gof
from oracle.target import PRESETS, Target
from oracle.verify import (
    QUICK,
    Check,
    Environment,
    VerifyResult,
    bucketed_tokens,
    check_bf16_norms,
    chi_square_check,
    sampling_cases,
    verify,
)
from oracle.verify.kernels import KERNEL_OPS
from oracle.verify.magnitude import LARGE_SCORE
from oracle.verify.plan import LONG_PROMPT_TOKENS, describe
from oracle.verify.report import summary_lines

REPO = Path(__file__).resolve().parents[1]
LONG = f"{LONG_PROMPT_TOKENS} random ids"  # the long prompt's label on the tiny models, which have no tokenizer
CHECK_FIELDS = {"name", "section", "value", "limit", "passes_when", "status", "detail", "seconds"}


def test_quick_verify_passes_and_writes_json_markdown_junit_and_plot(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], verify_sections: frozenset[str]
) -> None:
    model = tiny_models["qwen3"]
    junit = tmp_path / "junit" / "verify.xml"
    assert main(["verify", "--model", str(model), "--quick", "--out", str(tmp_path), "--junit", str(junit)]) == 0
    captured = capsys.readouterr()
    stdout = captured.out
    assert "verdict: PASS" in stdout
    # not a terminal (a CI log): one line per section as it ends, and one table row per section
    for line in ("kernels: 17 passed", "decode and split prefill: 8 passed"):
        assert re.search(rf"^{line}, 0 failed, 0 errors \([0-9.]+ s\)$", captured.err, re.M), captured.err
    assert "5 random ids, step" not in stdout  # a check's row: only with --verbose
    data = json.loads((tmp_path / "verify-tiny-qwen3.json").read_text())
    assert data["schema_version"] == 1 and data["status"] == "pass"
    assert data["passed"] and data["plan"] == "quick" and data["dtype"] == "float32"
    assert data["target"] == PRESETS["cpu-fp32"].describe() | {"page_sizes": list(PRESETS["cpu-fp32"].page_sizes)}
    assert data["commit"] and {"python", "torch", "transformers", "hfparity-engine"} <= set(data["versions"])
    assert data["device"]
    assert datetime.fromisoformat(data["started"]).utcoffset() == timedelta(0)
    assert data["rerun"] == f"python -m oracle verify --model {model} --target cpu-fp32 --quick --seed 0"
    assert stdout.rstrip().endswith(f"rerun: {data['rerun']}")
    assert data["plugin_files"] == [] and data["env"]["OMP_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"]
    assert {c["section"] for c in data["checks"]} >= verify_sections
    assert all(set(c) == CHECK_FIELDS for c in data["checks"])
    # a kernels check holds its op to the op's own assertion: it measures nothing against a limit
    assert all(c["passes_when"] in ("<=", ">=", "==") for c in data["checks"] if c["section"] != "kernels")
    # every chi-square has two buckets or more: none is a trivial pass, none is left not-tested
    assert all(c["status"] == "pass" for c in data["checks"]), [c for c in data["checks"] if c["status"] != "pass"]
    assert data["counts"] == {"pass": len(data["checks"]), "fail": 0, "not-tested": 0, "error": 0}
    long_sections = {c["section"] for c in data["checks"] if c["name"].startswith(LONG)}
    assert {"greedy parity", "logit error", "decode ≡ prefill", "split prefill ≡ prefill"} <= long_sections
    large = {c["name"]: c for c in data["checks"] if c["section"] == "large magnitude"}
    assert large["largest attention score past float32 exp overflow"]["value"] >= LARGE_SCORE - 1e-3
    assert large[f"logit error, {LONG}"]["value"] <= large[f"logit error, {LONG}"]["limit"]
    kernels = [c for c in data["checks"] if c["section"] == "kernels"]
    assert [c["name"] for c in kernels] == [op.name for op in KERNEL_OPS]
    assert all(c["value"] == QUICK.kernel_examples for c in kernels), kernels
    ran = {c["name"]: c["detail"] for c in kernels}
    assert ran["rms_norm"] == f"kernels=torch x{QUICK.kernel_examples}" and ran["attention decode"].startswith(
        "attention=torch x"
    ) and ran["sampler probs"].startswith("sampler=torch x"), ran
    assert f"  rms_norm: kernels=torch x{QUICK.kernel_examples}" in stdout
    markdown = (tmp_path / "verify-tiny-qwen3.md").read_text()
    assert "**PASS**" in markdown and "](verify-tiny-qwen3.png)" in markdown
    assert f"Rerun: `{data['rerun']}`" in markdown and "## Provenance" in markdown
    assert f"| linear | kernels=torch x{QUICK.kernel_examples} | {QUICK.kernel_examples} | pass |  |" in markdown
    assert (tmp_path / "verify-tiny-qwen3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ET.parse(junit).getroot()
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(data["checks"]) and root.get("tests") == str(len(cases))
    assert not root.findall(".//failure") and not root.findall(".//error") and not root.findall(".//skipped")
    times = [float(case.get("time", "")) for case in cases]
    assert all(t >= 0 for t in times) and sum(t > 0 for t in times) > len(times) // 2, times
    assert sum(times) == pytest.approx(sum(c["seconds"] for c in data["checks"]), abs=0.05)
    props = {p.get("name"): p.get("value") for p in root.iterfind("./testsuite[1]/properties/property")}
    assert props["started"] == data["started"] and props["rerun"] == data["rerun"], props
    assert props["env.OMP_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"], props


def test_verbose_lists_every_check(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", "--model", str(tiny_models["llama"]), "--quick", "--out", str(tmp_path), "--verbose"]
    assert main(argv) == 0
    assert "5 random ids, step" in capsys.readouterr().out


def test_explicit_json_and_report_paths(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "a" / "r.json", tmp_path / "b" / "r.md"
    argv = ["verify", "--model", str(tiny_models["llama"]), "--quick", "--json", str(out_json)]
    assert main([*argv, "--report", str(out_md)]) == 0
    assert json.loads(out_json.read_text())["passed"]
    assert out_md.is_file() and (tmp_path / "b" / "r.png").is_file()


def _broken_dir(case: str, tmp_path: Path, tiny: Path) -> Path:
    path = tmp_path / case
    if case == "empty":
        path.mkdir()
    elif case == "no-weights":
        shutil.copytree(tiny, path)
        (path / "model.safetensors").unlink()
    return path  # "missing": never created


@pytest.mark.parametrize("case", ["empty", "no-weights"])
def test_broken_model_dir_is_one_line_error_and_exit_2(
    case: str, tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _broken_dir(case, tmp_path, tiny_models["qwen2"])
    assert main(["verify", "--model", str(model), "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("error: ModelLoadError: ") and err[1].startswith("hint: ")
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_debug_shows_the_exception(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        main(["verify", "--model", str(tmp_path), "--debug"])  # a dir without config.json


def _no_engine(*args: Any, **kwargs: Any) -> Engine:
    raise AssertionError("an engine was built although the run should have stopped before")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_target_that_cannot_run_here_is_exit_2_and_says_why(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("oracle.verify.sections.Engine", _no_engine)
    argv = ["verify", "--model", str(tiny_models["qwen3"]), "--target", "cuda-bf16", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "target 'cuda-bf16' cannot run here" in err and "no CUDA device is available here" in err, err
    assert main(["verify", "--model", str(tiny_models["qwen3"]), "--target", "cpu-fp32,dtype=fp8"]) == 2
    assert "dtype='fp8'" in capsys.readouterr().err


def test_an_unknown_plugin_is_exit_2_and_named(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("oracle.verify.sections.Engine", _no_engine)
    argv = ["--model", str(tiny_models["qwen3"]), "--plugin", "no_such_plugin_module", "--out", str(tmp_path / "o")]
    assert verify_main(argv) == 2  # the console script's entry: the verify command without the word
    err = capsys.readouterr().err
    assert "plugin 'no_such_plugin_module' could not be imported" in err and "ModuleNotFoundError" in err, err


@pytest.mark.parametrize("option", ["--out", "--json", "--report", "--junit"])
def test_an_unwritable_output_is_exit_2_before_any_engine_is_built(
    option: str,
    tiny_models: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("oracle.verify.sections.Engine", _no_engine)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = blocker / "sub" / ("x.xml" if option == "--junit" else "x")
    start = time.perf_counter()
    argv = ["verify", "--model", str(tiny_models["qwen3"]), "--quick", option, str(where)]
    assert main([*argv, *([] if option == "--out" else ["--out", str(tmp_path / "o")])]) == 2
    assert time.perf_counter() - start < 5.0
    err = capsys.readouterr().err
    assert f"cannot write {where if option != '--out' else where / 'verify-tiny-qwen3.json'}" in err, err
    assert "is not a directory" in err
    assert not (tmp_path / "o").exists()


def test_usage_errors_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify"]) == 2  # --model is required
    assert "--model" in capsys.readouterr().err
    assert main(["verify", "--version"]) == 0
    assert __version__ in capsys.readouterr().out
    assert verify_main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"hfparity-verify {__version__}"


def test_a_single_bucket_chi_square_is_not_tested_never_a_pass() -> None:
    probs = torch.tensor([1.0, 0.0, 0.0])
    chi = chi_square_gof(torch.tensor([500, 0, 0]), probs, alpha=1e-3)
    assert chi.df == 0 and chi.passed  # oracle.stats calls it trivially passed ...
    check = chi_square_check("one token left", chi)
    assert check.status == "not-tested" and not check.passed  # ... verify does not
    two = chi_square_check("two tokens", chi_square_gof(torch.tensor([260, 240]), torch.tensor([0.5, 0.5]), 1e-3))
    assert two.status == "pass" and two.passes_when == ">=" and two.value is not None and two.value >= 1e-3
    result = VerifyResult("m", "quick", PRESETS["cpu-fp32"], "float32", 0, 1e-3, Environment("c", {}, "cpu"))
    result.checks = [two, check]
    assert result.passed and result.status == "pass"
    assert result.counts() == {"pass": 1, "fail": 0, "not-tested": 1, "error": 0}
    lines = summary_lines(result)
    assert lines[0].startswith("sampling: 1 passed, 1 not tested") and "1 passed, 1 not tested" in lines[-1]
    result.checks.append(Check("run", "x", "error"))
    assert not result.passed and result.status == "error"


def test_sampling_cases_pick_rows_that_leave_two_buckets() -> None:
    peaked = torch.full((64,), -30.0)
    peaked[3] = 30.0  # one token holds all the mass, whatever the params
    spread = torch.linspace(3.0, -3.0, 64)
    cases = sampling_cases([peaked, peaked, spread], QUICK, first=2)
    assert [c.row for c in cases] == [2] * len(cases)  # the prompts' rows are tried first, then the later ones
    assert all(bucketed_tokens(spread, c.params, QUICK.samples) >= 2 for c in cases)
    assert "top_k=3" in describe(cases[1].params)
    fallback = sampling_cases([peaked, peaked], QUICK)
    assert all("no row leaves two chi-square buckets" in c.why for c in fallback)


def test_cpu_bf16_target_passes_with_the_yardstick(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    argv = ["verify", "--model", str(tiny_models["qwen3"]), "--quick", "--target", "cpu-bf16", "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "verify-tiny-qwen3.json").read_text())
    assert data["dtype"] == "bfloat16" and data["target"]["name"] == "cpu-bf16"
    logit_checks = [c for c in data["checks"] if c["section"] == "logit error"]
    assert logit_checks and all("HF's own bfloat16 error" in c["detail"] for c in logit_checks)


@pytest.mark.parametrize(("bug", "code"), [(None, 0), ("1e-3", 1)], ids=["clean", "bug-1e-3"])
def test_verify_checks_the_example_plugin_and_catches_its_bug(
    bug: str | None, code: int, tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if bug is None:
        monkeypatch.delenv("EXAMPLE_ATTENTION_BUG", raising=False)
    else:
        monkeypatch.setenv("EXAMPLE_ATTENTION_BUG", bug)  # read when an engine builds the backend
    monkeypatch.setenv("HFPARITY_ENV_ALLOW", "MY_KNOB")
    monkeypatch.setenv("MY_KNOB", "7")
    monkeypatch.setenv("MY_FLAG_A", "a")
    monkeypatch.setenv("HF_TOKEN", "secret")  # never on the allow-list
    argv = ["verify", "--model", str(tiny_models["qwen3"]), "--quick", "--out", str(tmp_path)]
    argv += ["--record-env", "MY_FLAG*", "--plugin", "examples.my_attention", "--target", "cpu-fp32,attention=example"]
    assert main(argv) == code
    data = json.loads((tmp_path / "verify-tiny-qwen3.json").read_text())
    assert data["target"]["attention"] == "example" and "examples.my_attention" in data["plugins"]
    (plugin,) = [p for p in data["plugin_files"] if p["module"] == "examples.my_attention"]
    source = REPO / "examples" / "my_attention.py"
    assert plugin == {"module": "examples.my_attention", "file": str(source), "version": None,
                      "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    assert {"MY_KNOB": "7", "MY_FLAG_A": "a"}.items() <= data["env"].items() and "HF_TOKEN" not in data["env"]
    assert data["env"].get("EXAMPLE_ATTENTION_BUG") == bug
    # the rerun line names the same model, target (overrides included), plugin, plan and seed
    rerun = verify_parser().parse_args(shlex.split(data["rerun"].removeprefix("python -m oracle verify")))
    assert (rerun.model, rerun.target, rerun.plugin, rerun.quick, rerun.seed) == (
        str(tiny_models["qwen3"]), "cpu-fp32,attention=example", ["examples.my_attention"], True, 0
    )
    failed = {c["section"] for c in data["checks"] if c["status"] != "pass"}
    if bug is None:
        assert not failed
        return
    assert "logit error" in failed and failed <= {"greedy parity", "logit error", "large magnitude", "kernels"}, failed
    kernels = {c["name"]: c for c in data["checks"] if c["section"] == "kernels"}
    attention = [name for name in kernels if name.startswith("attention")]
    assert {name for name, c in kernels.items() if c["status"] != "pass"} == set(attention), kernels
    for name in attention:  # the op's message: op, call, worst element with both values, then what ran
        assert kernels[name]["detail"].startswith(f"op {name} at q["), kernels[name]
        assert kernels[name]["detail"].endswith(f"ran: attention=example x{int(kernels[name]['value'])}")


def test_top_p_mutant_fails_the_chi_square_and_plots_the_failing_case(tiny_models: dict[str, Path]) -> None:
    with activate("top_p_off_by_one"):
        result = verify(tiny_models["qwen3"], quick=True)
    failed = [c for c in result.checks if c.status == "fail"]
    assert failed and not result.passed
    # the model path is untouched by a sampler bug; the kernels section's own sampler check catches it too
    assert {(c.section, c.name) for c in failed if c.section != "sampling"} == {("kernels", "sampler probs")}
    assert any(c.name.startswith("chi-square") for c in failed), [c.name for c in failed]
    case = failed[0].name.partition(": ")[2]
    assert result.figure is not None and result.figure.title.startswith(case), (result.figure, case)


def _hand_sdpa(subtract_max: bool, drop_partial_tile: bool) -> Callable[..., torch.Tensor]:
    """SDPA written out, with a planted bug: exp of the raw scores (no max subtraction: inf past float32's
    ~88.7), or the keys of a partial last 64-key tile left out once there are more than 64."""

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
             is_causal: bool = False, enable_gqa: bool = False) -> torch.Tensor:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        q_len, kv_len = scores.shape[-2:]
        keep = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len if is_causal else kv_len)
        if attn_mask is not None:
            keep = keep & attn_mask
        if drop_partial_tile:
            keep = keep & (torch.arange(kv_len) < max(64, kv_len // 64 * 64))
        scores = scores.masked_fill(~keep, -math.inf)
        weights = (scores - scores.amax(-1, keepdim=True) if subtract_max else scores).exp()
        return (weights / weights.sum(-1, keepdim=True)) @ v

    return sdpa


@pytest.mark.parametrize(
    ("bug", "caught_by"),
    [("no max subtraction", "large magnitude"), ("partial tile dropped", LONG)],
)
def test_long_and_large_magnitude_checks_catch_what_short_prompts_miss(
    bug: str, caught_by: str, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sdpa = _hand_sdpa(subtract_max=bug != "no max subtraction", drop_partial_tile=bug == "partial tile dropped")
    monkeypatch.setattr(torch_backend, "F", SimpleNamespace(scaled_dot_product_attention=sdpa))
    result = verify(tiny_models["qwen3"], quick=True)
    # the kernels section calls attention alone, at long lengths and scores past exp overflow: it catches both
    kernels = {c.name for c in result.section("kernels") if c.status != "pass"}
    assert kernels == {"attention prefill", "attention extend", "attention decode"}, result.section("kernels")
    failed = [c for c in result.checks if c.status != "pass" and c.section != "kernels"]
    assert failed and not result.passed
    if caught_by == "large magnitude":
        assert {c.section for c in failed} == {"large magnitude"}, failed
        (check,) = failed
        assert check.name.startswith("logit error") and "not finite" in check.detail, check
    else:  # every short prompt still passes: they never pass 64 tokens
        assert all(c.name.startswith(LONG) or c.section == "large magnitude" for c in failed), failed
        assert any(c.section == "greedy parity" or c.section == "logit error" for c in failed), failed


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_rmsnorm_in_bf16_is_bitwise_hf(arch: str, tiny_models: dict[str, Path], target: Target) -> None:
    """HF computes RMSNorm's mean of squares and rsqrt in float32 even for bf16 models; the engine must too.

    Unobservable in float32 runs, and in bf16 logits lost in bf16's own rounding, so checked module by module.
    """
    (check,) = check_bf16_norms(tiny_models[arch], seed=0, target=target)
    assert check.passed, check.detail
