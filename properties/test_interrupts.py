"""Property: an interrupt anywhere in a driver call leaves the driver and the engine as they were, and both still work.

A workload of driver calls (add a request, step, abort one; or one generate() of every request, which drops its
requests on an error) runs twice on a drawn tiny model and page size: once plainly, and once with a
KeyboardInterrupt injected at the k-th time the driver touches the engine (any attribute: a method call, the page
table, the device). k is drawn as an attribute, then one of its touches, so a rare point (the page table) is as
likely as a frequent one; this reaches every point between the driver's own bookkeeping and the engine's work, e.g.
between giving a request a page and writing it into the page table. The interrupted call must leave everything a
later call reads as it was before it (the driver's requests, rows, pages and reservations, the running requests'
page-table rows and last tokens, and the engine's live rows; KV past a request's cached length, and a free row's
entries, are scratch and may differ), and the call, made again, and every later one must give exactly the plain
run's tokens and logits.

Bug class: bookkeeping committed before the work it describes (a page appended to a request before its page-table
row is written: every later step of that request reads an unmapped slot). Vacuity floor: 80% of examples interrupt
a call (k is drawn within the touches the plain run made, so every example does).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.driver import StaticDriver
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, draw_engine
from oracle.rejection import engine_state
from oracle.strategies import requests, sampling_params, seeds

INTERRUPTED = "a call is interrupted inside the workload"


class Interrupting:
    """The engine as the driver sees it: once armed, raises KeyboardInterrupt at the `at`-th attribute the driver
    reads (0: never)."""

    def __init__(self, engine: Engine) -> None:
        object.__setattr__(self, "_engine", engine)
        self.arm(0)

    def arm(self, at: int) -> None:
        """Count touches from here on, and interrupt the `at`-th."""
        object.__setattr__(self, "touches", 0)
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "names", [])  # what each touch read, in order

    def __getattr__(self, name: str) -> Any:
        object.__setattr__(self, "touches", self.touches + 1)
        self.names.append(name)
        if self.touches == self.at:
            raise KeyboardInterrupt(f"injected at the driver's touch {self.at} of the engine ({name})")
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine, name, value)


def visible_state(driver: StaticDriver, engine: Engine) -> tuple[Any, ...]:
    """engine_state where later calls read it: no KV pool (slots past a request's cached length are scratch a pass
    may write), and of the page table and the rows' last tokens only the running requests' (a free row's are
    written again before anything reads them)."""
    _, table, last, *rest = engine_state(engine, driver)
    rows = {u: (s.req.table_idx, len(s.pages) * driver.page_size) for u, s in driver.running.items()}
    mapped = {u: (table[row, :width].tolist(), int(last[row])) for u, (row, width) in rows.items()}
    return (mapped, *rest)


def same(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    return all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before, after))


Call = tuple[str, int]


def make_call(driver: StaticDriver, specs: list[Any], kind: str, arg: int) -> Callable[[], object]:
    if kind == "add":
        return lambda: driver.add(list(specs[arg].prompt), specs[arg].params)
    if kind == "abort":
        return lambda: driver.abort(arg) if arg in driver.running else None
    if kind == "generate":
        return lambda: driver.generate([list(s.prompt) for s in specs], [s.params for s in specs])
    return driver.step


def run_workload(driver: StaticDriver, calls: list[Call], specs: list[Any], engine: Engine,
                 on_interrupt: Callable[[str], None]) -> dict[int, tuple[list[int], list[torch.Tensor]]]:
    """Apply the calls in order, then step until every request finished (an interrupted call is checked, then made
    again); every request's tokens and logits."""
    drain = [("step", 0)] * sum(1 + spec.params.max_tokens for spec in specs)  # more than any workload needs
    for kind, arg in [*calls, *drain]:
        call = make_call(driver, specs, kind, arg)
        before = visible_state(driver, engine)
        try:
            call()
        except KeyboardInterrupt:
            after = visible_state(driver, engine)
            assert same(before, after), f"an interrupt inside {kind}({arg}) changed the driver or the engine"
            on_interrupt(kind)
            call()
    return {uid: (list(s.output_ids), list(s.logits)) for uid, s in driver.finished.items()}


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({INTERRUPTED: 0.8})
def test_an_interrupt_anywhere_leaves_driver_and_engine_as_they_were(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    engine, page_size = draw_engine(data, tiny_models, engines)
    greedy = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(1, 6))
    specs = data.draw(st.lists(requests(TINY_VOCAB, 3 * page_size + 2, params=greedy), min_size=1, max_size=3),
                      label="requests")
    calls: list[Call] = [("generate", 0)]  # the whole workload in one call: it drops its requests on an error
    if not data.draw(st.booleans(), label="one generate call"):
        calls = [("add", i) for i in range(len(specs))]
        steps = data.draw(st.lists(st.sampled_from(["step", "abort"]), min_size=1, max_size=6), label="calls")
        calls += [(kind, data.draw(st.integers(0, len(specs) - 1), label="abort uid") if kind == "abort" else 0)
                  for kind in steps]
    counting = Interrupting(engine)  # never interrupts: counts the touches of the plain run
    counter = StaticDriver(counting, record_logits=True)  # type: ignore[arg-type]
    counting.arm(0)
    plain = run_workload(counter, calls, specs, engine, lambda _: None)
    # Which attribute first, then which of its touches: a rare one (the page table) is as likely as a frequent one.
    # Uniform from a drawn seed: Hypothesis' own draws favour the first touch of the first name.
    rnd = random.Random(data.draw(seeds, label="interrupt seed"))
    name = rnd.choice(sorted(set(counting.names)))
    at = rnd.choice([i + 1 for i, touched in enumerate(counting.names) if touched == name])
    event(f"interrupted at a touch of {name}")

    interrupting = Interrupting(engine)
    driver = StaticDriver(interrupting, record_logits=True)  # type: ignore[arg-type]
    interrupting.arm(at)
    interrupted: list[str] = []
    outcome = run_workload(driver, calls, specs, engine, interrupted.append)
    exercised(INTERRUPTED, bool(interrupted))
    assert outcome.keys() == plain.keys()
    for uid, (tokens, logits) in plain.items():
        assert outcome[uid][0] == tokens, f"request {uid}, interrupted in {interrupted}: {outcome[uid][0]} vs {tokens}"
        assert all(torch.equal(a, b) for a, b in zip(outcome[uid][1], logits)), f"request {uid}: logits changed"
