"""The result types of a verify run: a :class:`Check` (value, limit, which side of the limit passes, status), the
plotted :class:`Figure` and the :class:`VerifyResult` the reports render."""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ..environment import Environment
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
    limit; status: pass, fail, not-tested (nothing to test: e.g. a chi-square with one bucket) or error (the run
    stopped: the engine raised)."""

    section: str
    name: str
    status: Status
    value: float | None = None
    limit: float | None = None
    passes_when: PassesWhen | None = None
    detail: str = ""

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
