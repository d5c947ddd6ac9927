"""A static driver: plays the scheduler's role for examples, the oracle checks, properties and benchmarks.

It owns page-table rows and KV pages, builds each batch, calls forward_batch, and appends tokens. A request
reserves pages for its whole life (prompt + max_tokens) when it is added, so a step never runs out of pages
halfway; which physical pages it gets is decided lazily, by the PageLayout (a prefill maps what it writes, a
decode step maps up to DECODE_LOOKAHEAD tokens ahead). One driver owns an engine at a time, and serves one
thread at a time: a second driver is refused while the first has running requests (and, once built, makes the
first unusable); a call from a second thread meanwhile gets EngineBusyError.
"""

from __future__ import annotations

import itertools
import random
import threading
import weakref
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from .core import Req, SamplingParams, checked_bool, checked_int, is_int
from .device import upload
from .engine import Engine, ForwardOutput
from .errors import CapacityError, ConfigError, EngineBusyError, InvalidRequestError, NonFiniteLogitsError
from .validate import prompt_list

LayoutKind = Literal["contiguous", "shuffled", "interleaved"]
# Tokens of page-table slots a decode step maps beyond the one it needs; each mapping costs a page-table write
# (an upload and a scatter, ~0.1 ms of host time on the H200), so this batches 32 steps' worth into one.
DECODE_LOOKAHEAD = 32


@dataclass(frozen=True)
class PageLayout:
    """How physical pages are handed out.

    contiguous: ascending free list, each request takes its prefill pages in one run.
    shuffled: the free list is a seeded permutation.
    interleaved: a prefill batch takes pages round-robin across its requests.
    Freed pages go back to the front of the free list, so the next request reuses them.
    """

    kind: LayoutKind = "contiguous"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in get_args(LayoutKind):
            raise ConfigError(f"PageLayout kind={self.kind!r} is invalid: use one of {list(get_args(LayoutKind))}")
        object.__setattr__(self, "seed", checked_int(ConfigError, "PageLayout seed", self.seed, lambda v: True,
                                                     "use an int"))


class PageAllocator:
    def __init__(self, num_pages: int, layout: PageLayout) -> None:
        order = list(range(num_pages))
        if layout.kind == "shuffled":
            random.Random(layout.seed).shuffle(order)
        self.free: deque[int] = deque(order)
        self.reserved = 0
        self.total = num_pages

    @property
    def available(self) -> int:
        return len(self.free) - self.reserved

    def reserve(self, n: int) -> None:
        if n > self.total:
            raise CapacityError(
                f"the request needs {n} KV page(s) but the pool has only {self.total}; it can never fit: shorten "
                "the prompt, lower max_tokens, or build the engine with more pages (memory_ratio, num_page_override)"
            )
        if n > self.available:
            raise CapacityError(
                f"the request needs {n} KV page(s) but only {self.available} are free; wait for running "
                "requests to finish, or build the engine with more pages (memory_ratio, num_page_override)"
            )
        self.reserved += n

    def peek(self, n: int) -> list[int]:
        """The next n pages take() will hand out."""
        return list(itertools.islice(self.free, n))

    def take(self) -> int:
        """A page from a reservation made earlier."""
        assert self.reserved > 0, "take() without a reservation"
        self.reserved -= 1
        return self.free.popleft()

    def untake(self, page: int) -> None:
        """Undo the last take() of `page`: back to the front of the free list, and into the reservation."""
        self.free.appendleft(page)
        self.reserved += 1

    def release(self, pages: list[int], unused_reservation: int) -> None:
        self.free.extendleft(reversed(pages))
        self.reserved -= unused_reservation


@dataclass
class RequestState:
    """The driver's view of one request: its Req plus pages, outputs and prefill chunking."""

    req: Req
    prompt_len: int
    pages: list[int] = field(default_factory=list)
    reserved_pages: int = 0
    output_ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    chunks: deque[int] = field(default_factory=deque)
    finished: bool = False
    finish_reason: str = ""
    error: str | None = None

    @property
    def prefilling(self) -> bool:
        return not self.output_ids and self.req.cached_len < self.req.num_tokens


