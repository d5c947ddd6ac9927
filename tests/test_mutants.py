"""The mutant catalogue: every mutant is a clean, reversible patch, and the harness kills every one.

The kill table itself runs as a subprocess per mutant (python -m oracle.mutants --fast): the fast configuration
(targeted tests, dev Hypothesis profile, -x) of all mutants plus the baseline takes a few minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import engine.engine as engine_module
import engine.models.config as model_config_module
from engine import sample, sample_noise
from engine.attention import flashinfer_backend, torch_backend
from engine.attention.triton_backend import TritonDecodeBackend
from engine.driver import Pages, StaticDriver
from engine.driver.loop import Loop
from engine.driver.requests import Requests
from engine.engine import Engine
from engine.graph import GraphRunner
from engine.kvcache.pool import KVCachePool
from engine.layers.kernels import InvariantKernels, TorchKernels, TritonInvariantKernels, TritonKernels
from engine.layers.norm import RMSNorm
from engine.sample import BaseSampler, Sampler
from engine.step import ForwardOutput, slots
from engine.step.kernels import StepKernels
from oracle.mutants import MUTANTS, activate, mutants_for
from oracle.mutants.killers import KillersError, killers, parse_killers
from oracle.mutants.plugin import MUTANT_ENV
from oracle.mutants.runner import REPO_ROOT, Job, run_one
from oracle.target import parse

# Everything a mutant may patch: a class dict or a module dict.
PATCHED: tuple[type | ModuleType, ...] = (
    BaseSampler,
    Sampler,
    Engine,
    KVCachePool,
    RMSNorm,
    torch_backend.TorchAttnBackend,
    torch_backend,
    StaticDriver,
    Pages,
    Requests,
    Loop,
    sample,
    sample_noise,
    GraphRunner,
    TritonDecodeBackend,
    flashinfer_backend,
    engine_module,
    model_config_module,
    TorchKernels,
    InvariantKernels,
    TritonKernels,
    TritonInvariantKernels,
    slots,
    StepKernels,
    ForwardOutput,
)
# Patched only where triton is installed (the Triton kernels' module imports it).
NEEDS_TRITON = {
    "gemv_gate_unactivated", "triton_slot_count_skipped", "seeded_noise_by_row", "norm_gemv_rms_first_block",
    "gemm_k_tail_dropped", "gemv_grid_by_rule", "triton_input_ids_batch_index_as_row",
    "top_p_chunk_carry_dropped", "tempered_argmax_last_tie", "top_p_keys_from_rounded_scores",
    "key_counts_signed_zeros_apart", "triton_slot_flag_kept", "triton_hand_out_tail_dropped",
    "triton_keep_tokens_read_contiguous",
}


def _patched() -> tuple[type | ModuleType, ...]:
    """PATCHED, plus the Triton kernels' modules where triton is installed (importing it imports triton)."""
    if importlib.util.find_spec("triton") is None:
        return PATCHED
    import engine.layers.triton_gemm as triton_gemm
    import engine.layers.triton_gemv as triton_gemv
    import engine.layers.triton_kernels as triton_kernels
    import engine.sample_keys_triton as sample_keys_triton
    import engine.sample_rows_triton as sample_rows_triton
    import engine.sample_triton as sample_triton
    import engine.step.triton as step_triton

    return (*PATCHED, triton_kernels, triton_gemv, triton_gemm, step_triton, sample_triton, sample_rows_triton,
            sample_keys_triton)


def _snapshot() -> dict[tuple[str, str], object]:
    return {(str(owner), name): value for owner in _patched() for name, value in vars(owner).items()}


def _changed(before: dict[tuple[str, str], object]) -> set[tuple[str, str]]:
    now = _snapshot()
    return {k for k in before.keys() | now.keys() if before.get(k) is not now.get(k)}


def test_the_catalogue_has_25_or_more_mutants_with_existing_killers() -> None:
    assert len(MUTANTS) >= 25 and mutants_for("cuda")
    for name, mutant in MUTANTS.items():
        assert mutant.bug and mutant.seen, name
        kill = killers()[name]
        for target in (*kill.targets, *kill.fast):
            assert (REPO_ROOT / target.split("::")[0]).is_file(), f"{name}: {target} does not exist"


