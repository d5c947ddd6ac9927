"""Runs verify's sections one at a time, each guarded on its own: an exception becomes an error check of section
"run" and the next sections still run; a section that needs an earlier one's output (the greedy generations) is
recorded as not run once that one raised, never as a pass. Each section's seconds are shared out among its checks
(JUnit times); each finished section is one progress step and is reported (the console's per-section lines)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .result import Check

T = TypeVar("T")


@dataclass(frozen=True)
class SectionRun:
    """One finished section: its name, its checks (an error's included) and how long it took."""

    name: str
    checks: list[Check]
    seconds: float


OnSection = Callable[[SectionRun], None]
Advance = Callable[[str], None]


class Sections:
    """Runs sections and collects their checks; catch_errors=False (--debug) lets an exception propagate."""

    def __init__(
        self, catch_errors: bool = True, advance: Advance | None = None, on_section: OnSection | None = None
    ) -> None:
        self.catch_errors = catch_errors
        self.advance = advance or (lambda _: None)
        self.on_section = on_section or (lambda _: None)
        self.checks: list[Check] = []
        self.raised: dict[str, str] = {}  # section -> the name of the exception it raised

    def value(self, name: str, make: Callable[[], T]) -> T | None:
        """make()'s value, or None once the exception it raised is recorded."""
        start = time.perf_counter()
        out, errors = self._guarded(name, make)
        self._file(name, errors, time.perf_counter() - start)
        return out

    def run(self, name: str, section: Callable[[], list[Check]], needs: Sequence[str] = ()) -> None:
        """Run `section` and keep its checks, unless a section it `needs` raised: then record it as not run."""
        start = time.perf_counter()
        blocked = next((n for n in needs if n in self.raised), None)
        if blocked is None:
            checks, errors = self._guarded(name, section)
        else:
            checks, errors = None, [Check.not_run(name, blocked, self.raised[blocked])]
        self._file(name, errors if checks is None else checks, time.perf_counter() - start)

    def _guarded(self, name: str, make: Callable[[], T]) -> tuple[T | None, list[Check]]:
        try:
            return make(), []
        except Exception as exc:  # the report records it (exit 3); --debug re-raises instead
            if not self.catch_errors:
                raise
            self.raised[name] = type(exc).__name__
            return None, [Check.error(name, exc)]

    def _file(self, name: str, checks: list[Check], seconds: float) -> None:
        share = seconds / len(checks) if checks else 0.0
        timed = [dataclasses.replace(c, seconds=share) for c in checks]
        self.checks += timed
        self.advance(name)
        self.on_section(SectionRun(name, timed, seconds))
