"""python -m oracle.false_failures counts the seeds on which the statistical tests fail, and bounds the rate."""

from __future__ import annotations

import json
import math
from pathlib import Path

from oracle.false_failures import main, upper_bound

MODULE = """
import pytest
from hypothesis import given, strategies as st

@pytest.mark.statistical
@given(st.integers(0, 3))
def test_chance(n):
    assert n != 3 or {fail}

def test_not_statistical():
    assert False  # deselected by -m statistical
"""


def test_upper_bound_is_clopper_pearson() -> None:
    assert math.isclose(upper_bound(0, 50), 1 - 0.05 ** (1 / 50), rel_tol=1e-9)  # 0.0582
    assert upper_bound(3, 3) == 1.0 and upper_bound(1, 50) > upper_bound(0, 50)


def test_failing_seeds_are_counted(tmp_path: Path) -> None:
    for fail, expected in (("True", []), ("False", [1, 2])):
        (tmp_path / "test_stat.py").write_text(MODULE.format(fail=fail))
        out = tmp_path / "ff.json"
        code = main(["--seeds", "2", "-j", "2", "--out", str(out), str(tmp_path / "test_stat.py")])
        record = json.loads(out.read_text())
        assert record["failed_seeds"] == expected and record["runs"] == 2 and code == (1 if expected else 0)
