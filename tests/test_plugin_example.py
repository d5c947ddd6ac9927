"""The worked plugin examples (examples/my_attention.py, examples/my_sampler.py), end to end: the property suite,
run as a user runs it (``pytest properties --plugin ... --target ...``), passes each clean plugin and catches its
bug."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Example:
    plugin: str
    target: str
    bug_env: str
    bug: str
    properties: tuple[str, ...]  # dev profile: each bug shows on an early example, so few are enough
    caught: tuple[str, ...]  # the failure report says one of these


ATTENTION = Example(
    "examples.my_attention", "cpu-fp32,attention=example", "EXAMPLE_ATTENTION_BUG", "1e-3",
    ("properties/test_prefill_logits.py::test_prefill_logits_match_hf_tiny",
     "properties/test_greedy_parity.py::test_greedy_matches_hf_tiny"),
    ("exceeds the bound", "token"),
)
SAMPLER = Example(
    "examples.my_sampler", "cpu-fp32,sampler=example", "EXAMPLE_SAMPLER_BUG", "1",
    ("properties/test_op_sampler.py",), ("op sampler probs",),
)


def run_suite(example: Example, bug: bool, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != example.bug_env}
    if bug:
        env[example.bug_env] = example.bug
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "pytest", "-p", "oracle.pytest_plugin", "-p", "no:cacheprovider", "-x"]
    cmd += ["--plugin", example.plugin, "--target", example.target, "--hypothesis-profile=dev"]
    cmd += ["--basetemp", str(tmp_path / "t"), *example.properties]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.parametrize("example", [ATTENTION, SAMPLER], ids=["attention", "sampler"])
@pytest.mark.parametrize("bug", [False, True], ids=["clean", "bug"])
def test_the_suite_passes_the_clean_plugin_and_catches_its_bug(example: Example, bug: bool, tmp_path: Path) -> None:
    proc = run_suite(example, bug, tmp_path)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert f"target: {example.target}" in proc.stdout, tail
    assert proc.returncode == (1 if bug else 0), tail
    if bug:
        assert any(c in proc.stdout for c in example.caught), tail
