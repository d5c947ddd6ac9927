"""The result types of a verify run: a :class:`Check` (value, limit, which side of the limit passes, status), the
plotted :class:`Figure` and the :class:`VerifyResult` the reports render."""

from __future__ import annotations

import shlex
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ..environment import Environment
from ..provenance import PluginFile
from ..target import Target

Status = Literal["pass", "fail", "not-tested", "error"]
PassesWhen = Literal["<=", ">=", "=="]
STATUSES: tuple[Status, ...] = get_args(Status)


def holds(value: float, limit: float, passes_when: PassesWhen) -> bool:
    """Whether value lies on the passing side of limit (NaN never does)."""
    if passes_when == "<=":
        return value <= limit
    if passes_when == ">=":
        return value >= limit
    return value == limit


@dataclass(frozen=True)
class Check:
    """One verdict. value: the measured quantity; limit: what it is held to; passes_when: the passing side of the
    limit; status: pass, fail, not-tested (nothing to test: e.g. a chi-square with one bucket, or a section not run
    after an error) or error (the section stopped: the engine raised); seconds: its share of its section's time."""

    section: str
    name: str
    status: Status
    value: float | None = None
    limit: float | None = None
    passes_when: PassesWhen | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @classmethod
    def measured(
        cls, section: str, name: str, value: float, limit: float, passes_when: PassesWhen, detail: str = ""
    ) -> Check:
        """A check whose status follows from value, limit and passes_when."""
        status: Status = "pass" if holds(value, limit, passes_when) else "fail"
        return cls(section, name, status, value, limit, passes_when, detail)

    @classmethod
    def error(cls, stage: str, exc: BaseException) -> Check:
        """The exception that stopped the run during `stage`, with where it was raised."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (raised at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        message = " ".join(str(exc).split()) or "(no message)"
        return cls("run", f"{stage}: {type(exc).__name__}", "error", detail=f"{type(exc).__name__}: {message}{where}")

    @classmethod
    def not_run(cls, stage: str, needed: str, raised: str) -> Check:
        """`stage` skipped: it needs the output of `needed`, which raised `raised` (recorded as its own error)."""
        detail = f"not run: it needs the output of {needed}, which raised {raised}"
        return cls("run", f"{stage}: not run", "not-tested", detail=detail)


def count_statuses(checks: Sequence[Check]) -> dict[Status, int]:
    """Checks per status, every status present."""
    return {s: sum(c.status == s for c in checks) for s in STATUSES}


@dataclass(frozen=True)
class Figure:
    """Observed vs expected frequencies of one sampled row, its most likely tokens first."""

    title: str
    labels: list[str]
    expected: list[float]
    observed: list[float]
    rest_expected: float
    rest_observed: float
    n: int


@dataclass
class VerifyResult:
    model: str
    plan: str
    target: Target
    dtype: str  # the engine's
    seed: int
    alpha: float  # per statistical test
    environment: Environment
    plugins: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    figure: Figure | None = None
    seconds: float = 0.0
    prompts: list[list[int]] = field(default_factory=list)
    started: str = ""  # UTC, ISO 8601
    plugin_files: list[PluginFile] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the allow-listed variables (oracle.provenance)
    rerun: str = ""  # the command line that reruns this verify

    def section_seconds(self, name: str) -> float:
        return sum(c.seconds for c in self.section(name))

    def counts(self) -> dict[Status, int]:
        return count_statuses(self.checks)

    @property
    def status(self) -> Literal["pass", "fail", "error"]:
        counts = self.counts()
        return "error" if counts["error"] else "fail" if counts["fail"] else "pass"

    @property
    def passed(self) -> bool:
        """No check failed and none errored (not-tested ones pass nothing, fail nothing)."""
        return self.status == "pass"

    def section(self, name: str) -> list[Check]:
        return [c for c in self.checks if c.section == name]

    def sections(self) -> list[str]:
        return list(dict.fromkeys(c.section for c in self.checks))


def rerun_command(model: str, target: str, plugins: Sequence[str], plan: str, seed: int) -> str:
    """The verify command line for these settings; plugins: loaded modules or entry points (``module:attr``)."""
    parts = ["python -m oracle verify", f"--model {shlex.quote(model)}", f"--target {shlex.quote(target)}"]
    modules = dict.fromkeys(p.partition(":")[0] for p in plugins)
    parts += [f"--plugin {shlex.quote(m)}" for m in modules]
    parts += ["--quick"] if plan == "quick" else []
    return " ".join([*parts, f"--seed {seed}"])
