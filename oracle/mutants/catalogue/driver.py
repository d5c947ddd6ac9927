"""Driver mutants: page mapping and release, atomic generate, one driver per engine, and the overlapped loop's
overrun and failed passes."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

from engine.core import SamplingParams
from engine.driver import Generation, Pages, RequestState, StaticDriver
from engine.driver.loop import Launch, Loop
from engine.driver.requests import Requests, generate_pairs
from engine.engine import Engine

from .base import swap

_ORIGINAL_RETIRE = Requests._retire
_ORIGINAL_DRIVER_INIT = StaticDriver.__init__
_ORIGINAL_LAND = Loop.land


def _map_pages_committing_first(self: Pages, seqs: list[RequestState], upto: list[int]) -> list[RequestState]:
    grants = self.grants(seqs, upto)
    writes = []
    for seq in grants:  # bug: each page is taken and appended before the page table is written
        (page,) = self.allocator.take(1)
        writes.append((seq.req.table_idx, len(seq.pages) * self.page_size, [page]))
        seq.pages.append(page)
    if writes:
        self.write(writes)
    return grants


def pages_mapped_before_table_write() -> contextlib.AbstractContextManager[None]:
    return swap(Pages, "map", _map_pages_committing_first)


def _finish_keeps_abort_reservation(self: Requests, seq: RequestState, reason: str, error: str | None = None) -> None:
    """An aborted request gives back its mapped pages, but the unmapped rest of its reservation stays reserved."""
    if reason == "abort":
        seq.reserved_pages = len(seq.pages)  # the bug: the unused reservation is forgotten, never released
    _ORIGINAL_RETIRE(self, seq, reason, error)


def pages_leak_on_abort() -> contextlib.AbstractContextManager[None]:
    return swap(Requests, "_retire", _finish_keeps_abort_reservation)


def _finish_drops_last_page_on_eos(self: Requests, seq: RequestState, reason: str, error: str | None = None) -> None:
    """A request that stops on EOS never returns its last mapped page to the free list (its reservation is right)."""
    if reason == "eos" and seq.pages:
        seq.pages = seq.pages[:-1]
        seq.reserved_pages -= 1  # the page counts as released from the reservation, but is in no list
    _ORIGINAL_RETIRE(self, seq, reason, error)


def pages_leak_on_eos() -> contextlib.AbstractContextManager[None]:
    return swap(Requests, "_retire", _finish_drops_last_page_on_eos)


def _generate_admitting_eagerly(
    self: StaticDriver, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[Generation]:
    """generate() admits each prompt as soon as it is checked (while a row and its pages are free), so a bad prompt
    later in the list leaves the earlier ones admitted and running when the error propagates. Otherwise it is the
    real generate: the same checks, the same admission order, the same results, the same cleanup on a failed step."""
    with self._exclusive("generate"):
        pending: deque[Any] = deque()
        uids: list[int] = []
        first_uid = self.requests.next_uid
        for i, (prompt, sp) in enumerate(generate_pairs(prompts, params)):
            pending.append(self.requests.check(prompt, sp, (), f"prompt {i}: "))
            self.requests.admit_what_fits(pending, uids)  # the bug: before the later prompts are checked
        return self._run_admitting(pending, uids, first_uid)


def generate_admits_eagerly() -> contextlib.AbstractContextManager[None]:
    return swap(StaticDriver, "generate", _generate_admitting_eagerly)


def _driver_init_without_owner_check(self: StaticDriver, engine: Engine, *args: Any, **kwargs: Any) -> None:
    """A new StaticDriver takes the engine without looking at its claim: it is never refused while another driver
    has running requests, and that driver is not retired, so both hand out the same rows and pages."""
    claim = engine.claimed_by
    engine.claim(None)
    try:
        _ORIGINAL_DRIVER_INIT(self, engine, *args, **kwargs)
    except BaseException:
        engine.claim(claim)
        raise


def second_driver_allowed() -> contextlib.AbstractContextManager[None]:
    return swap(StaticDriver, "__init__", _driver_init_without_owner_check)


# ---- the overlapped driver (issue #13) -------------------------------------------------------------------------------


def _land_keeping_the_overrun(self: Loop, launch: Launch) -> dict[int, int]:
    """A request that finished (EOS) while the next pass was in flight keeps that pass's token: its output runs one
    token past the EOS."""
    overrun = [i for i, (seq, partial) in enumerate(zip(launch.seqs, launch.partial)) if seq.finished and not partial]
    produced = _ORIGINAL_LAND(self, launch)
    tokens = launch.out.result().tolist()
    for i in overrun:
        launch.seqs[i].output_ids.append(tokens[i])
    return produced


def overrun_token_kept() -> contextlib.AbstractContextManager[None]:
    return swap(Loop, "land", _land_keeping_the_overrun)


def _withdraw_nothing(launch: Launch) -> Launch:
    """The pass started on top of a failed one is left in flight: it lands later, built on requests and random
    streams that were put back underneath it."""
    return launch


def failed_pass_successor_kept() -> contextlib.AbstractContextManager[None]:
    return swap(Loop, "withdraw", staticmethod(_withdraw_nothing))
