"""The driver's overlap loop: the next pass is built and launched while the device runs the current one, whose tokens
are waited for only then; a pass that fails or is interrupted leaves requests, pages and rows as they were."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..engine import Engine, ForwardOutput
from ..errors import NonFiniteLogitsError
from .pages import Pages
from .requests import Admission, Requests, RequestState

DECODE_LOOKAHEAD = 32  # tokens a decode step maps ahead, so most steps write no page-table entry


@dataclass(frozen=True)
class Rewind:
    """The running requests' chunk queues before a launch (the engine's step record restores their lengths)."""

    saved: tuple[tuple[RequestState, int, tuple[int, ...]], ...]

    @classmethod
    def of(cls, seqs: list[RequestState]) -> Rewind:
        return cls(tuple((seq, seq.req.cached_len, tuple(seq.chunks)) for seq in seqs))

    def restore(self) -> None:
        for seq, cached_len, chunks in self.saved:
            if seq.req.cached_len == cached_len:
                seq.chunks = deque(chunks)


@dataclass
class _Marks:
    """What hand_out may change, as it was (counts where releases only go to the fronts or entries are only added)."""

    free_pages: int
    reserved: int
    free_rows: int
    running: dict[int, RequestState]
    finished: int
    seqs: list[tuple[RequestState, int, int, int, list[int], bool, str, str | None]]


@dataclass
class Launch:
    seqs: list[RequestState]
    partial: list[bool]  # per request: a prefill chunk that yields no token
    out: ForwardOutput
    rewind: Rewind
    granted: list[RequestState]  # one entry per page it mapped


class Loop:

    def __init__(self, engine: Engine, pages: Pages, requests: Requests, max_prefill_tokens: int | None) -> None:
        self.engine = engine
        self.pages = pages
        self.requests = requests
        self.max_prefill_tokens = max_prefill_tokens

    def step(self) -> dict[int, int]:
        while True:
            launch = self.launch()
            if launch is None:
                return {}
            produced = self.land_or_retire(launch)
            if produced is not None:
                return produced

    def drive(self, pending: deque[Admission] | None = None, uids: list[int] | None = None) -> None:
        """Run until everything (and `pending`) has finished, overlapped; a request at EOS rides one more pass."""
        inflight: Launch | None = None
        try:
            while pending or self.requests.running or inflight is not None:
                if pending and uids is not None:
                    self.requests.admit_what_fits(pending, uids)
                nxt = self.launch()
                if inflight is not None and nxt is not None and inflight.out.failed:
                    nxt = self.withdraw(nxt)
                landing, inflight = inflight, None
                if landing is not None:
                    self.land_or_retire(landing)
                inflight = nxt
        finally:
            if inflight is not None:
                self.land_or_retire(inflight)

    def prefill_targets(self) -> list[tuple[RequestState, int]]:
        budget = self.max_prefill_tokens
        out = []
        for seq in self.requests.running.values():
            if not seq.prefilling:
                continue
            if budget is not None and budget <= 0:
                break
            req = seq.req
            n = seq.chunks.popleft() if seq.chunks else req.num_tokens - req.cached_len
            if budget is not None:
                if n > budget:
                    seq.chunks.appendleft(n - budget)
                    n = budget
                budget -= n
            out.append((seq, req.cached_len + n))
        return out

    def next_pass(self) -> tuple[list[RequestState], list[int] | None, Rewind, str] | None:
        """(requests, prefill chunk ends or None, rewind, phase); None when nothing can run."""
        rewind = Rewind.of(list(self.requests.running.values()))
        targets = self.prefill_targets()
        if targets:
            return [s for s, _ in targets], [end for _, end in targets], rewind, "prefill"
        seqs = [s for s in self.requests.running.values()
                if s.req.device_len - s.prompt_len < s.req.sampling_params.max_tokens]
        return (seqs, None, rewind, "decode") if seqs else None

    def launch(self) -> Launch | None:
        planned = self.next_pass()
        if planned is None:
            return None
        seqs, ends, rewind, phase = planned
        granted: list[RequestState] = []
        try:
            if ends is not None:
                granted = self.pages.map(seqs, ends)
            else:
                granted = self.pages.map(seqs, [self.decode_map_end(s) for s in seqs])
            partial = [end < s.req.num_tokens for s, end in zip(seqs, ends or [s.req.device_len for s in seqs])]
            batch, args = self.engine.prepare_batch([s.req for s in seqs], phase, ends)  # type: ignore[arg-type]
            return Launch(seqs, partial, self.engine.forward_batch(batch, args), rewind, granted)
        except BaseException:
            self.pages.unmap(granted)
            rewind.restore()
            raise

    def decode_map_end(self, seq: RequestState) -> int:
        """Slots a decode pass maps [0, end) of: nothing while the pass's slot is mapped, else DECODE_LOOKAHEAD ahead
        (so a page-table write comes once per lookahead, not once per step at page size 1)."""
        mapped = len(seq.pages) * self.pages.page_size
        if mapped >= seq.req.device_len:
            return 0
        return min(seq.req.device_len + DECODE_LOOKAHEAD, seq.reserved_pages * self.pages.page_size)

    def land(self, launch: Launch) -> dict[int, int]:
        """Wait for a pass's tokens and hand them out; a failed pass is put back and its error raised."""
        try:
            tokens = launch.out.result().tolist()
        except BaseException:
            self.pages.unmap(launch.granted)
            launch.rewind.restore()
            raise
        marks = self.marks(launch.seqs)
        try:
            return self.requests.hand_out(launch.seqs, launch.partial, tokens, launch.out.logits)
        except BaseException:  # an interrupt halfway: take the whole step back
            self.rollback(marks)
            launch.out.undo()
            self.pages.unmap(launch.granted)
            launch.rewind.restore()
            raise

    def land_or_retire(self, launch: Launch) -> dict[int, int] | None:
        """land; requests with nothing to sample finish with "error" (None: run the pass again for the others)."""
        try:
            return self.land(launch)
        except NonFiniteLogitsError as e:
            running = self.requests.running
            stuck = [uid for uid in e.uids if uid in running]
            if not stuck:
                raise
            for uid in stuck:
                self.requests.finish(running[uid], "error", str(e))
            return None

    @staticmethod
    def withdraw(launch: Launch) -> Launch | None:
        """Undo a pass started on top of a failed one (last in, first out); None: nothing in flight."""
        launch.out.undo()
        launch.rewind.restore()
        return None

    def marks(self, seqs: list[RequestState]) -> _Marks:
        allocator, requests = self.pages.allocator, self.requests
        # hand_out replaces a request's page list (finish) but never changes one, so each list is kept, not copied.
        return _Marks(
            len(allocator.free), allocator.reserved, len(requests.free_rows), dict(requests.running),
            len(requests.finished),
            [(seq, len(seq.output_ids), len(seq.logits), len(seq.req.token_ids), seq.pages, seq.finished,
              seq.finish_reason, seq.error) for seq in seqs],
        )

    def rollback(self, marks: _Marks) -> None:
        allocator, requests = self.pages.allocator, self.requests
        for _ in range(len(allocator.free) - marks.free_pages):
            allocator.free.popleft()
        allocator.reserved = marks.reserved
        for _ in range(len(requests.free_rows) - marks.free_rows):
            requests.free_rows.popleft()
        requests.running.clear()
        requests.running.update(marks.running)
        while len(requests.finished) > marks.finished:
            requests.finished.popitem()
        for seq, outputs, logits, tokens, pages, finished, reason, error in marks.seqs:
            del seq.output_ids[outputs:], seq.logits[logits:], seq.req.token_ids[tokens:]
            seq.pages, seq.finished, seq.finish_reason, seq.error = pages, finished, reason, error
