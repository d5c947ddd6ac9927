"""A static driver: plays the scheduler's role for examples, the oracle checks, properties and benchmarks.

It owns page-table rows and KV pages, builds each batch, calls forward_batch, and appends tokens. A request
reserves pages for its whole life (prompt + max_tokens) when it is added, so a step never runs out of pages
halfway; which physical pages it gets is decided lazily, by the PageLayout (a prefill maps what it writes, a
decode step maps up to DECODE_LOOKAHEAD tokens ahead).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from .core import Req, SamplingParams
from .device import upload
from .engine import Engine
from .errors import CapacityError, ConfigError, InvalidRequestError
from .validate import is_int, prompt_tensor

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

    def take(self) -> int:
        """A page from a reservation made earlier."""
        assert self.reserved > 0, "take() without a reservation"
        self.reserved -= 1
        return self.free.popleft()

    def release(self, pages: list[int], unused_reservation: int) -> None:
        self.free.extendleft(reversed(pages))
        self.reserved -= unused_reservation


@dataclass
class RequestState:
    """The driver's view of one request: its Req plus pages, outputs and prefill chunking."""

    req: Req
    pages: list[int] = field(default_factory=list)
    reserved_pages: int = 0
    output_ids: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    chunks: deque[int] = field(default_factory=deque)
    finished: bool = False
    finish_reason: str = ""

    @property
    def prefilling(self) -> bool:
        return not self.output_ids and self.req.cached_len < self.req.num_tokens


@dataclass
class Generation:
    uid: int
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "length" or "eos"
    logits: list[torch.Tensor]  # one float32 [vocab] row per generated token, when recorded


