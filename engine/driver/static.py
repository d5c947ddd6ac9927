"""StaticDriver: plays the scheduler's role for examples, the oracle checks, properties and benchmarks.

It composes the parts: Pages (the KV pages and their page-table mapping), Requests (admission, rows, results) and
the Loop (launching and landing passes). A request reserves pages for its whole life (prompt + max_tokens) when it
is added, so a step never runs out of pages halfway. One driver drives an engine at a time, and serves one thread
at a time: it leaves a DriverClaim on its engine (engine.claim), a second driver is refused while the first has
running requests and, once built, makes the first unusable; a call from a second thread meanwhile gets
EngineBusyError.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..checks import checked_bool, checked_int, is_int
from ..core import SamplingParams
from ..engine import Engine
from ..errors import CapacityError, ConfigError, EngineBusyError, InvalidRequestError
from .loop import Loop
from .pages import Contiguous, PageLayout, PageOrder, Pages
from .requests import Admission, Generation, Requests, RequestState, generate_pairs


@dataclass(eq=False)
class DriverClaim:
    """What a driver leaves on its engine: its running requests, and why it may no longer be used, once it may not."""

    running: dict[int, RequestState]
    retired: str = ""


class StaticDriver:
    def __init__(
        self,
        engine: Engine,
        layout: PageLayout | PageOrder | None = None,
        record_logits: bool = False,
        max_prefill_tokens: int | None = None,
        eos_token_ids: Collection[int] | None = None,
    ) -> None:
        """Take over the engine's page-table rows and KV pages (see the module doc: one driver at a time).

        eos_token_ids: the tokens that finish a request not ignoring EOS (default: the model's EOS ids).
        """
        engine.check_open()
        if layout is not None and not isinstance(layout, (PageLayout, PageOrder)):
            raise ConfigError(f"layout={layout!r} is invalid: use a PageLayout, a PageOrder or None")
        if max_prefill_tokens is not None:
            max_prefill_tokens = checked_int(
                ConfigError, "max_prefill_tokens", max_prefill_tokens, lambda v: v >= 1, "use an int >= 1 or None"
            )
        if eos_token_ids is None:
            eos: frozenset[int] = frozenset(engine.model_config.eos_token_ids)
        elif isinstance(eos_token_ids, (str, bytes)) or not isinstance(eos_token_ids, Collection) or not all(
            is_int(t) for t in eos_token_ids
        ):
            raise ConfigError(f"eos_token_ids={eos_token_ids!r} is invalid: use a collection of token ids or None")
        else:
            eos = frozenset(int(t) for t in eos_token_ids)
        record_logits = checked_bool(ConfigError, "record_logits", record_logits)
        previous = engine.claimed_by
        if isinstance(previous, DriverClaim) and previous.running:
            raise EngineBusyError(
                f"this engine is driven by another StaticDriver with {len(previous.running)} running request(s) "
                f"(uids {sorted(previous.running)[:8]}); finish or abort them, or close() it, first"
            )
        self.engine = engine
        order = layout.order() if isinstance(layout, PageLayout) else layout or Contiguous()
        self.pages = Pages(engine, order)
        self.requests = Requests(engine, self.pages, eos, record_logits)
        self.loop = Loop(engine, self.pages, self.requests, max_prefill_tokens)
        self.claim = DriverClaim(self.requests.running)
        self._busy = threading.RLock()
        if isinstance(previous, DriverClaim):
            previous.retired = "a newer StaticDriver took over its engine; use that one"
        engine.claim(self.claim)
        engine.release_rows(range(engine.config.max_running_req))  # every row is this driver's now

    @property
    def running(self) -> dict[int, RequestState]:
        return self.requests.running

    @property
    def finished(self) -> dict[int, RequestState]:
        return self.requests.finished

    @property
    def page_size(self) -> int:
        return self.pages.page_size

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """Hold the driver for one call; a second thread meanwhile gets EngineBusyError, and nothing changes."""
        self.engine.check_open()
        if self.claim.retired:
            raise EngineBusyError(f"{what}: this StaticDriver cannot be used: {self.claim.retired}")
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError(
                f"{what}: this StaticDriver is in use by another thread; a driver serves one thread at a time"
            )
        try:
            # The engine too, for the whole call: no shutdown() or release_rows() lands between its engine calls.
            with self.engine.exclusive(what):
                yield
        finally:
            self._busy.release()

    def close(self) -> None:
        """Abort every running request and give the engine up; the driver cannot be used afterwards."""
        with self._exclusive("close"):
            for uid in list(self.running):
                self.requests.finish(self.running[uid], "abort")
            self.claim.retired = "it was closed"
            if self.engine.claimed_by is self.claim:
                self.engine.claim(None)

    def add(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams, chunk_sizes: Sequence[int] = ()
    ) -> int:
        """Admit a request: take a page-table row and reserve its pages. Raises CapacityError if none fit.

        Everything is checked before the row and pages are taken, so a rejected request leaks neither.
        """
        with self._exclusive("add"):
            admission = self.requests.check(prompt_ids, params, chunk_sizes)
            if not self.requests.free_rows:
                raise CapacityError(
                    f"all {self.engine.config.max_running_req} page-table rows are in use; wait for a request to "
                    "finish or raise max_running_req"
                )
            self.pages.allocator.reserve(admission.pages)
            return self.requests.admit(admission)

    def abort(self, uid: int) -> None:
        """Drop a running request and give its row and pages back."""
        with self._exclusive("abort"):
            if uid not in self.running:
                raise InvalidRequestError(f"uid {uid!r} is not a running request")
            self.requests.finish(self.running[uid], "abort")

    def step(self) -> dict[int, int]:
        """Run one forward pass (prefill of new requests first, else decode) and wait for it; returns {uid: new
        token}.

        A request whose logits have no token to sample (NonFiniteLogitsError) finishes with finish_reason
        "error", and the pass runs again for the others, who get exactly the tokens they would have got without
        it. If the pass fails otherwise (an error in the model, ...), the requests are left as they were, so
        step() can run again.
        """
        with self._exclusive("step"):
            return self.loop.step()

    def run(self) -> None:
        with self._exclusive("run"):
            self.loop.drive()

    def result(self, uid: int) -> Generation:
        return self.requests.result(uid)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """Run every prompt to completion, admitting requests as rows and pages free up; results in order.

        Admission is atomic: every prompt is checked first, so a bad one is refused (its index named) before any
        is admitted. A request that cannot continue comes back with finish_reason "error". If a step raises
        anyway, the requests of this call are dropped (rows and pages returned) before the error propagates.
        """
        with self._exclusive("generate"):
            pairs = generate_pairs(prompts, params)
            pending = deque(self.requests.check(p, sp, (), f"prompt {i}: ") for i, (p, sp) in enumerate(pairs))
            return self._run_admitting(pending, [], self.requests.next_uid)

    def _run_admitting(self, pending: deque[Admission], uids: list[int], first_uid: int) -> list[Generation]:
        """Step until `pending` is admitted and everything has finished; on an exception, drop this call's
        requests (`uids`, numbered from first_uid) before it propagates."""
        requests, allocator = self.requests, self.pages.allocator
        # Alone on the driver, the call can put the free pages and rows back in their order too, as if never run.
        free = (deque(allocator.free), allocator.reserved, deque(requests.free_rows)) if not self.running else None
        try:
            self.loop.drive(pending, uids)
        except BaseException:
            requests.drop(uids, first_uid)
            if free is not None:
                allocator.free, allocator.reserved, requests.free_rows = free
            raise
        return [self.result(u) for u in uids]
