"""The harness's pytest plugin (oracle.pytest_plugin) as a user meets it: the vacuity floors (oracle.coverage: a test
whose examples miss their case fails, saying which law went unchecked), pinned Hypothesis constants (derandomized
examples do not move when an unrelated local module loads), the profiles' shrinking bound, the cheapest-first order,
the target and plugin header under -q, and the GPU tests' target."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.coverage import FLOORS_ENV, MIN_EXAMPLES, Tally, exercised, floors, tally
from oracle.target_spec import TARGET_ENV

REPO = Path(__file__).resolve().parents[1]


def ran(n: int) -> Tally:
    """A tally of n examples of a test declaring five floors, each observed in its own way."""
    t = Tally()
    t.declare({"batch-mate": 0.9, "extend": 0.9, "per row": 0.5, "sometimes": 0.6, "never": 0.1})
    for i in range(n):
        with t.example():
            t.record("batch-mate", i < MIN_EXAMPLES - 2)  # 80% < 90%
            t.record("extend", i < MIN_EXAMPLES - 1)  # 90% holds
            for row in range(3):  # more observations than examples: judged over the observations
                t.record("per row", row == 0 or i == 0)
            if i % 2:  # observed in half the examples, always a hit: the other half count as misses
                t.record("sometimes", True)
    return t


def test_a_floor_is_judged_over_every_example_and_only_from_min_examples() -> None:
    assert ran(MIN_EXAMPLES - 1).shortfalls() == [], "fewer examples than MIN_EXAMPLES are not judged"
    n = MIN_EXAMPLES
    assert ran(n).shortfalls() == [
        f"batch-mate: {n - 2}/{n} = 80% of observations, floor 90%",
        f"per row: {n + 2}/{3 * n} = 40% of observations, floor 50%",
        f"sometimes: {n // 2}/{n} = 50% of examples ({n // 2} observed), floor 60%",
        f"never: 0/{n} = 0% of examples (0 observed), floor 10%",
    ]


def test_an_example_that_raises_leaves_no_observation() -> None:
    t = Tally()
    t.declare({"x": 0.5})
    with pytest.raises(RuntimeError), t.example():
        t.record("x", False)
        raise RuntimeError("an assume() that failed, say")
    assert (t.examples, t.shares["x"].observations) == (0, 0)


def test_floors_off_records_without_judging(monkeypatch: pytest.MonkeyPatch) -> None:
    t = ran(MIN_EXAMPLES)
    assert t.shortfalls()
    monkeypatch.setenv(FLOORS_ENV, "off")
    assert t.shortfalls() == [] and t.examples == MIN_EXAMPLES


def test_a_label_keeps_one_floor_and_must_be_declared() -> None:
    with pytest.raises(ValueError, match="share"):
        floors({"x": 1.5})
    t = Tally()
    t.declare({"x": 0.5})
    with pytest.raises(ValueError, match="floors 0.5 and 0.6"):
        t.declare({"x": 0.6})
    with tally(), pytest.raises(ValueError, match="not declared"):
        exercised("y", True)


@settings(max_examples=3 * MIN_EXAMPLES, derandomize=True, database=None)
@given(st.integers(0, 10**6))
@floors({"a huge n is even": 0.5})
def never_meets_its_precondition(n: int) -> None:
    if n > 10**6:  # a precondition no example meets: the label is never recorded
        exercised("a huge n is even", n % 2 == 0)


def test_a_declared_label_never_recorded_fails_its_floor() -> None:
    with tally() as t:
        never_meets_its_precondition()
    assert t.examples == 3 * MIN_EXAMPLES
    assert t.shortfalls() == [f"a huge n is even: 0/{t.examples} = 0% of examples (0 observed), floor 50%"]


def run_pytest(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_it.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    env.pop("HYPOTHESIS_PROFILE", None)
    env.pop(FLOORS_ENV, None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "oracle.pytest_plugin", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_gpu_tests_run_the_named_target_else_cuda_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_target: a named target that is not a CUDA one skips the GPU tests; where none is named they run cuda-bf16,
    skipped where it cannot run (here: no CUDA device)."""
    import torch

    monkeypatch.delenv(TARGET_ENV, raising=False)
    body = "def test_gpu(gpu_target):\n    assert gpu_target.name == 'cuda-bf16'\n"
    named = run_pytest(tmp_path, body, "--target", "cpu-bf16", "-rs")
    assert named.returncode == 0 and "target 'cpu-bf16' runs on cpu, these tests on cuda" in named.stdout, named.stdout
    default = run_pytest(tmp_path, body, "-rs")
    assert default.returncode == 0, default.stdout + default.stderr
    if not torch.cuda.is_available():
        assert "target 'cuda-bf16' cannot run here: device=cuda" in default.stdout, default.stdout


