"""The driver's requests: their state, admission checks, the running and finished tables with their rows, handing
out a pass's tokens, and finishing."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from ..checks import is_int
from ..core import Req, SamplingParams
from ..engine import Engine
from ..errors import CapacityError, InvalidRequestError
from ..validate import prompt_list
from .pages import Pages


@dataclass
class RequestState:

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
    finish_reason: str  # "length", "eos", "abort", or "error"
    logits: list[torch.Tensor]  # one float32 [vocab] row per generated token, when recorded
    error: str | None = None


@dataclass
class Admission:

    ids: list[int]
    params: SamplingParams
    chunks: tuple[int, ...]
    pages: int


class Requests:

    def __init__(self, engine: Engine, pages: Pages, eos_token_ids: frozenset[int], record_logits: bool) -> None:
        self.engine = engine
        self.pages = pages
        self.eos_token_ids = eos_token_ids
        self.record_logits = record_logits
        self.free_rows: deque[int] = deque(range(engine.config.max_running_req))
        self.running: dict[int, RequestState] = {}
        self.finished: dict[int, RequestState] = {}
        self.next_uid = 0

    def check(self, prompt_ids: object, params: object, chunk_sizes: object, where: str = "") -> Admission:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"{where}params must be a SamplingParams, got {type(params).__name__}")
        engine, allocator = self.engine, self.pages.allocator
        try:
            ids = prompt_list(prompt_ids, engine.model_config.vocab_size)
            total = len(ids) + params.max_tokens
            if total > engine.max_seq_len:
                raise InvalidRequestError(
                    f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
                    f"max_seq_len={engine.max_seq_len}; shorten the prompt or lower max_tokens"
                )
            if not isinstance(chunk_sizes, (list, tuple)) or (chunk_sizes and (
                not all(is_int(c) and c > 0 for c in chunk_sizes) or sum(chunk_sizes) != len(ids)
            )):
                raise InvalidRequestError(
                    f"chunk_sizes={chunk_sizes!r} is invalid: use positive ints summing to the prompt length "
                    f"{len(ids)}, or () for one chunk"
                )
            pages = -(-total // self.pages.page_size)
            if pages > allocator.total:
                allocator.reserve(pages)  # CapacityError: it can never fit
        except (InvalidRequestError, CapacityError) as e:
            if not where:
                raise
            raise type(e)(f"{where}{e}") from None
        return Admission(ids, params, tuple(int(c) for c in chunk_sizes), pages)

    def admit(self, admission: Admission) -> int:
        uid = self.next_uid
        self.next_uid += 1
        params = admission.params
        req = Req(admission.ids, self.free_rows.popleft(), 0, params.max_tokens, uid, params)
        self.running[uid] = RequestState(
            req, len(admission.ids), reserved_pages=admission.pages, chunks=deque(admission.chunks)
        )
        return uid

    def admit_what_fits(self, pending: deque[Admission], uids: list[int]) -> None:
        while pending and self.free_rows and self.pages.allocator.available >= pending[0].pages:
            self.pages.allocator.reserve(pending[0].pages)
            uids.append(self.admit(pending.popleft()))

    def finish(self, seq: RequestState, reason: str, error: str | None = None) -> None:
        self.engine.release_rows([seq.req.table_idx])  # first: an interrupt there changes nothing
        self._retire(seq, reason, error)

    def _retire(self, seq: RequestState, reason: str, error: str | None = None) -> None:
        """finish's bookkeeping, the engine's row left live."""
        seq.finished = True
        seq.finish_reason = reason
        seq.error = error
        self.pages.release(seq)
        self.free_rows.appendleft(seq.req.table_idx)
        del self.running[seq.req.uid]
        self.finished[seq.req.uid] = seq

    def hand_out(self, seqs: list[RequestState], partial: list[bool], tokens: list[int],
                 logits: torch.Tensor) -> dict[int, int]:
        produced: dict[int, int] = {}
        done: list[int] = []
        for i, (seq, was_partial) in enumerate(zip(seqs, partial)):
            if was_partial or seq.finished:
                continue
            token = tokens[i]
            seq.req.append_host(token)
            seq.output_ids.append(token)
            if self.record_logits:
                seq.logits.append(logits[i].detach().to("cpu", torch.float32))
            produced[seq.req.uid] = token
            if len(seq.output_ids) >= seq.req.sampling_params.max_tokens:
                reason = "length"
            elif token in self.eos_token_ids and not seq.req.sampling_params.ignore_eos:
                reason = "eos"
            else:
                continue
            self._retire(seq, reason)
            done.append(seq.req.table_idx)
        # The finished rows' release comes last, in one call: an interrupt before it is rolled back with the whole
        # step (Loop.land), whose undo finds every row as the step left it.
        if done:
            self.engine.release_rows(done)
        return produced

    def result(self, uid: int) -> Generation:
        if uid not in self.finished:
            state = "still running" if uid in self.running else "unknown"
            raise InvalidRequestError(f"uid {uid!r} has no result: the request is {state}")
        seq = self.finished[uid]
        prompt = seq.req.token_ids[: seq.prompt_len]
        return Generation(uid, prompt, list(seq.output_ids), seq.finish_reason, seq.logits, seq.error)

    def drop(self, uids: list[int], first_uid: int) -> None:
        """Forget the requests of a failed generate(), as if it had never run."""
        for uid in reversed(uids):  # newest first: rows go back in their old order
            if uid in self.running:
                self.finish(self.running[uid], "abort")
            self.finished.pop(uid, None)
        self.next_uid = first_uid


def generate_pairs(prompts: object, params: object) -> list[tuple[object, object]]:
    """generate()'s arguments as (prompt, params) pairs; types and lengths checked, not values."""
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
