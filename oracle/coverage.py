"""Vacuity floors: a property says, for each example, whether it exercised the case it is about, and a run in which
too few did fails, so a strategy that drifts into trivial inputs cannot pass in silence.

``exercised(label, hit, floor)`` records one observation (an example, or a sampled row) with ``hypothesis.event``
(shown by ``--hypothesis-show-statistics``) and in the running test's tally. The pytest plugin opens a tally around
every test call; when the test passed and a label has at least ``MIN_OBSERVATIONS`` observations, a share of hits
below its floor fails the test, naming the label and the share. Outside a tally (a plain script, a REPL) only the
event is recorded. ``$HFPARITY_FLOORS=off`` records without judging: the mutant runs set it, so a kill is always a
property's own assertion, never a mutant that made examples vacuous.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from hypothesis import event
from hypothesis.control import currently_in_test_context

FLOORS_ENV = "HFPARITY_FLOORS"

MIN_OBSERVATIONS = 10
"""Below this many observations of a label (e.g. the `dev` profile's 5 examples) its floor is not judged."""


@dataclass
class Share:
    floor: float
    hits: int = 0
    total: int = 0


@dataclass
class Tally:
    """label -> how many observations exercised it, out of how many."""

    shares: dict[str, Share] = field(default_factory=dict)

    def add(self, label: str, hit: bool, floor: float) -> None:
        share = self.shares.setdefault(label, Share(floor))
        if share.floor != floor:
            raise ValueError(f"coverage label {label!r} is declared with floors {share.floor} and {floor}")
        share.hits += hit
        share.total += 1

    def shortfalls(self, min_observations: int = MIN_OBSERVATIONS) -> list[str]:
        """One line per label judged and below its floor (none with $HFPARITY_FLOORS=off)."""
        if os.environ.get(FLOORS_ENV, "on") == "off":
            return []
        return [
            f"{label}: {s.hits}/{s.total} = {s.hits / s.total:.0%} of observations, floor {s.floor:.0%}"
            for label, s in self.shares.items()
            if s.total >= min_observations and s.hits < s.floor * s.total
        ]


_ACTIVE: ContextVar[Tally | None] = ContextVar("hfparity_coverage_tally", default=None)


def exercised(label: str, hit: bool, floor: float) -> bool:
    """Record whether this observation exercised `label` (at least `floor` of them must); returns `hit`."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor={floor!r} must be a share in [0, 1]")
    if currently_in_test_context():
        event(label, payload="exercised" if hit else "vacuous")
    tally = _ACTIVE.get()
    if tally is not None:
        tally.add(label, bool(hit), floor)
    return hit


@contextlib.contextmanager
def tally() -> Iterator[Tally]:
    """Collect the observations made inside the block (the plugin wraps each test call in one)."""
    current = Tally()
    token = _ACTIVE.set(current)
    try:
        yield current
    finally:
        _ACTIVE.reset(token)