class StaticDriver:
    def __init__(
        self,
        engine: Engine,
        layout: PageLayout | None = None,
        record_logits: bool = False,
        max_prefill_tokens: int | None = None,
        eos_token_ids: Collection[int] | None = None,
    ) -> None:
        """eos_token_ids: the tokens that finish a request not ignoring EOS (default: the model's EOS ids)."""
        if max_prefill_tokens is not None and (not is_int(max_prefill_tokens) or max_prefill_tokens <= 0):
            raise ConfigError(f"max_prefill_tokens={max_prefill_tokens!r} is invalid: use an int >= 1 or None")
        self.engine = engine
        self.page_size = engine.config.page_size
        self.allocator = PageAllocator(engine.num_pages, layout or PageLayout())
        self.layout = layout or PageLayout()
        self.free_rows: deque[int] = deque(range(engine.config.max_running_req))
        self.record_logits = record_logits
        self.max_prefill_tokens = max_prefill_tokens
        self.eos_token_ids = frozenset(
            engine.model_config.eos_token_ids if eos_token_ids is None else (int(t) for t in eos_token_ids)
        )
        self.running: dict[int, RequestState] = {}
        self.finished: dict[int, RequestState] = {}
        self._next_uid = 0

    # ---- request lifecycle -------------------------------------------------------------------------------
    def add(
        self, prompt_ids: Sequence[int] | torch.Tensor, params: SamplingParams, chunk_sizes: Sequence[int] = ()
    ) -> int:
        """Admit a request: take a page-table row and reserve its pages. Raises CapacityError if none fit.

        Everything is checked before the row and pages are taken, so a rejected request leaks neither.
        """
        self.engine.check_open()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = prompt_tensor(prompt_ids, self.engine.model_config.vocab_size)
        total = len(ids) + params.max_tokens
        if total > self.engine.max_seq_len:
            raise InvalidRequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                f"max_seq_len={self.engine.max_seq_len}; shorten the prompt or lower max_tokens"
            )
        if chunk_sizes and (
            not all(is_int(c) and c > 0 for c in chunk_sizes) or sum(chunk_sizes) != len(ids)
        ):
            raise InvalidRequestError(
                f"chunk_sizes {list(chunk_sizes)} must be positive ints summing to the prompt length {len(ids)}"
            )
        if not self.free_rows:
            raise CapacityError(
                f"all {self.engine.config.max_running_req} page-table rows are in use; wait for a request to "
                "finish or raise max_running_req"
            )
        pages = -(-total // self.page_size)
        self.allocator.reserve(pages)
        uid = self._next_uid
        self._next_uid += 1
        req = Req(ids, self.free_rows.popleft(), 0, params.max_tokens, uid, params)
        self.running[uid] = RequestState(req, reserved_pages=pages, chunks=deque(chunk_sizes))
        return uid

    def _finish(self, seq: RequestState, reason: str) -> None:
        seq.finished = True
        seq.finish_reason = reason
        self.allocator.release(seq.pages, seq.reserved_pages - len(seq.pages))
        self.free_rows.appendleft(seq.req.table_idx)
        seq.pages = []
        del self.running[seq.req.uid]
        self.finished[seq.req.uid] = seq

    def abort(self, uid: int) -> None:
        """Drop a running request and give its row and pages back."""
        if uid not in self.running:
            raise InvalidRequestError(f"uid {uid!r} is not a running request")
        self._finish(self.running[uid], "abort")

    # ---- pages ----------------------------------------------------------------------------------------------
    def _grow(self, seq: RequestState, upto: int, writes: list[tuple[int, int, int]]) -> bool:
        """Give seq one more page if slots [0, upto) need it, noting its page-table write; returns whether a page
        was added."""
        if len(seq.pages) * self.page_size >= upto:
            return False
        page = self.allocator.take()
        writes.append((seq.req.table_idx, len(seq.pages) * self.page_size, page))
        seq.pages.append(page)
        return True

    def _map_pages(self, seqs: list[RequestState], upto: list[int]) -> None:
        writes: list[tuple[int, int, int]] = []
        if self.layout.kind == "interleaved":
            grew = True
            while grew:  # one page per request per round: their pages alternate in memory
                grew = False
                for seq, n in zip(seqs, upto):
                    grew |= self._grow(seq, n, writes)
        else:
            for seq, n in zip(seqs, upto):
                while self._grow(seq, n, writes):
                    pass
        if writes:
            self._write_pages(writes)

    def _write_pages(self, writes: list[tuple[int, int, int]]) -> None:
        """One scatter into the page table for every page mapped this step (a write per page cost ~40 µs)."""
        table = self.engine.page_table
        width, ps = table.shape[1], self.page_size
        flat, slots = [], []
        for row, start, page in writes:
            for offset in range(min(ps, width - start)):
                flat.append(row * width + start + offset)
                slots.append(page * ps + offset)
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
        """Run one forward pass (prefill of new requests first, else decode); returns {uid: new token}.

        If the pass fails (an error in the model, NonFiniteLogitsError, ...), the requests are left as they were,
        so step() can run again (after abort() of the requests a NonFiniteLogitsError names).
        """
        self.engine.check_open()
        saved = [(seq, seq.req.cached_len, seq.req.device_len, tuple(seq.chunks)) for seq in self.running.values()]
        try:
            return self._step()
        except BaseException:
            for seq, cached_len, device_len, chunks in saved:
                if seq.req.cached_len == cached_len:  # the forward pass did not complete for it
                    seq.req.device_len = device_len
                    seq.chunks = deque(chunks)
            raise

    def _step(self) -> dict[int, int]:
        targets = self._prefill_targets()
        phase = "prefill" if targets else "decode"
        if targets:
            seqs = [s for s, _ in targets]
            for seq, end in targets:
                seq.req.device_len = end
        else:
            seqs = list(self.running.values())
        if not seqs:
            return {}
        if targets:
            self._map_pages(seqs, [s.req.device_len for s in seqs])
        else:  # decode maps DECODE_LOOKAHEAD tokens ahead (within the reservation): most steps write no page
            self._map_pages(
                seqs, [min(s.req.device_len + DECODE_LOOKAHEAD, s.reserved_pages * self.page_size) for s in seqs]
            )
        partial = [s.req.is_partial_prefill for s in seqs]
        batch, args = self.engine.prepare_batch([s.req for s in seqs], phase)  # type: ignore[arg-type]
        out = self.engine.forward_batch(batch, args)
        out.copy_done_event.synchronize()
        produced: dict[int, int] = {}
        tokens = out.next_tokens_cpu.tolist()
        for i, (seq, was_partial) in enumerate(zip(seqs, partial)):
            if was_partial:
                continue
            token = tokens[i]
            seq.req.append_host(token)
            seq.output_ids.append(token)
            if self.record_logits:
                seq.logits.append(out.logits[i].detach().to("cpu", torch.float32))
            produced[seq.req.uid] = token
            if len(seq.output_ids) >= seq.req.sampling_params.max_tokens:
                self._finish(seq, "length")
            elif token in self.eos_token_ids and not seq.req.sampling_params.ignore_eos:
                self._finish(seq, "eos")
        return produced

    def run(self) -> None:
        while self.running:
            self.step()

    def result(self, uid: int) -> Generation:
        if uid not in self.finished:
            state = "still running" if uid in self.running else "unknown"
            raise InvalidRequestError(f"uid {uid!r} has no result: the request is {state}")
        seq = self.finished[uid]
        n_out = len(seq.output_ids)
        prompt = seq.req.input_ids[: len(seq.req.input_ids) - n_out].tolist()
        return Generation(uid, prompt, list(seq.output_ids), seq.finish_reason, seq.logits)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Generation]:
        """Run every prompt to completion, admitting requests as rows and pages free up."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise InvalidRequestError(f"{len(prompts)} prompts but {len(plist)} SamplingParams")
        pending = deque(zip(prompts, plist))
        uids: list[int] = []
        while pending or self.running:
            while pending:
                try:
                    uids.append(self.add(*pending[0]))
                except CapacityError:
                    if not self.running:
                        raise  # it can never fit, even with everything else finished
                    break
                pending.popleft()
            self.step()
        return [self.result(u) for u in uids]
