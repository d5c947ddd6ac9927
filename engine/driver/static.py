"""StaticDriver, the scheduler of examples, oracle, properties and benchmarks: Pages, Requests and the Loop. A request
reserves its pages for life when added. One driver per engine (a DriverClaim on it: a second is refused while the
first has running requests, and retires it once built), one thread at a time (else EngineBusyError).
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
    """A driver's mark on its engine: its running requests, and why it is retired, once it is."""

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
        """Take over the engine's rows and pages. eos_token_ids: default the model's EOS ids."""
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
        engine.release_rows(range(engine.config.max_running_req))

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
        self.engine.check_open()
        if self.claim.retired:
            raise EngineBusyError(f"{what}: this StaticDriver cannot be used: {self.claim.retired}")
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError(
                f"{what}: this StaticDriver is in use by another thread; a driver serves one thread at a time"
            )
        try:
            # The engine too: no shutdown() or release_rows() lands between this call's engine calls.
            with self.engine.exclusive(what):
                yield
        finally:
            self._busy.release()

    def close(self) -> None:
        """Abort every running request and give the engine up for good."""
        with self._exclusive("close"):
            for uid in list(self.running):
                self.requests.finish(self.running[uid], "abort")
            self.claim.retired = "it was closed"
            if self.engine.claimed_by is self.claim:
                self.engine.claim(None)

    def add(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams, chunk_sizes: Sequence[int] = ()
    ) -> int:
        """Admit a request (a row, its pages reserved) and return its uid; CapacityError if it does not fit, and a
        rejected request takes nothing."""
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
        with self._exclusive("abort"):
            if uid not in self.running:
                raise InvalidRequestError(f"uid {uid!r} is not a running request")
            self.requests.finish(self.running[uid], "abort")

    def step(self) -> dict[int, int]:
        """One pass (prefill first, else decode), waited for: {uid: new token}. A request with nothing to sample
        finishes with "error" and the pass reruns for the others; any other failure leaves the requests as they were."""
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
        """Run every prompt to completion, results in order. All prompts are checked before any is admitted; if a step
        raises, this call's requests are dropped first."""
        with self._exclusive("generate"):
            pairs = generate_pairs(prompts, params)
            pending = deque(self.requests.check(p, sp, (), f"prompt {i}: ") for i, (p, sp) in enumerate(pairs))
            return self._run_admitting(pending, [], self.requests.next_uid)

    def _run_admitting(self, pending: deque[Admission], uids: list[int], first_uid: int) -> list[Generation]:
        requests, allocator = self.requests, self.pages.allocator
        # Alone on the driver, a failed call also puts the free pages and rows back in order.
        free = (deque(allocator.free), allocator.reserved, deque(requests.free_rows)) if not self.running else None
        try:
            self.loop.drive(pending, uids)
        except BaseException:
            requests.drop(uids, first_uid)
            if free is not None:
                allocator.free, allocator.reserved, requests.free_rows = free
            raise
        return [self.result(u) for u in uids]