def test_the_killers_file_names_every_mutant_and_is_required(tmp_path: Path) -> None:
    """mutants.toml lives beside the suites: a table per mutant, no stray ones, and a clear error without it."""
    text = (REPO_ROOT / "mutants.toml").read_text()
    first = next(iter(MUTANTS))
    with pytest.raises(KillersError, match=rf"no table for mutant\(s\) \['{first}'\]"):
        parse_killers(text.replace(f"[{first}]", "[not_a_mutant]"))
    with pytest.raises(KillersError, match="fast: use a non-empty list"):
        parse_killers(text.replace("fast = [", "fast = [3, ", 1))
    with pytest.raises(KillersError, match="not found: the kill table runs the suites of a checkout"):
        killers(tmp_path / "mutants.toml")


def test_a_kill_table_runs_only_the_mutants_whose_path_its_target_takes() -> None:
    """A mutant of one backend's code (or of graph replays) survives on a target that never runs it; the kill table
    leaves it out there instead of reporting it alive."""
    flashinfer = mutants_for("cuda", parse("cuda-bf16"))
    triton = mutants_for("cuda", parse("cuda-bf16,attention=triton"))
    assert "flashinfer_last_page_len_modulo" in flashinfer and "triton_decode_lengths_frozen" not in flashinfer
    assert "triton_decode_lengths_frozen" in triton and "flashinfer_last_page_len_modulo" not in triton
    # Every CUDA target copies its host tokens, draws seeded noise and runs the sampler's row passes (the key-count
    # filter among them) with Triton; nothing else of the CUDA mutants runs on the torch one.
    assert "gemv_gate_unactivated" in flashinfer and mutants_for("cuda", parse("cuda-bf16-torch")) == [
        "seeded_noise_by_row", "top_p_chunk_carry_dropped", "top_p_keys_from_rounded_scores",
        "key_counts_signed_zeros_apart", "host_copy_unwaited"
    ]
    assert "graph_positions_stale" not in mutants_for("cuda", parse("cuda-bf16,graphs=off"))
    invariant = ["linear_rows_by_count", "attention_decode_padded", "norm_reduction_by_block_count"]  # its own code
    assert mutants_for("cpu", parse("cpu-fp32")) == [m for m in mutants_for("cpu") if m not in invariant]
    assert set(invariant) <= set(mutants_for("cpu", parse("cpu-fp32,invariant=on")))
    assert "matmul_split_k_by_rows" in mutants_for("cuda", parse("cuda-bf16,invariant=on"))
    assert "matmul_split_k_by_rows" not in mutants_for("cuda", parse("cuda-bf16"))


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mutant_patches_something_and_restores_it_exactly(name: str) -> None:
    if name in NEEDS_TRITON and importlib.util.find_spec("triton") is None:
        pytest.skip("its patch needs triton")
    before = _snapshot()
    with activate(name):
        assert _changed(before), f"{name} patched nothing"
    assert not _changed(before)


def test_a_mutant_is_undone_when_the_block_raises() -> None:
    before = _snapshot()
    with pytest.raises(RuntimeError, match="boom"), activate("top_p_off_by_one"):
        raise RuntimeError("boom")
    assert not _changed(before)


def test_unknown_mutant_is_rejected() -> None:
    with pytest.raises(KeyError, match="unknown mutant 'nope'"), activate("nope"):
        pass


def test_a_mutant_its_targets_cannot_see_survives(tmp_path: Path) -> None:
    """The runner only calls a mutant killed when a test fails: a norm-precision bug is invisible to a greedy test."""
    job = Job(("tests/test_sampler.py::test_temperature_zero_is_greedy",), "dev")
    result = run_one("rmsnorm_model_dtype", job, fast=True, log_path=tmp_path / "log")
    assert result.status == "survived" and not result.ok and result.passed == 1


def test_a_target_that_does_not_exist_is_an_error_not_a_kill(tmp_path: Path) -> None:
    result = run_one("top_p_off_by_one", Job(("tests/no_such_test.py",), "dev"), fast=True, log_path=tmp_path / "log")
    assert result.status == "error" and not result.ok


