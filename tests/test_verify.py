"""python -m oracle verify: it passes on a correct engine, reports a broken model dir in one line, and fails when
a mutant is active (the harness catches real bugs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine import ModelLoadError
from oracle.__main__ import main
from oracle.mutants import activate
from oracle.verify import check_bf16_norms, verify


def test_quick_verify_passes_and_writes_json_markdown_and_plot(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_models["qwen3"]
    assert main(["verify", "--model", str(model), "--quick", "--out", str(tmp_path)]) == 0
    stdout = capsys.readouterr().out
    assert "verdict: PASS" in stdout
    data = json.loads((tmp_path / "verify-tiny-qwen3.json").read_text())
    assert data["passed"] and data["plan"] == "quick" and data["dtype"] == "float32"
    sections = {c["section"] for c in data["checks"]}
    assert {
        "greedy parity",
        "logit error",
        "decode ≡ prefill",
        "split prefill ≡ prefill",
        "seeded sampling",
        "bf16 norms",
        "sampling",
    } <= sections
    assert all(c["passed"] for c in data["checks"])
    markdown = (tmp_path / "verify-tiny-qwen3.md").read_text()
    assert "**PASS**" in markdown and "](verify-tiny-qwen3.png)" in markdown
    assert (tmp_path / "verify-tiny-qwen3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


@pytest.mark.parametrize("case", ["missing", "empty", "no-weights"])
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
        main(["verify", "--model", str(tmp_path / "nope"), "--debug"])


def test_top_p_mutant_fails_the_chi_square(tiny_models: dict[str, Path]) -> None:
    with activate("top_p_off_by_one"):
        result = verify(tiny_models["qwen3"], quick=True)
    failed = [c for c in result.checks if not c.passed]
    assert failed and not result.passed
    assert {c.section for c in failed} == {"sampling"}  # the model path is untouched by a sampler bug
    assert any(c.name.startswith("chi-square") for c in failed), [c.name for c in failed]


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_rmsnorm_in_bf16_is_bitwise_hf(arch: str, tiny_models: dict[str, Path]) -> None:
    """HF computes RMSNorm's mean of squares and rsqrt in float32 even for bf16 models; the engine must too.

    Unobservable in float32 runs, and in bf16 logits lost in bf16's own rounding, so checked module by module.
    """
    (check,) = check_bf16_norms(tiny_models[arch], seed=0)
    assert check.passed, check.detail
