"""Bad usage answers at once: ``python -m oracle verify --help`` and a usage error (a bad option, target, model dir
or plugin name) exit before torch, the engine or rich is imported, as does a pytest session given a bad
``--target``; and ``--quick``'s help says what quick really changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.__main__ import main
from oracle.verify import FULL, QUICK

REPO = Path(__file__).resolve().parents[1]


LIGHT = """
import sys
from oracle.__main__ import main
code = main(sys.argv[1:])
assert not {"torch", "engine", "rich"} & set(sys.modules), "HEAVY IMPORT"
sys.exit(code)
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "--help"],
        ["verify", "--model", "/nonexistent"],
        ["verify", "--model", ".", "--target", "cpu-fp33"],
        ["verify", "--model", ".", "--target", "cpu-fp32,speed=max"],
        ["verify", "--model", ".", "--plugin", "no_such_plugin_module"],
        ["verify", "--model", ".", "--fast"],
    ],
    ids=["--help", "missing --model dir", "bad --target", "bad --target key", "unknown --plugin", "bad option"],
)
def test_help_and_usage_errors_answer_before_torch_is_imported(argv: list[str], tmp_path: Path) -> None:
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", LIGHT, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == (0 if "--help" in argv else 2), proc.stderr
    assert "HEAVY IMPORT" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_pytest_stops_on_a_bad_target_before_torch_is_imported(tmp_path: Path) -> None:
    script = (
        "import sys, pytest\n"
        "code = pytest.main(['--target', 'cpu-fp33', '-p', 'no:cacheprovider', '--co', '-q'])\n"
        "assert 'torch' not in sys.modules, 'HEAVY IMPORT'\n"
        "sys.exit(code)\n"
    )
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, (proc.stdout, proc.stderr)
    assert "unknown target preset 'cpu-fp33'" in proc.stderr and "HEAVY IMPORT" not in proc.stderr, proc.stderr


def test_the_quick_help_says_what_quick_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    shrinks = {"prompts": "prompts", "max_tokens": "new tokens", "kernel_examples": "kernel examples"}
    for field, words in shrinks.items():
        assert getattr(QUICK, field) < getattr(FULL, field) and f"fewer {words}" in text, field
    assert len(QUICK.grid) < len(FULL.grid) and "fewer sampling grid points" in text
    assert QUICK.samples > FULL.samples and "draws more samples" in text and "fewer samples" not in text
