"""python -m oracle verify when something breaks: an engine error is exit 3 with the reports written and the later
sections still run (a section that needs the greedy generations is recorded as not run), a fault in one section
leaves the others' checks, and each failure says what broke: the greedy positions, decode ≡ prefill's and split
prefill's step, position, argmaxes and worst logit, and bf16 norms' module, scale and element."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import EngineError
from engine.attention import TorchAttnBackend
from engine.engine import Engine
from engine.sample import Sampler
from oracle.__main__ import main
from oracle.mutants import activate
from oracle.target import PRESETS
from oracle.verify import Check, Environment, SectionRun, VerifyResult, check_bf16_norms, verify
from oracle.verify.report import failure_details


def _raise_in_forward(self: Engine, *args: Any, **kwargs: Any) -> Any:
    raise EngineError("injected: the engine failed mid-run")


def _raise_in_sampler(self: Sampler, *args: Any, **kwargs: Any) -> Any:
    raise EngineError("injected: the sampler failed mid-run")


def _nan_attention(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    return lambda self, *args, **kwargs: original(self, *args, **kwargs) * float("nan")


@pytest.mark.parametrize("fault", ["forward raises", "non-finite logits", "sampler raises"])
def test_an_engine_error_is_exit_3_with_the_report_written(
    fault: str,
    tiny_models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    verify_sections: frozenset[str],
) -> None:
    if fault == "forward raises":
        monkeypatch.setattr(Engine, "forward_batch", _raise_in_forward)
    elif fault == "non-finite logits":
        monkeypatch.setattr(TorchAttnBackend, "forward", _nan_attention(TorchAttnBackend.forward))
    else:  # of the model-level sections only sampling calls Sampler.sample: the others run and are kept
        monkeypatch.setattr(Sampler, "sample", _raise_in_sampler)
    junit = tmp_path / "j.xml"
    argv = ["verify", "--model", str(tiny_models["qwen3"]), "--quick", "--out", str(tmp_path), "--junit", str(junit)]
    assert main(argv) == 3
    data = json.loads((tmp_path / "verify-tiny-qwen3.json").read_text())
    assert data["status"] == "error" and not data["passed"]
    errors = [c for c in data["checks"] if c["status"] == "error"]
    first = errors[0]
    assert first["section"] == "run"
    expected = {
        "forward raises": "EngineError: injected: the engine failed",
        "non-finite logits": "NonFiniteLogitsError",
        "sampler raises": "EngineError: injected: the sampler failed",
    }[fault]
    assert expected in first["detail"], first
    if fault == "sampler raises":
        assert first["name"].startswith("sampling:")
        assert verify_sections - {"sampling"} <= {c["section"] for c in data["checks"] if c["status"] == "pass"}
    else:  # the sections that need the generations are recorded as not run, never as passes
        assert first["name"].startswith("greedy generation:")
        not_run = [c for c in data["checks"] if c["name"].endswith(": not run")]
        assert {c["name"] for c in not_run} == {
            f"{s}: not run" for s in ("greedy parity and logit error", "decode and split prefill", "sampling")
        }
        assert all(c["status"] == "not-tested" and "greedy generation, which raised" in c["detail"] for c in not_run)
        sections = {c["section"] for c in data["checks"]}
        assert not {"greedy parity", "logit error", "decode ≡ prefill", "sampling"} & sections, sections
    assert {"bf16 norms", "kernels"} <= {c["section"] for c in data["checks"]}  # later sections still ran
    assert "**ERROR**" in (tmp_path / "verify-tiny-qwen3.md").read_text()
    assert len(ET.parse(junit).getroot().findall(".//error")) == len(errors)


def _injected(*args: Any, **kwargs: Any) -> list[Check]:
    raise RuntimeError("injected into one section")


def test_an_error_in_one_section_leaves_the_later_sections_running(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, verify_sections: frozenset[str]
) -> None:
    monkeypatch.setattr("oracle.verify.check_seeded", _injected)
    finished: list[SectionRun] = []
    result = verify(tiny_models["qwen3"], quick=True, on_section=finished.append)
    assert [r.name for r in finished] == [
        "greedy generation", "greedy parity and logit error", "decode and split prefill", "seeded sampling",
        "bf16 norms", "large magnitude", "sampling", "kernels",
    ]
    (error,) = [c for c in result.checks if c.status != "pass"]
    assert (error.section, error.name, error.status) == ("run", "seeded sampling: RuntimeError", "error")
    assert "injected into one section" in error.detail
    assert verify_sections - {"seeded sampling"} <= set(result.sections()), result.sections()
    assert all(r.seconds >= 0 for r in finished) and result.checks == [c for r in finished for c in r.checks]
    with pytest.raises(RuntimeError, match="injected"):  # --debug
        verify(tiny_models["qwen3"], quick=True, catch_errors=False)


def test_a_greedy_failure_names_the_first_and_worst_position(tiny_models: dict[str, Path]) -> None:
    with activate("rope_off_by_one"):
        result = verify(tiny_models["qwen3"], quick=True)
    greedy = [c for c in result.section("greedy parity") if c.status == "fail"]
    assert greedy, [c.detail for c in result.section("greedy parity")]
    detail = greedy[0].detail
    assert "first at position" in detail and "worst at position" in detail, detail
    assert "engine   : [" in detail and "HF argmax: [" in detail, detail
    assert all("worst at position" in c.detail for c in result.section("logit error"))
    # a decode-only RoPE bug: decode ≡ prefill fails, saying where and by how much
    (decode, *_) = [c for c in result.section("decode ≡ prefill") if c.status == "fail"]
    assert re.match(r"decode step \d+, position \d+: .*; argmax: decode \d+, prefill \d+; worst at token \d+: "
                    r"decode -?[0-9.e+-]+ vs prefill -?[0-9.e+-]+$", decode.detail), decode.detail
    assert f"FAILED decode ≡ prefill / {decode.name}:\n{decode.detail}" in failure_details(result)
    assert all("argmax: split" in c.detail for c in result.section("split prefill ≡ prefill"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's bf16 RMSNorm")
def test_a_bf16_norm_failure_names_module_scale_and_element(qwen3: Path) -> None:
    with activate("rmsnorm_model_dtype"):
        (check,) = check_bf16_norms(qwen3, seed=0, target=PRESETS["cpu-fp32"])
    assert check.status == "fail"
    assert re.search(r"worst: model\.\S+norm at input scale [0-9.]+, element \(\d+, \d+\): engine \S+ vs HF \S+$",
                     check.detail), check.detail
    result = VerifyResult("m", "quick", PRESETS["cpu-fp32"], "bfloat16", 0, 1e-3, Environment("c", {}, "cpu"))
    result.checks = [check]
    assert failure_details(result) == [f"FAILED bf16 norms / {check.name}:\n{check.detail}"]


def test_a_corrupt_tokenizer_is_a_model_load_error_exit_2(qwen3: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(qwen3, model)
    (model / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["verify", "--model", str(model), "--quick", "--out", str(tmp_path / "out")])
    assert code == 2, err.getvalue()
    assert "ModelLoadError" in err.getvalue() and "tokenizer" in err.getvalue(), err.getvalue()