VACUOUS = """
from hypothesis import given, strategies as st
from oracle.coverage import exercised, floors

@given(st.integers(0, 10**6))
@floors({"n ends in 9": 0.5, "a huge n": 0.1})
def test_mostly_vacuous(n):
    exercised("n ends in 9", n % 10 == 9)
    if n > 10**6:
        exercised("a huge n", True)
"""


def test_a_passing_test_with_too_many_vacuous_examples_fails(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, VACUOUS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "too many vacuous examples" in proc.stdout and "n ends in 9:" in proc.stdout
    failure = proc.stdout.split("too many vacuous examples")[1].split("Captured vacuity floors")[0]
    assert "a huge n: 0/25 = 0% of examples (0 observed)" in failure, proc.stdout
    assert "its law went unchecked" in failure and "pytest properties -m kernel" in failure, failure


@pytest.mark.parametrize(("profile", "exit_code"), [("fast", 0), ("dev", 0), ("ci", 1)])
def test_profiles_of_few_examples_do_not_judge_floors(tmp_path: Path, profile: str, exit_code: int) -> None:
    many = VACUOUS.replace("import given", "import given, settings")
    many = many.replace("@given(", "@settings(max_examples=25)\n@given(")  # enough examples to judge floors
    proc = run_pytest(tmp_path, many, f"--hypothesis-profile={profile}")
    assert proc.returncode == exit_code, proc.stdout + proc.stderr


GREEDY_ONLY = """
import pytest
from oracle import strategies

def greedy(vocab_size, greedy=None, seeded=None, max_tokens=None):
    return strategies.sampling_params(vocab_size, greedy=True, seeded=seeded, max_tokens=max_tokens)

def pytest_collection_modifyitems(items):
    for item in items:  # the property's module imported sampling_params by name: patch its copy
        item.module.sampling_params = greedy
"""


def test_the_sampling_property_fails_when_its_strategies_draw_only_greedy_rows(tmp_path: Path) -> None:
    (tmp_path / "greedy_only.py").write_text(GREEDY_ONLY)
    prop = REPO / "properties" / "test_sampling_distribution.py"
    proc = run_pytest(tmp_path, "", "-p", "greedy_only", f"{prop}::test_sampler_matches_reference_on_synthetic_logits")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "too many vacuous examples" in proc.stdout, proc.stdout
    assert "sampled rows, each with a testable chi-square (>= 2 buckets): 0/" in proc.stdout, proc.stdout


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


ORDERED = """
import pytest
from hypothesis import settings
from hypothesis.internal.conjecture import engine

@pytest.mark.model
def test_real_model():
    print("RAN real model")

@pytest.mark.statistical
def test_statistical():
    print("RAN statistical")

def test_tiny():
    print("RAN tiny")

@pytest.mark.kernel
def test_kernel():
    print("RAN kernel", settings.get_current_profile_name(), engine.MAX_SHRINKING_SECONDS)
"""


@pytest.mark.parametrize("profile", ["fast", "ci"])
def test_cheapest_first_shrinking_bounded_and_provenance_in_the_header_and_junit(
    tmp_path: Path, profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMPLE_MARK", "7")  # allow-listed (EXAMPLE_*): recorded
    from oracle.pytest_plugin import DEFAULT_SHRINK_SECONDS, SHRINK_SECONDS

    (tmp_path / "a_plugin.py").write_text("__version__ = '1.2'\n")
    junit = tmp_path / "junit.xml"
    proc = run_pytest(
        tmp_path, ORDERED, "-s", "--plugin", "a_plugin", f"--hypothesis-profile={profile}", f"--junitxml={junit}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = [line.split("RAN ")[1].split()[0] for line in proc.stdout.splitlines() if "RAN " in line]
    assert ran == ["kernel", "tiny", "statistical", "real"], proc.stdout
    shrink = SHRINK_SECONDS.get(profile, DEFAULT_SHRINK_SECONDS)
    assert f"RAN kernel {profile} {shrink}" in proc.stdout and shrink <= 30, proc.stdout
    assert "target: cpu-fp32 (device=cpu" in proc.stdout.splitlines()[0], proc.stdout
    digest = hashlib.sha256((tmp_path / "a_plugin.py").read_bytes()).hexdigest()[:16]
    plugin = f"{tmp_path / 'a_plugin.py'}, sha256 {digest}, version 1.2"
    assert f"plugin a_plugin: {plugin}" in proc.stdout and "started (UTC): 20" in proc.stdout, proc.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["plugin a_plugin"] == plugin and properties["env EXAMPLE_MARK"] == "7", properties
