"""Runs each mutant's pytest targets (its killers in mutants.toml) in a fresh process and builds the kill table.

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

from ..atomic import replacing
from ..coverage import FLOORS_ENV
from . import MUTANTS
from .killers import REPO_ROOT, killers
from .plugin import MUTANT_ENV, REPORT_ENV

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
    # The harness plugin by name too: a checkout that is not pip-installed has no entry point for it.
    cmd = [sys.executable, "-m", "pytest", "-p", "oracle.pytest_plugin", "-p", "oracle.mutants.plugin", "-q"]
    cmd += ["-p", "no:cacheprovider"]
    if fast:
        cmd.append("-x")  # the first failure is the kill; the rest would only cost time
    return [*cmd, *targets]


@dataclass(frozen=True)
class Job:
    targets: tuple[str, ...]
    profile: str | None  # Hypothesis profile; None keeps $HYPOTHESIS_PROFILE (the suite's default is ci)


def job_of(name: str, fast: bool) -> Job:
    kill = killers()[name]
    return Job(kill.fast, kill.fast_profile) if fast else Job(kill.targets, None)


def run_one(mutant: str | None, job: Job, fast: bool, log_path: Path, timeout: float | None = None) -> RunResult:
    """Run the job's targets under ``mutant`` (None: the baseline) in a fresh interpreter."""
    label = mutant or BASELINE
    env = dict(os.environ)
    env.pop(MUTANT_ENV, None)
    env[FLOORS_ENV] = "off"  # a kill must be a failed assertion, not examples the mutant made vacuous
    if mutant:
        env[MUTANT_ENV] = mutant
    if job.profile:
        env["HYPOTHESIS_PROFILE"] = job.profile
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "outcome.json"
        env[REPORT_ENV] = str(report)
        start = time.perf_counter()
        with log_path.open("w") as log:
            try:
                proc = subprocess.run(
                    pytest_command(job.targets, fast),
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


def run_baseline(names: Sequence[str], fast: bool, log_dir: Path, timeout: float | None) -> RunResult:
    """Every target of the named mutants on the real engine: one run per Hypothesis profile, merged."""
    by_profile: dict[str | None, list[str]] = {}
    for name in names:
        job = job_of(name, fast)
        group = by_profile.setdefault(job.profile, [])
        group += [t for t in job.targets if t not in group]
    runs = [
        run_one(None, Job(tuple(targets), profile), fast, log_dir / f"baseline-{profile or 'default'}.log", timeout)
        for profile, targets in by_profile.items()
    ]
    bad = [r for r in runs if r.status != "passed"]
    failed = tuple(t for r in runs for t in r.failed)
    return RunResult(
        BASELINE,
        bad[0].status if bad else "passed",
        failed[0] if failed else None,
        failed,
        sum(r.passed for r in runs),
        sum(r.seconds for r in runs),
        bad[0].exitstatus if bad else 0,
        ", ".join(r.log for r in runs),
    )


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
        results.append(done(run_baseline(names, fast, log_dir, timeout)))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, n, job_of(n, fast), fast, log_dir / f"{n}.log", timeout) for n in names]
        results += [done(f.result()) for f in futures]
    return results


REPORT_MARK = b'"all_ok"'  # a key only mutants.json has: a file holding it is this tool's, a rerun may replace it


def write_json(results: Sequence[RunResult], path: Path, fast: bool, target: str) -> None:
    rows = [{**asdict(r), "ok": r.ok, "bug": MUTANTS[r.mutant].bug if r.mutant in MUTANTS else ""} for r in results]
    record = {"fast": fast, "target": target, "all_ok": all(r.ok for r in results), "runs": rows}
    with replacing(path) as tmp, tmp.open("w") as fh:
        json.dump(record, fh, indent=1)