@dataclass
class Generation:
    uid: int
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "length", "eos", "abort", or "error" (the request could not continue)
    logits: list[torch.Tensor]  # one float32 [vocab] row per generated token, when recorded
    error: str | None = None  # why, when finish_reason is "error"


# (request, cached_len, device_len, prefill chunks) before a pass changed them
_Saved = tuple[RequestState, int, int, tuple[int, ...]]


def _restore(saved: list[_Saved]) -> None:
    """Put back the requests a pass that did not complete had advanced (the engine put back its own part)."""
    for seq, cached_len, device_len, chunks in saved:
        if seq.req.cached_len == cached_len:
            seq.req.device_len = device_len
            seq.chunks = deque(chunks)


@dataclass
class _Marks:
    """What a pass's hand-out may change, as it was before: free pages, reservations and rows (counts: releases
    go to the fronts), the running and finished requests, and each request of the pass."""

    free_pages: int
    reserved: int
    free_rows: int
    running: dict[int, RequestState]
    finished: dict[int, RequestState]
    seqs: list[tuple[RequestState, int, int, int, list[int], bool, str, str | None]]


@dataclass
class _Launch:
    """A pass started on the device, whose tokens the driver has not taken yet."""

    seqs: list[RequestState]
    partial: list[bool]  # per request: a prefill chunk that yields no token
    out: ForwardOutput
    saved: list[_Saved]
    granted: list[RequestState]  # the pages it mapped, one entry per page (_unmap takes them back)


@dataclass
class _Admission:
    """A checked request, ready to take a row and its pages."""

    ids: list[int]
    params: SamplingParams
    chunks: tuple[int, ...]
    pages: int