def test_the_plugin_rejects_an_unknown_mutant() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "oracle.mutants.plugin",
            "--collect-only",
            "-q",
            "tests/test_sampler.py",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, MUTANT_ENV: "nope"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 4  # pytest's usage error
    assert "is not a mutant" in proc.stderr + proc.stdout


def test_fast_kill_table_kills_every_mutant(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "oracle.mutants", "--fast", "-j", "2", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    table = json.loads((tmp_path / "mutants-fast.json").read_text())
    runs = {r["mutant"]: r for r in table["runs"]}
    assert runs["(baseline)"]["status"] == "passed", proc.stdout[-3000:]
    survivors = {n: r["status"] for n, r in runs.items() if n in MUTANTS and r["status"] != "killed"}
    assert not survivors, proc.stdout[-3000:]
    assert set(runs) == {"(baseline)", *mutants_for("cpu", parse("cpu-fp32"))}
    assert proc.returncode == 0


def test_the_invariant_kill_table_kills_the_invariant_mutants(tmp_path: Path) -> None:
    """The batch-invariant mode's own mutants, on the CPU target that takes its path (the exact property kills)."""
    target = "cpu-fp32,invariant=on"
    own = [m for m in mutants_for("cpu", parse(target)) if m not in mutants_for("cpu", parse("cpu-fp32"))]
    only = [arg for m in own for arg in ("--only", m)]
    proc = subprocess.run(
        [sys.executable, "-m", "oracle.mutants", "--fast", "--target", target, "-j", "2", "--out", str(tmp_path)]
        + only,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    runs = {r["mutant"]: r["status"] for r in json.loads((tmp_path / "mutants-fast.json").read_text())["runs"]}
    assert runs == {"(baseline)": "passed", **{m: "killed" for m in own}}, proc.stdout[-3000:]
    assert own and proc.returncode == 0


def _uninstalled_python(root: Path) -> Path:
    """A virtual environment holding every package of this one except the project (its dist-info and editable
    finder), so nothing but PYTHONPATH can bring the checkout: no pytest11 or hfparity.plugins entry point."""
    packages = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    packages.mkdir(parents=True)
    # Only the dirs that exist (a system Python lists some that do not), the first of a name winning, as on sys.path.
    dirs = [Path(d) for d in site.getsitepackages() if Path(d).is_dir()]
    for entry in (e for d in dirs for e in d.iterdir()):
        owned = entry.name.startswith(("hfparity_engine", "hfparity-engine", "__editable__"))
        pth = entry.suffix == ".pth" and "hfparity" in entry.read_text(errors="replace")
        if not owned and not pth and not (packages / entry.name).exists():
            (packages / entry.name).symlink_to(entry)
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    home = Path(getattr(sys, "_base_executable", sys.executable)).resolve().parent
    (root / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\n")
    return root / "bin" / "python"


def test_the_kill_table_runs_from_a_checkout_that_is_not_installed(tmp_path: Path) -> None:
    """Only on PYTHONPATH (a GPU box): the children's pytest still loads the harness plugin, so the baseline
    passes and the mutant is killed."""
    python = _uninstalled_python(tmp_path / "venv")
    # A copy of the sources: an editable install leaves *.egg-info in the checkout, which PYTHONPATH would expose.
    checkout = tmp_path / "checkout"
    for name in ("engine", "oracle", "properties", "tests", "examples", "benchmarks", "pyproject.toml", "mutants.toml"):
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, checkout / name)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    probe = "import importlib.metadata as m; print(sorted(e.value for e in m.entry_points(group='pytest11')))"
    found = subprocess.run(
        [str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "oracle" not in found and "hfparity" not in found, found
    cmd = [str(python), "-m", "oracle.mutants", "--fast", "--only", "seed_ignored", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    runs = {r["mutant"]: r["status"] for r in json.loads((tmp_path / "mutants-fast.json").read_text())["runs"]}
    assert runs == {"(baseline)": "passed", "seed_ignored": "killed"}, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0
