"""Runs each mutant's pytest targets in a fresh process and builds the kill table.

A mutant is *killed* when pytest exits with status 1 (tests failed) and at least one test failed; a crash,
a usage error, a collection error or a timeout is an *error*, never a kill. Before the mutants, a baseline runs
the union of their targets on the real engine: a kill only means something if those tests pass without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from . import MUTANTS
from .plugin import MUTANT_ENV, REPORT_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
BASELINE = "(baseline)"


@dataclass(frozen=True)
class RunResult:
    mutant: str  # BASELINE for the run without a mutant
    status: str  # "killed" | "survived" | "passed" | "failed" | "error" | "timeout"
    killer: str | None  # the first failing test
    failed: tuple[str, ...]
    passed: int
    seconds: float
    exitstatus: int
    log: str  # path of the pytest output

    @property
    def ok(self) -> bool:
        """A mutant must be killed; the baseline must pass."""
        return self.status == ("passed" if self.mutant == BASELINE else "killed")


def pytest_command(targets: Sequence[str], fast: bool) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "oracle.mutants.plugin", "-p", "no:cacheprovider", "-q"]
    if fast:
        cmd.append("-x")  # the first failure is the kill; the rest would only cost time
    return [*cmd, *targets]


def run_one(
    mutant: str | None, targets: Sequence[str], fast: bool, log_dir: Path, timeout: float | None = None
) -> RunResult:
    """Run ``targets`` under ``mutant`` (None: the baseline) in a fresh interpreter."""
    label = mutant or BASELINE
    log_path = log_dir / f"{mutant or 'baseline'}.log"
    env = dict(os.environ)
    env.pop(MUTANT_ENV, None)
    if mutant:
        env[MUTANT_ENV] = mutant
    if fast:
        env["HYPOTHESIS_PROFILE"] = "dev"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "outcome.json"
        env[REPORT_ENV] = str(report)
        start = time.perf_counter()
        with log_path.open("w") as log:
            try:
                proc = subprocess.run(
                    pytest_command(targets, fast),
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    check=False,
                )
                exitstatus = proc.returncode
            except subprocess.TimeoutExpired:
                exitstatus = -1
        seconds = time.perf_counter() - start
        outcome = json.loads(report.read_text()) if report.is_file() else {}
    failed = tuple(outcome.get("failed", ()))
    if exitstatus == -1:
        status = "timeout"
    elif exitstatus == 1 and failed and not outcome.get("collect_errors"):
        status = "killed" if mutant else "failed"
    elif exitstatus == 0:
        status = "survived" if mutant else "passed"
    else:
        status = "error"
    return RunResult(
        label,
        status,
        failed[0] if failed else None,
        failed,
        len(outcome.get("passed", ())),
        seconds,
        exitstatus,
        str(log_path),
    )


def targets_of(name: str, fast: bool) -> tuple[str, ...]:
    mutant = MUTANTS[name]
    return mutant.fast if fast else mutant.targets


def run_table(
    names: Sequence[str],
    fast: bool,
    log_dir: Path,
    baseline: bool = True,
    jobs: int = 1,
    timeout: float | None = None,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """The baseline (if asked) then every mutant in ``names``; results in that order."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []

    def done(result: RunResult) -> RunResult:
        if on_result is not None:
            on_result(result)
        return result

    if baseline:
        union = list(dict.fromkeys(t for n in names for t in targets_of(n, fast)))
        results.append(done(run_one(None, union, fast, log_dir, timeout)))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, n, targets_of(n, fast), fast, log_dir, timeout) for n in names]
        results += [done(f.result()) for f in futures]
    return results


def write_json(results: Sequence[RunResult], path: Path, fast: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(r), "ok": r.ok, "bug": MUTANTS[r.mutant].bug if r.mutant in MUTANTS else ""} for r in results]
    path.write_text(json.dumps({"fast": fast, "all_ok": all(r.ok for r in results), "runs": rows}, indent=1))
