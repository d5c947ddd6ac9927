"""The worked plugin example (examples/my_attention.py), end to end: the property suite, run as a user runs it
(``pytest properties --plugin ... --target ...``), passes the clean backend and catches its 0.1% bug."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TARGET = "cpu-fp32,attention=example"
# The HF-referenced properties; dev profile: the bug shows on the first example, so few are enough.
PROPERTIES = (
    "properties/test_prefill_logits.py::test_prefill_logits_match_hf_tiny",
    "properties/test_greedy_parity.py::test_greedy_matches_hf_tiny",
)


def run_suite(bug: str | None, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EXAMPLE_ATTENTION_BUG"}
    if bug is not None:
        env["EXAMPLE_ATTENTION_BUG"] = bug
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-p", "oracle.pytest_plugin", "-p", "no:cacheprovider", "-x"]
    cmd += ["--plugin", "examples.my_attention", "--target", TARGET, "--hypothesis-profile=dev"]
    cmd += ["--basetemp", str(tmp_path / "t"), *PROPERTIES]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.parametrize(("bug", "exit_code"), [(None, 0), ("1e-3", 1)], ids=["clean", "bug-1e-3"])
def test_the_suite_passes_the_clean_plugin_and_catches_its_bug(bug: str | None, exit_code: int, tmp_path: Path) -> None:
    proc = run_suite(bug, tmp_path)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert f"target: {TARGET}" in proc.stdout, tail
    assert proc.returncode == exit_code, tail
    if bug is not None:
        assert "exceeds the bound" in proc.stdout or "token" in proc.stdout, tail
