"""The bad-input contract as checks: a rejected call raises the engine's typed error naming the field, changes no
state, and a valid generation afterwards is bitwise equal to one before.

Used by the bad-input catalogue (tests/test_bad_*.py) and the fuzz (properties/test_fuzz_invalid.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine import Engine, EngineError, SamplingParams
from engine.driver import StaticDriver


def expect(error: type[EngineError], call: Callable[[], object], *needles: str) -> EngineError:
    """call() raises `error` (that type or a subclass) and nothing else, and the message holds every needle."""
    try:
        call()
    except EngineError as e:
        if not isinstance(e, error):
            raise AssertionError(f"{type(e).__name__} instead of {error.__name__}: {e}") from e
        message = str(e)
        missing = [n for n in needles if n not in message]
        if missing:
            raise AssertionError(f"{missing} not named in the message: {message}") from e
        return e
    except Exception as e:  # noqa: BLE001 - anything but the engine's own errors is the failure under test
        raise AssertionError(f"{type(e).__name__} escaped instead of {error.__name__}: {e}") from e
    raise AssertionError(f"accepted instead of raising {error.__name__}")


def engine_state(engine: Engine, driver: StaticDriver | None = None) -> tuple[Any, ...]:
    """Everything a rejected call must leave alone: the KV pool (but its dummy page, scratch space that a refused
    step writes), the page table, the rows' device tokens, the driver's bookkeeping (with a driver) and, last, the
    engine's live rows."""
    kv = engine.kv_cache
    state: tuple[Any, ...] = (kv.buffer[:, :, : kv.dummy_page].clone(), engine.page_table.clone(),
                              engine.last_tokens.clone())
    if driver is not None:
        alloc = driver.pages.allocator
        lengths = {
            u: (s.req.cached_len, s.req.device_len, len(s.req.token_ids), tuple(s.pages), tuple(s.chunks))
            for u, s in driver.running.items()
        }
        state += ((list(driver.requests.free_rows), list(alloc.free), alloc.reserved, driver.requests.next_uid, lengths,
                   sorted(driver.finished)),)
    return (*state, dict(engine.live_rows))


def assert_same_state(before: tuple[Any, ...], after: tuple[Any, ...]) -> None:
    assert torch.equal(before[0], after[0]), "a rejected call changed the KV pool"
    assert torch.equal(before[1], after[1]), "a rejected call changed the page table"
    assert torch.equal(before[2], after[2]), "a rejected call changed the rows' last sampled tokens"
    assert before[3:-1] == after[3:-1], "a rejected call changed the driver's bookkeeping"
    assert before[-1] == after[-1], f"a rejected call changed the engine's live rows: {before[-1]} then {after[-1]}"


@dataclass(frozen=True)
class Witness:
    """A fixed valid generation: its tokens and the logits they came from."""

    tokens: tuple[tuple[int, ...], ...]
    logits: tuple[torch.Tensor, ...]

    def assert_equal(self, other: Witness) -> None:
        assert self.tokens == other.tokens, f"a valid generation changed: {self.tokens} then {other.tokens}"
        for i, (a, b) in enumerate(zip(self.logits, other.logits)):
            assert torch.equal(a, b), f"the logits of valid generation step {i} changed"


def witness(engine: Engine, driver: StaticDriver | None = None) -> Witness:
    """Drain `driver` (a new one when None), then generate two fixed requests, one greedy and one seeded sampled,
    recording their logits."""
    driver = driver or StaticDriver(engine)
    driver.run()
    vocab = engine.model_config.vocab_size
    prompts = [[(7 * i + 3) % vocab for i in range(5)], [(11 * i + 1) % vocab for i in range(3)]]
    params = [SamplingParams(max_tokens=3, ignore_eos=True),
              SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=3, ignore_eos=True, seed=1234)]
    saved, driver.requests.record_logits = driver.requests.record_logits, True
    try:
        gens = driver.generate(prompts, params)
    finally:
        driver.requests.record_logits = saved
    return Witness(tuple(tuple(g.output_ids) for g in gens), tuple(row for g in gens for row in g.logits))


@dataclass
class Contract:
    """An engine and the witness generation it gave before any bad call: checks that a call is rejected as the
    contract says, and that a valid generation afterwards is bitwise the same."""

    engine: Engine
    before: Witness

    @classmethod
    def of(cls, engine: Engine) -> Contract:
        return cls(engine, witness(engine))

    def rejects(
        self, error: type[EngineError], call: Callable[[], object], *needles: str, driver: StaticDriver | None = None
    ) -> EngineError:
        """call() raises `error` naming every needle, leaves the engine (and driver) as they were, and a valid
        generation afterwards (through `driver`, when given) equals the one before."""
        state = engine_state(self.engine, driver)
        e = expect(error, call, *needles)
        assert_same_state(state, engine_state(self.engine, driver))
        self.still_generates(driver)
        return e

    def still_generates(self, driver: StaticDriver | None = None) -> None:
        self.before.assert_equal(witness(self.engine, driver))
