"""benchmarks.baseline end to end: save a named baseline, compare against it under its gate, report without failing.

The suite is synthetic and its clock fake (--benchmark-timer): each call of the timed function advances the clock
by exactly 1 ms or 4 ms, so every round of a case times the same and nothing here depends on this machine's speed.
A regression is faked by editing the saved baseline's stats. Each pytest child loads only pytest-benchmark.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import baseline

REPO = Path(__file__).resolve().parents[1]
FAKE_CLOCK = """
now = 0.0


def clock():  # the timer: a nanosecond per read, so pytest-benchmark finds a precision
    global now
    now += 1e-9
    return now


def work(seconds):  # the timed function: the clock moves exactly this much
    global now
    now += seconds
"""
SUITE = """
import fakeclock


def test_one(benchmark):
    benchmark(fakeclock.work, 0.001)


def test_four(benchmark):
    benchmark(fakeclock.work, 0.004)
"""
NOT_NEEDED = ("oracle.pytest_plugin", "hypothesispytest", "anyio", "cacheprovider")  # plugins a child need not load
FAST = [arg for name in NOT_NEEDED for arg in ("-p", f"no:{name}")]
FAST += ["-q", "--benchmark-timer=fakeclock.clock", "--benchmark-max-time=0.01"]


@pytest.fixture
def suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic suite in tmp_path, which is also the cwd: the child's rootdir and .benchmarks stay there."""
    (tmp_path / "fakeclock.py").write_text(FAKE_CLOCK)
    path = tmp_path / "test_synthetic.py"
    path.write_text(SUITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(tmp_path)
    return path


def run(command: str, name: str, directory: Path, suite: Path, *options: str, pytest_args: tuple[str, ...] = ()) -> int:
    args = [command, name, "--dir", str(directory), "--suite", str(suite), *options]
    return baseline.main([*args, "--", *FAST, *pytest_args])


def save(name: str, directory: Path, suite: Path) -> Path:
    assert run("save", name, directory, suite) == 0
    return directory / f"{name}.json"


def slow_down(path: Path, case: str, factor: float, fields: tuple[str, ...] = ("min",)) -> None:
    """Make the baseline `factor` times faster on `fields` of one case, so the current run looks that much slower."""
    data = json.loads(path.read_text())
    for bench in data["benchmarks"]:
        if bench["name"] == case:
            for field in fields:
                bench["stats"][field] /= factor
    path.write_text(json.dumps(data))


def test_save_writes_the_stats_with_machine_and_commit_info(
    suite: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = save("syn", tmp_path / "baselines", suite)
    data = json.loads(path.read_text())
    stats = {b["name"]: b["stats"] for b in data["benchmarks"]}
    assert set(stats) == {"test_one", "test_four"}
    assert stats["test_one"]["min"] == pytest.approx(0.001, rel=1e-4)
    assert stats["test_four"]["median"] == pytest.approx(0.004, rel=1e-4)
    assert "data" not in stats["test_one"]  # stats only, not every round
    assert data["machine_info"]["node"] and data["machine_info"]["cpu"]
    assert "id" in data["commit_info"]
    assert f"saved {path.relative_to(tmp_path)}: 2 cases" in capfd.readouterr().out
    assert baseline.main(["list", "--dir", str(tmp_path / "baselines")]) == 0
    assert "syn: gate report; 2 cases" in capfd.readouterr().out


def test_a_failed_save_leaves_the_baseline_alone(suite: Path, tmp_path: Path) -> None:
    path = save("syn", tmp_path / "baselines", suite)
    before = path.read_text()
    assert run("save", "syn", tmp_path / "baselines", suite, pytest_args=("-k", "no_such_case")) != 0
    assert path.read_text() == before


@pytest.mark.parametrize(
    ("factor", "passes"), [(1.05, True), (1.5, False)], ids=["5%-slower-passes", "50%-slower-fails"]
)
def test_the_gate_fails_a_min_regression_beyond_it_only(
    suite: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], factor: float, passes: bool
) -> None:
    path = save("syn", tmp_path / "baselines", suite)
    slow_down(path, "test_one", factor)
    slow_down(path, "test_four", 100.0, fields=("median", "mean", "max"))  # min:10% reads min alone
    capfd.readouterr()
    rc = run("compare", "syn", tmp_path / "baselines", suite, "--gate", "min:10%")
    out = "".join(capfd.readouterr())  # pytest-benchmark logs the regressions to stderr
    assert (rc == 0) == passes, out
    assert "gate: min:10%" in out and "test_one (NOW)" in out
    if not passes:
        assert "Field 'min' has failed PercentageRegressionCheck: 50.0" in out
        assert "test_four" not in out.partition("Performance has regressed")[2]


@pytest.mark.parametrize(("name", "fails"), [("h200", True), ("cpu-2core", False)])
def test_each_baseline_has_its_own_gate(suite: Path, tmp_path: Path, name: str, fails: bool) -> None:
    """The GPU baseline gates on min at 10%; the shared CPU one reports only (benchmarks/README.md says why)."""
    assert baseline.GATES[name] == ("min:10%" if fails else baseline.REPORT)
    path = save(name, tmp_path / "baselines", suite)
    slow_down(path, "test_one", 1.5)
    assert (run("compare", name, tmp_path / "baselines", suite) != 0) == fails


def test_report_only_never_fails(suite: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = save("h200", tmp_path / "baselines", suite)
    for case in ("test_one", "test_four"):
        slow_down(path, case, 1000.0, fields=("min", "max", "mean", "median"))
    capfd.readouterr()
    assert run("compare", "h200", tmp_path / "baselines", suite, "--report-only") == 0
    out = "".join(capfd.readouterr())
    assert "report only" in out and "test_one (NOW)" in out and "Performance has regressed" not in out


def test_usage_errors_are_one_line_and_exit_2(
    suite: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Nothing runs: an unknown name, no name, a bad gate, or a file that is no baseline."""
    directory = tmp_path / "baselines"
    directory.mkdir()
    shutil.copy(REPO / "benchmarks/results/cpu-micro.json", directory / "stripped.json")  # stats only: no machine
    (directory / "broken.json").write_text("{")
    cases = {
        ("compare", "cpu-3core"): "no baseline named 'cpu-3core' in baselines (saved: broken, stripped)",
        ("compare", ""): "name a baseline",
        ("save", "../elsewhere"): "name a baseline",
        ("compare", "stripped"): "stripped.json has no machine_info",
        ("compare", "broken"): "broken.json is not a readable JSON file",
    }
    for (command, name), message in cases.items():
        assert run(command, name, directory, suite) == 2
        out, err = capfd.readouterr()
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
        assert "pytest" not in out  # no child ran
    save("syn", directory, suite)
    capfd.readouterr()
    assert run("compare", "syn", directory, suite, "--gate", "median:lots") == 2
    assert capfd.readouterr().err == "error: bad gate 'median:lots': expected 'report' or FIELD:N% / FIELD:SECONDS\n"


def test_benchmark_results_say_where_they_ran() -> None:
    """Baselines get torch, CUDA, the GPU and the threads next to pytest-benchmark's machine_info; the JSON of
    benchmarks.compare and profile_step carry the same plus host, CPU and Python."""
    from benchmarks.common import machine_info
    from benchmarks.conftest import pytest_benchmark_update_machine_info

    info: dict[str, object] = {"node": "from pytest-benchmark"}
    pytest_benchmark_update_machine_info(None, info)  # type: ignore[arg-type]
    assert info["node"] == "from pytest-benchmark" and info["torch"] == torch.__version__
    assert {"cuda", "gpu", "gpu_count", "flashinfer", "torch_threads", "OMP_NUM_THREADS"} <= set(info)
    host = machine_info()
    assert host["python"] and host["cpu"] and host["node"] is not None and host["torch"] == torch.__version__
