"""Vacuity floors: a property says, for each example, whether it exercised the case it is about, and a run in which
too few did fails, so a strategy that drifts into trivial inputs cannot pass in silence.

A test declares its floors up front with ``@floors({label: floor, ...})``, placed directly on the test function
(under ``@given``; on a state machine's ``teardown``, which runs once per example), and its body calls
``exercised(label, hit)`` for each observation: an example, or a part of one such as a sampled row. The pytest plugin
opens a tally around every test call; the decorator counts each example that completes (an example that raised,
e.g. an ``assume`` that failed, leaves no observation behind). When the test passed and ran at least
``MIN_EXAMPLES`` examples, every declared label is judged over ``max(observations, examples)``: a label observed in
fewer examples than ran, or never, counts each missing observation as a miss, so a precondition that stops holding
fails the floor instead of silencing it. A label the running test did not declare raises ``ValueError``. Outside a
tally (a plain script, a REPL) only the ``hypothesis.event`` is recorded (shown by ``--hypothesis-show-statistics``).
``$HFPARITY_FLOORS=off`` records without judging: the mutant runs set it, so a kill is always a property's own
assertion, never a mutant that made examples vacuous.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import event
from hypothesis.control import currently_in_test_context

FLOORS_ENV = "HFPARITY_FLOORS"

MIN_EXAMPLES = 10
"""A test that ran fewer examples than this has its floors not judged; nor, in the pytest plugin, does any test under
a profile of fewer per test (`fast`'s 3, `dev`'s 5), whatever its share."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Share:
    floor: float
    hits: int = 0
    observations: int = 0


@dataclass
class Tally:
    """label -> its floor and how many observations exercised it, out of how many; and the examples that ran."""

    shares: dict[str, Share] = field(default_factory=dict)
    examples: int = 0
    pending: list[tuple[str, bool]] | None = None  # the running example's observations; None between examples

    def declare(self, declared: Mapping[str, float]) -> None:
        for label, floor in declared.items():
            share = self.shares.setdefault(label, Share(floor))
            if share.floor != floor:
                raise ValueError(f"coverage label {label!r} is declared with floors {share.floor} and {floor}")

    def record(self, label: str, hit: bool) -> None:
        if label not in self.shares or self.pending is None:
            raise ValueError(f"coverage label {label!r} is not declared by the running test's @floors")
        self.pending.append((label, hit))

    @contextlib.contextmanager
    def example(self) -> Iterator[None]:
        """One example: its observations count, with the example, only if it completes."""
        self.pending = []
        try:
            yield
            for label, hit in self.pending:
                self.shares[label].hits += hit
                self.shares[label].observations += 1
            self.examples += 1
        finally:
            self.pending = None

    def lines(self) -> list[str]:
        """One line per declared label: its hits, out of max(observations, examples), against its floor."""
        out = []
        for label, s in self.shares.items():
            total = max(s.observations, self.examples)
            share = f"{s.hits / total:.0%}" if total else "-"
            unit = "observations" if s.observations >= self.examples else f"examples ({s.observations} observed)"
            out.append(f"{label}: {s.hits}/{total} = {share} of {unit}, floor {s.floor:.0%}")
        return out

    def shortfalls(self, min_examples: int = MIN_EXAMPLES) -> list[str]:
        """The lines of the labels below their floor, if judged (none with $HFPARITY_FLOORS=off)."""
        if os.environ.get(FLOORS_ENV, "on") == "off" or self.examples < min_examples:
            return []
        return [
            line
            for line, s in zip(self.lines(), self.shares.values())
            if s.hits < s.floor * max(s.observations, self.examples)
        ]


_ACTIVE: ContextVar[Tally | None] = ContextVar("hfparity_coverage_tally", default=None)


def floors(declared: Mapping[str, float]) -> Callable[[F], F]:
    """Declare a test's labels and floors (each a share in [0, 1]); every call of the test is one example."""
    for label, floor in declared.items():
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor {floor!r} of {label!r} must be a share in [0, 1]")

    def decorate(test: F) -> F:
        @functools.wraps(test)
        def example(*args: Any, **kwargs: Any) -> Any:
            current = _ACTIVE.get()
            if current is None:
                return test(*args, **kwargs)
            current.declare(declared)
            with current.example():
                return test(*args, **kwargs)

        return example  # type: ignore[return-value]  # wraps keeps the signature Hypothesis and pytest read

    return decorate


def exercised(label: str, hit: bool) -> bool:
    """Record whether this observation exercised `label` (declared by the test's @floors); returns `hit`."""
    if currently_in_test_context():
        event(label, payload="exercised" if hit else "vacuous")
    current = _ACTIVE.get()
    if current is not None:
        current.record(label, bool(hit))
    return hit


@contextlib.contextmanager
def tally() -> Iterator[Tally]:
    """Collect the examples and observations made inside the block (the plugin wraps each test call in one)."""
    current = Tally()
    token = _ACTIVE.set(current)
    try:
        yield current
    finally:
        _ACTIVE.reset(token)
