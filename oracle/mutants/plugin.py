"""pytest plugin (``-p oracle.mutants.plugin``): runs the whole session with the mutant named by $ENGINE_MUTANT.

The patch is applied in ``pytest_configure``, before any test runs, and undone in ``pytest_unconfigure``. With
$ENGINE_MUTANT_REPORT set, the outcome (failed node ids, collection errors) is written there as JSON for the kill
table. Hypothesis examples found under a mutant are never saved and never shrunk (see _quiet_hypothesis_profile).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from . import MUTANTS, activate

MUTANT_ENV = "ENGINE_MUTANT"
REPORT_ENV = "ENGINE_MUTANT_REPORT"


class _MutantSession:
    """Holds the active patch and the outcome of one pytest session."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack = contextlib.ExitStack()
        self.outcome: dict[str, list[str]] = {"failed": [], "passed": [], "skipped": [], "collect_errors": []}
        if name:
            self.stack.enter_context(activate(name))

    def pytest_report_header(self) -> str:
        return f"mutant: {self.name} ({MUTANTS[self.name].bug})" if self.name else "mutant: none (baseline)"

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # a module that does not import is an error, not a kill
            self.outcome["collect_errors"].append(report.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed:
            self.outcome["failed"].append(report.nodeid)
        elif report.skipped:
            self.outcome["skipped"].append(report.nodeid)
        elif report.when == "call":
            self.outcome["passed"].append(report.nodeid)
        return report

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        path = os.environ.get(REPORT_ENV)
        if path:
            record = {"mutant": self.name, "exitstatus": int(exitstatus), **self.outcome}
            Path(path).write_text(json.dumps(record, indent=1))


def _quiet_hypothesis_profile() -> None:
    """Derive a profile from the active one that never writes the example database (examples found under a
    mutant would replay against the real engine) and never shrinks (a kill needs one failing example, not the
    smallest; shrinking replays forward passes for minutes). Hypothesis copies settings into each @settings
    decorator when the test module is imported, so this must run before collection and after the conftests
    loaded their own profile: hence trylast in pytest_configure."""
    from hypothesis import Phase, settings

    current = settings()  # a copy of the active profile
    phases = [p for p in current.phases if p is not Phase.shrink]
    settings.register_profile("oracle-mutants", parent=current, database=None, phases=phases)
    settings.load_profile("oracle-mutants")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    name = os.environ.get(MUTANT_ENV, "")
    if name and name not in MUTANTS:
        raise pytest.UsageError(f"${MUTANT_ENV}={name!r} is not a mutant; known: {', '.join(MUTANTS)}")
    _quiet_hypothesis_profile()
    config.pluginmanager.register(_MutantSession(name), "oracle-mutant-session")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.pluginmanager.get_plugin("oracle-mutant-session")
    if isinstance(session, _MutantSession):
        session.stack.close()