class StaticDriver:
    def __init__(
        self,
        engine: Engine,
        layout: PageLayout | None = None,
        record_logits: bool = False,
        max_prefill_tokens: int | None = None,
        eos_token_ids: Collection[int] | None = None,
    ) -> None:
        """Take over the engine's page-table rows and KV pages (see the module doc: one driver at a time).

        eos_token_ids: the tokens that finish a request not ignoring EOS (default: the model's EOS ids).
        """
        engine.check_open()
        if layout is not None and not isinstance(layout, PageLayout):
            raise ConfigError(f"layout={layout!r} is invalid: use a PageLayout or None")
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
        self.record_logits = checked_bool(ConfigError, "record_logits", record_logits)
        previous = engine.driver()
        if previous is not None and previous.running:
            raise EngineBusyError(
                f"this engine is driven by another StaticDriver with {len(previous.running)} running request(s) "
                f"(uids {sorted(previous.running)[:8]}); finish or abort them, or close() it, first"
            )
        self.engine = engine
        self.page_size = engine.config.page_size
        self.layout = layout or PageLayout()
        self.allocator = PageAllocator(engine.num_pages, self.layout)
        self.free_rows: deque[int] = deque(range(engine.config.max_running_req))
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = eos
        self.running: dict[int, RequestState] = {}
        self.finished: dict[int, RequestState] = {}
        self._next_uid = 0
        self._busy = threading.RLock()
        self._retired = ""  # why this driver may no longer be used, once it may not
        if previous is not None:
            previous._retired = "a newer StaticDriver took over its engine; use that one"
        engine.owner = weakref.ref(self)
        engine.release_rows(range(engine.config.max_running_req))  # every row is this driver's now

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """Hold the driver for one call; a second thread meanwhile gets EngineBusyError, and nothing changes."""
        self.engine.check_open()
        if self._retired:
            raise EngineBusyError(f"{what}: this StaticDriver cannot be used: {self._retired}")
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
                self._finish(self.running[uid], "abort")
            self._retired = "it was closed"
            if self.engine.driver() is self:
                self.engine.owner = None

    # ---- request lifecycle -------------------------------------------------------------------------------
    def add(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams, chunk_sizes: Sequence[int] = ()
    ) -> int:
        """Admit a request: take a page-table row and reserve its pages. Raises CapacityError if none fit.

        Everything is checked before the row and pages are taken, so a rejected request leaks neither.
        """
        with self._exclusive("add"):
            admission = self._check(prompt_ids, params, chunk_sizes)
            if not self.free_rows:
                raise CapacityError(
                    f"all {self.engine.config.max_running_req} page-table rows are in use; wait for a request to "
                    "finish or raise max_running_req"
                )
            self.allocator.reserve(admission.pages)
            return self._admit(admission)

    def _check(self, prompt_ids: object, params: object, chunk_sizes: object, where: str = "") -> _Admission:
        """Everything about one request that does not depend on what else is running; `where` prefixes errors."""
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"{where}params must be a SamplingParams, got {type(params).__name__}")
        try:
            ids = prompt_list(prompt_ids, self.engine.model_config.vocab_size)
            total = len(ids) + params.max_tokens
            if total > self.engine.max_seq_len:
                raise InvalidRequestError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                    f"max_seq_len={self.engine.max_seq_len}; shorten the prompt or lower max_tokens"
                )
            if not isinstance(chunk_sizes, (list, tuple)) or (chunk_sizes and (
                not all(is_int(c) and c > 0 for c in chunk_sizes) or sum(chunk_sizes) != len(ids)
            )):
                raise InvalidRequestError(
                    f"chunk_sizes={chunk_sizes!r} is invalid: use positive ints summing to the prompt length "
                    f"{len(ids)}, or () for one chunk"
                )
            pages = -(-total // self.page_size)
            if pages > self.allocator.total:
                self.allocator.reserve(pages)  # raises CapacityError: it can never fit
        except (InvalidRequestError, CapacityError) as e:
            if not where:
                raise
            raise type(e)(f"{where}{e}") from None
        return _Admission(ids, params, tuple(int(c) for c in chunk_sizes), pages)

    def _admit(self, admission: _Admission) -> int:
        """Take a row for a checked request whose pages are reserved."""
        uid = self._next_uid
        self._next_uid += 1
        params = admission.params
        req = Req(admission.ids, self.free_rows.popleft(), 0, params.max_tokens, uid, params)
        self.running[uid] = RequestState(
            req, len(admission.ids), reserved_pages=admission.pages, chunks=deque(admission.chunks)
        )
        return uid

    def _finish(self, seq: RequestState, reason: str, error: str | None = None) -> None:
        self.engine.release_rows([seq.req.table_idx])  # first: an interrupt there leaves the request as it was
        seq.finished = True
        seq.finish_reason = reason
        seq.error = error
        self.allocator.release(seq.pages, seq.reserved_pages - len(seq.pages))
        self.free_rows.appendleft(seq.req.table_idx)
        seq.pages = []
        del self.running[seq.req.uid]
        self.finished[seq.req.uid] = seq

    def abort(self, uid: int) -> None:
        """Drop a running request and give its row and pages back."""
        with self._exclusive("abort"):
            if uid not in self.running:
                raise InvalidRequestError(f"uid {uid!r} is not a running request")
            self._finish(self.running[uid], "abort")

    # ---- pages ----------------------------------------------------------------------------------------------
    def _page_grants(self, seqs: list[RequestState], upto: list[int]) -> list[RequestState]:
        """Which request each newly needed page goes to, in the order they are taken: enough pages for slots
        [0, upto) each; interleaved hands one page per request per round, so their pages alternate in memory."""
        need = [max(0, -(-n // self.page_size) - len(seq.pages)) for seq, n in zip(seqs, upto)]
        if self.layout.kind == "interleaved":
            return [seq for r in range(max(need, default=0)) for seq, k in zip(seqs, need) if k > r]
        return [seq for seq, k in zip(seqs, need) for _ in range(k)]

    def _map_pages(self, seqs: list[RequestState], upto: list[int]) -> list[RequestState]:
        """All or nothing: the page-table rows are written first (past a request's pages, nothing reads them),
        then the pages are taken and appended, with no call that can fail in between; returns the requests that
        got a page, once per page (what _unmap takes back)."""
        grants = self._page_grants(seqs, upto)
        if not grants:
            return grants
        pages = self.allocator.peek(len(grants))
        added: dict[int, int] = {}
        writes = []
        for seq, page in zip(grants, pages):
            index = len(seq.pages) + added.get(id(seq), 0)
            added[id(seq)] = added.get(id(seq), 0) + 1
            writes.append((seq.req.table_idx, index * self.page_size, page))
        self._write_pages(writes)
        for seq, page in zip(grants, pages):
            self.allocator.take()
            seq.pages.append(page)
        return grants

    def _unmap(self, grants: list[RequestState]) -> None:
        """Give back the pages a _map_pages granted, last first, so the free list is as it was."""
        for seq in reversed(grants):
            self.allocator.untake(seq.pages.pop())

    def _write_pages(self, writes: list[tuple[int, int, int]]) -> None:
        """One scatter into the page table for every page mapped this step (a write per page cost ~40 µs)."""
        table = self.engine.page_table
        width, ps = table.shape[1], self.page_size
        flat, slots = [], []
        for row, start, page in writes:
            for offset in range(min(ps, width - start)):
                flat.append(row * width + start + offset)
                slots.append(page * ps + offset)
        with self.engine.device.stream_context():  # after the passes in flight that read the table, in order
            packed = upload(torch.tensor([flat, slots], dtype=torch.int64), table.device)
            table.view(-1)[packed[0]] = packed[1].to(torch.int32)

    # ---- stepping -------------------------------------------------------------------------------------------
    def _prefill_targets(self) -> list[tuple[RequestState, int]]:
        """Requests still prefilling, with the device_len each reaches this step (chunks and budget apply)."""
        budget = self.max_prefill_tokens
        out = []
        for seq in self.running.values():
            if not seq.prefilling:
                continue
            if budget is not None and budget <= 0:
                break
            req = seq.req
            n = seq.chunks.popleft() if seq.chunks else req.num_tokens - req.cached_len
            if budget is not None:
                if n > budget:  # take what fits now, the rest of the chunk next step
                    seq.chunks.appendleft(n - budget)
                    n = budget
                budget -= n
            out.append((seq, req.cached_len + n))
        return out

    def step(self) -> dict[int, int]:
        """Run one forward pass (prefill of new requests first, else decode) and wait for it; returns {uid: new
        token}.

        A request whose logits have no token to sample (NonFiniteLogitsError) finishes with finish_reason
        "error", and the pass runs again for the others, who get exactly the tokens they would have got without
        it. If the pass fails otherwise (an error in the model, ...), the requests are left as they were, so
        step() can run again.
        """
        with self._exclusive("step"):
            while True:
                launch = self._launch()
                if launch is None:
                    return {}
                produced = self._land_or_retire(launch)
                if produced is not None:
                    return produced

    def _launch(self) -> _Launch | None:
        """Build and start the next pass on the device without waiting for it; None when nothing can run. If
        the pass cannot start, the requests are left as they were."""
        targets = self._next_pass()
        if targets is None:
            return None
        seqs, saved, phase = targets
        granted: list[RequestState] = []
        try:
            if phase == "prefill":
                granted = self._map_pages(seqs, [s.req.device_len for s in seqs])
            else:  # decode maps DECODE_LOOKAHEAD tokens ahead (within the reservation): most steps write no page
                granted = self._map_pages(
                    seqs, [min(s.req.device_len + DECODE_LOOKAHEAD, s.reserved_pages * self.page_size) for s in seqs]
                )
            partial = [s.req.is_partial_prefill for s in seqs]
            batch, args = self.engine.prepare_batch([s.req for s in seqs], phase)  # type: ignore[arg-type]
            return _Launch(seqs, partial, self.engine.forward_batch(batch, args), saved, granted)
        except BaseException:
            self._unmap(granted)
            _restore(saved)
            raise

    def _next_pass(self) -> tuple[list[RequestState], list[_Saved], str] | None:
        """The next pass: its requests (prefill targets with their new device_len), what every running request was
        before (for _restore) and the phase; None when nothing can run. A request whose tokens are all sampled,
        waiting for the host, is left out."""
        saved = [(seq, seq.req.cached_len, seq.req.device_len, tuple(seq.chunks)) for seq in self.running.values()]
        targets = self._prefill_targets()
        if targets:
            for seq, end in targets:
                seq.req.device_len = end
            return [s for s, _ in targets], saved, "prefill"
        seqs = [s for s in self.running.values() if s.req.device_len - s.prompt_len < s.req.sampling_params.max_tokens]
        return (seqs, saved, "decode") if seqs else None

    def _land(self, launch: _Launch) -> dict[int, int]:
        """Wait for a pass's tokens and hand them to its requests (those finished meanwhile are skipped); if it
        failed, its requests are put back and the error raised."""
        try:
            tokens = launch.out.result().tolist()
        except BaseException:
            self._unmap(launch.granted)
            _restore(launch.saved)
            raise
        marks = self._marks(launch.seqs)
        try:
            return self._hand_out(launch, tokens)
        except BaseException:  # an interrupt halfway: the whole step is taken back, the engine's part included
            self._rollback(marks)
            launch.out.undo()
            self._unmap(launch.granted)
            _restore(launch.saved)
            raise

    def _marks(self, seqs: list[RequestState]) -> _Marks:
        return _Marks(
            len(self.allocator.free), self.allocator.reserved, len(self.free_rows), dict(self.running),
            dict(self.finished),
            [(seq, len(seq.output_ids), len(seq.logits), len(seq.req.token_ids), list(seq.pages), seq.finished,
              seq.finish_reason, seq.error) for seq in seqs],
        )

    def _rollback(self, marks: _Marks) -> None:
        """Put the bookkeeping _hand_out touches back to `marks` (pages and rows it released went to the fronts)."""
        for _ in range(len(self.allocator.free) - marks.free_pages):
            self.allocator.free.popleft()
        self.allocator.reserved = marks.reserved
        for _ in range(len(self.free_rows) - marks.free_rows):
            self.free_rows.popleft()
        self.running.clear()
        self.running.update(marks.running)
        self.finished.clear()
        self.finished.update(marks.finished)
        for seq, outputs, logits, tokens, pages, finished, reason, error in marks.seqs:
            del seq.output_ids[outputs:], seq.logits[logits:], seq.req.token_ids[tokens:]
            seq.pages, seq.finished, seq.finish_reason, seq.error = pages, finished, reason, error

    def _hand_out(self, launch: _Launch, tokens: list[int]) -> dict[int, int]:
        produced: dict[int, int] = {}
        for i, (seq, was_partial) in enumerate(zip(launch.seqs, launch.partial)):
            if was_partial or seq.finished:
                continue
            token = tokens[i]
            seq.req.append_host(token)
            seq.output_ids.append(token)
            if self.record_logits:
                seq.logits.append(launch.out.logits[i].detach().to("cpu", torch.float32))
            produced[seq.req.uid] = token
            if len(seq.output_ids) >= seq.req.sampling_params.max_tokens:
                self._finish(seq, "length")
            elif token in self.eos_token_ids and not seq.req.sampling_params.ignore_eos:
                self._finish(seq, "eos")
        return produced

    def _land_or_retire(self, launch: _Launch) -> dict[int, int] | None:
        """_land, except that requests with nothing to sample finish with "error" (None: their pass must run
        again for the others, who were put back)."""
        try:
            return self._land(launch)
        except NonFiniteLogitsError as e:
            stuck = [uid for uid in e.uids if uid in self.running]
            if not stuck:
                raise
            for uid in stuck:
                self._finish(self.running[uid], "error", str(e))
            return None

    def _drive(self, pending: deque[_Admission] | None = None, uids: list[int] | None = None) -> None:
        """Run until everything (and `pending`, admitted as rows and pages free up) has finished, overlapped: the
        next pass is built and started while the device runs the current one, and only then are the current
        one's tokens waited for. A request that hits EOS rides one pass more, whose token is dropped."""
        inflight: _Launch | None = None
        try:
            while pending or self.running or inflight is not None:
                if pending and uids is not None:
                    self._admit_what_fits(pending, uids)
                nxt = self._launch()
                if inflight is not None and nxt is not None and inflight.out.failed:
                    nxt = self._withdraw(nxt)
                landing, inflight = inflight, None
                if landing is not None:
                    self._land_or_retire(landing)
                inflight = nxt
        finally:
            if inflight is not None:  # an exception (or interrupt) between launch and land: keep its tokens
                self._land_or_retire(inflight)

    @staticmethod
    def _withdraw(launch: _Launch) -> _Launch | None:
        """Undo a pass started on top of one that failed: last in, first out, so the failed pass is undone after
        the one built on it. Returns None: nothing is in flight any more."""
        launch.out.undo()
        _restore(launch.saved)
        return None

    def run(self) -> None:
        with self._exclusive("run"):
            self._drive()

    def result(self, uid: int) -> Generation:
        if uid not in self.finished:
            state = "still running" if uid in self.running else "unknown"
            raise InvalidRequestError(f"uid {uid!r} has no result: the request is {state}")
        seq = self.finished[uid]
        prompt = seq.req.token_ids[: seq.prompt_len]
        return Generation(uid, prompt, list(seq.output_ids), seq.finish_reason, seq.logits, seq.error)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """Run every prompt to completion, admitting requests as rows and pages free up; results in order.

        Admission is atomic: every prompt is checked first, so a bad one is refused (its index named) before any
        is admitted. A request that cannot continue comes back with finish_reason "error". If a step raises
        anyway, the requests of this call are dropped (rows and pages returned) before the error propagates.
        """
        with self._exclusive("generate"):
            pairs = self._generate_pairs(prompts, params)
            pending = deque(self._check(p, sp, (), f"prompt {i}: ") for i, (p, sp) in enumerate(pairs))
            return self._run_admitting(pending, [], self._next_uid)

    def _run_admitting(self, pending: deque[_Admission], uids: list[int], first_uid: int) -> list[Generation]:
        """Step until `pending` is admitted and everything has finished; on an exception, drop this call's
        requests (`uids`, numbered from first_uid) before it propagates."""
        # Alone on the driver, the call can put the free pages and rows back in their order too, as if never run.
        alone = not self.running
        free = (deque(self.allocator.free), self.allocator.reserved, deque(self.free_rows)) if alone else None
        try:
            self._drive(pending, uids)
        except BaseException:
            self._drop(uids, first_uid)
            if free is not None:
                self.allocator.free, self.allocator.reserved, self.free_rows = free
            raise
        return [self.result(u) for u in uids]

    @staticmethod
    def _generate_pairs(prompts: object, params: object) -> list[tuple[object, object]]:
        """generate()'s arguments as (prompt, params) pairs; the types and lengths are checked, not the values."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise InvalidRequestError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
        if isinstance(params, SamplingParams):
            plist: list[object] = [params] * len(prompts)
        elif isinstance(params, (list, tuple)):
            plist = list(params)
        else:
            raise InvalidRequestError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
        if len(plist) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        return list(zip(prompts, plist))

    def _admit_what_fits(self, pending: deque[_Admission], uids: list[int]) -> None:
        while pending and self.free_rows and self.allocator.available >= pending[0].pages:
            self.allocator.reserve(pending[0].pages)
            uids.append(self._admit(pending.popleft()))

    def _drop(self, uids: list[int], first_uid: int) -> None:
        """Forget the requests of a failed generate(), as if it had never run."""
        for uid in reversed(uids):  # newest first: rows go back to the free list in their old order
            if uid in self.running:
                self._finish(self.running[uid], "abort")
            self.finished.pop(uid, None)
        self._next_uid = first_uid
