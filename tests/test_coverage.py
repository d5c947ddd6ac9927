"""The vacuity floors (oracle.coverage) and the pinned Hypothesis constants (oracle.pytest_plugin): a test whose
examples miss their case fails, and the derandomized examples do not move when an unrelated local module loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle.coverage import FLOORS_ENV, MIN_OBSERVATIONS, Tally, exercised, tally

REPO = Path(__file__).resolve().parents[1]


def test_shortfall_is_reported_only_below_the_floor_and_with_enough_observations() -> None:
    t = Tally()
    for i in range(MIN_OBSERVATIONS):
        t.add("batch-mate", i < MIN_OBSERVATIONS - 2, 0.9)  # 80% < 90%
        t.add("extend", i < MIN_OBSERVATIONS - 1, 0.9)  # 90% holds
    t.add("rare", False, 0.5)  # one observation: not judged
    assert t.shortfalls() == [f"batch-mate: {MIN_OBSERVATIONS - 2}/{MIN_OBSERVATIONS} = 80% of observations, floor 90%"]


def test_floors_off_records_without_judging(monkeypatch: pytest.MonkeyPatch) -> None:
    t = Tally()
    for _ in range(MIN_OBSERVATIONS):
        t.add("never", False, 0.5)
    monkeypatch.setenv(FLOORS_ENV, "off")
    assert t.shortfalls() == [] and t.shares["never"].total == MIN_OBSERVATIONS


def test_a_label_keeps_one_floor() -> None:
    with tally(), pytest.raises(ValueError, match="floors"):
        exercised("x", True, 0.5)
        exercised("x", True, 0.6)


def run_pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    env.pop("HYPOTHESIS_PROFILE", None)
    env.pop(FLOORS_ENV, None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "oracle.pytest_plugin", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


VACUOUS = """
from hypothesis import given, strategies as st
from oracle.coverage import exercised

@given(st.integers(0, 9))
def test_mostly_vacuous(n):
    exercised("n is 9", n == 9, floor=0.5)
"""


def test_a_passing_test_with_too_many_vacuous_examples_fails(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, VACUOUS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "too many vacuous examples" in proc.stdout and "n is 9:" in proc.stdout


DRAWS = """
import os
from hypothesis import given, settings, strategies as st
if os.environ.get("LOAD_CONSTANTS"):
    import lots_of_constants  # a local module: Hypothesis would mine its literals

seen = []

@settings(max_examples=200)
@given(st.integers(), st.floats(allow_nan=False))
def test_draw(i, f):
    seen.append((i, f))

def test_report():
    print("DRAWS", hash(tuple(seen)))
"""


def test_derandomized_examples_do_not_depend_on_loaded_modules(tmp_path: Path) -> None:
    (tmp_path / "lots_of_constants.py").write_text(
        "".join(f"C{i} = {v!r}\n" for i, v in enumerate([918273645, -55555, 3.25e17, 0.000123, 2**40 + 7]))
    )
    runs = []
    for load in ("", "1"):
        os.environ["LOAD_CONSTANTS"] = load
        try:
            proc = run_pytest(tmp_path, DRAWS, "-s")
        finally:
            del os.environ["LOAD_CONSTANTS"]
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs.append(next(line for line in proc.stdout.splitlines() if "DRAWS" in line))
    assert runs[0] == runs[1]
