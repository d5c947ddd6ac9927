"""Running request specs through the engine, for the properties.

Engines are built once per configuration (EnginePool, on the session's target) and shared by the examples of a
session. Each run gets a fresh StaticDriver, so no schedule state carries over. KV left in the pool by earlier runs
is never read: a request attends only to slots [0, device_len) of its own page-table row, and writes each of them
(every layer stores its new K/V before its backend reads the pool) before any read. Stale KV is in fact part of what
is tested: runs reuse pages that earlier examples and churn requests filled.

Long sequences: a minority of the examples add one long request (add_long_request: a prompt at a kernel tile or page
edge past 64 tokens, half the time past 256) and run on engines of LONG_SEQ_LEN; the others keep the small engines
of MAX_SEQ_LEN, so the suite's cost grows only by those examples. record_lengths holds the share that really passes
64 and 256 tokens to a vacuity floor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from hypothesis import strategies as st

from engine import Engine, ForwardOutput, Req, SamplingParams
from engine.core import Phase
from engine.driver import DriverClaim, Generation, StaticDriver
from oracle.coverage import exercised
from oracle.strategies import LayoutSpec, RequestSpec, long_requests
from oracle.target import Target
from oracle.zoo import TINY_ARCHS, tiny_config

__all__ = [
    "MAX_SEQ_LEN",
    "TINY_ARCHS",
    "TINY_VOCAB",
    "LONG_PROMPT_LEN",
    "LONG_SEQ_LEN",
    "EnginePool",
    "add_long_request",
    "continuous_archs",
    "kv_slot_view",
    "place",
    "record_lengths",
    "row_slots",
    "run_churn",
    "run_placed",
    "run_requests",
]

TINY_VOCAB = tiny_config(TINY_ARCHS[0]).vocab_size
"""Vocabulary of oracle.zoo's tiny models (the same for every architecture)."""

MAX_SEQ_LEN = 96
"""Sequence capacity of the pooled engines by default: prompts (<= 64) plus new tokens (<= 16) fit."""

LONG_PROMPT_LEN = 321
"""The longest long prompt: one past five 64-token tiles (and past 256)."""

LONG_SEQ_LEN = 352
"""Sequence capacity of the engines that run a long request: LONG_PROMPT_LEN plus 16 new tokens, in whole pages."""


def continuous_archs(target: Target) -> tuple[str, ...]:
    """The tiny architectures whose logits are continuous at the target's dtype. Below float32 an MoE's top-k router
    flips experts on router logits tied within rounding, in HF as in the engine, so a correct engine's rows can be far
    from any other run's; MoE then runs only where a property allows HF's own error at that dtype (prefill logits)."""
    if target.torch_dtype == torch.float32:
        return TINY_ARCHS
    return tuple(arch for arch in TINY_ARCHS if not _is_moe(arch))


@functools.cache
def _is_moe(arch: str) -> bool:
    config = tiny_config(arch)
    return bool(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0))


@dataclass(frozen=True)
class EngineKey:
    model: str
    page_size: int
    dtype: str
    max_running_req: int
    num_pages: int
    max_seq_len: int


class EnginePool:
    """Engines of one target by configuration, built on first use; close() shuts them all down."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._engines: dict[EngineKey, Engine] = {}

    def get(
        self,
        model: str | Path,
        page_size: int = 1,
        dtype: str | None = None,
        max_running_req: int = 8,
        num_pages: int | None = None,
        max_seq_len: int = MAX_SEQ_LEN,
    ) -> Engine:
        """dtype defaults to the target's; num_pages to a full block of max_seq_len slots per page-table row (see
        place(), which needs the default max_seq_len)."""
        pages = num_pages if num_pages is not None else max_running_req * -(-max_seq_len // page_size)
        key = EngineKey(str(model), page_size, dtype or self.target.dtype, max_running_req, pages, max_seq_len)
        if key not in self._engines:
            self._engines[key] = Engine(
                self.target.engine_config(
                    model,
                    dtype=key.dtype,
                    page_size=page_size,
                    max_running_req=max_running_req,
                    max_seq_len_override=max_seq_len,
                    num_page_override=pages,
                ),
                sampler_seed=0,  # runs reseed it from drawn data; never a random seed, even where one forgets
            )
        engine = self._engines[key]
        # A run that failed left its driver holding requests: a new run starts clean.
        claim = engine.claimed_by
        if isinstance(claim, DriverClaim):
            claim.retired = "the engine pool gave its engine to a new run"
        engine.claim(None)
        engine.release_rows(range(max_running_req))  # and whatever KV hand-built requests left is dead
        return engine

    def close(self) -> None:
        for engine in reversed(list(self._engines.values())):  # reversed: each restores the thread count it found
            engine.shutdown()
        self._engines.clear()


def draw_engine(data: st.DataObject, tiny_models: Mapping[str, Path], engines: EnginePool) -> tuple[Engine, int]:
    """The target's engine for a drawn continuous-batching tiny model at a drawn page size, and that page size."""
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    page_size = data.draw(st.sampled_from(engines.target.page_sizes), label="page_size")
    return engines.get(tiny_models[arch], page_size), page_size


def add_long_request(
    data: st.DataObject,
    specs: Sequence[RequestSpec],
    page_size: int,
    params: st.SearchStrategy[SamplingParams],
    split: bool = False,
    min_chunks: int = 1,
) -> tuple[list[RequestSpec], int]:
    """In about half the examples under `ci`, one long request (strategies.long_requests, prompt <= LONG_PROMPT_LEN)
    at a drawn place in the batch; returns the batch and the max_seq_len its engine needs (LONG_SEQ_LEN or
    MAX_SEQ_LEN)."""
    # Two of five small integers, not a boolean: under `ci` a boolean gave 11 long examples of 75 at cuda-bf16 (the
    # 15% floor missed); this gives 27-62% on cpu-fp32, cpu-bf16 and cuda-bf16's page sizes in each caller.
    if data.draw(st.integers(0, 4), label="long") >= 2:
        return list(specs), MAX_SEQ_LEN
    long = long_requests(TINY_VOCAB, LONG_PROMPT_LEN, page_size, params, split, min_chunks)
    spec = data.draw(long, label="long_request")
    at = data.draw(st.integers(0, len(specs)), label="long_at")
    return [*specs[:at], spec, *specs[at:]], LONG_SEQ_LEN


PAST_TILE = "a sequence passes one 64-token kernel tile"
PAST_256 = "a sequence passes 256 tokens"
LENGTH_FLOORS = {PAST_TILE: 0.15, PAST_256: 0.05}
"""The floors record_lengths judges: a property that calls it declares them (@floors({..., **LENGTH_FLOORS}))."""


def record_lengths(specs: Sequence[RequestSpec]) -> None:
    """Record the LENGTH_FLOORS labels for the longest sequence of a batch (prompt and new tokens)."""
    longest = max(len(s.prompt) + s.params.max_tokens for s in specs)
    exercised(PAST_TILE, longest > 64)
    exercised(PAST_256, longest > 256)


def run_churn(driver: StaticDriver, churn: Sequence[tuple[Sequence[int], bool]]) -> None:
    """Run throwaway greedy requests: all prefilled together, the flagged ones aborted, the rest decoded to the end."""
    uids = [(driver.add(prompt, SamplingParams(max_tokens=3, ignore_eos=True)), abort) for prompt, abort in churn]
    if uids:
        driver.step()
    for uid, abort in uids:
        if abort:
            driver.abort(uid)
    driver.run()


def run_requests(
    engine: Engine,
    specs: Sequence[RequestSpec],
    layout: LayoutSpec | None = None,
    sampler_seed: int = 0,
    max_prefill_tokens: int | None = None,
) -> list[Generation]:
    """Add every request at once and run them to completion, recording logits; results in spec order.

    The engine's generator is reseeded first, so unseeded sampled requests replay too.
    """
    return run_placed(engine, specs, layout, sampler_seed, max_prefill_tokens)[0]


def run_placed(
    engine: Engine,
    specs: Sequence[RequestSpec],
    layout: LayoutSpec | None = None,
    sampler_seed: int = 0,
    max_prefill_tokens: int | None = None,
) -> tuple[list[Generation], list[tuple[int, ...]]]:
    """run_requests, plus the KV slot of every position each request computed (its placement), in spec order.

    The rows are read after the run: no request is added after the real ones, so none of their rows is reused.
    """
    if layout is not None and layout.page_size != engine.config.page_size:
        raise ValueError(f"layout page_size {layout.page_size} != engine page_size {engine.config.page_size}")
    engine.sampler.reseed(sampler_seed)
    driver = StaticDriver(
        engine, layout.layout if layout else None, record_logits=True, max_prefill_tokens=max_prefill_tokens
    )
    if layout is not None:
        run_churn(driver, layout.churn)
    uids = [driver.add(s.prompt, s.params, s.chunk_sizes) for s in specs]
    driver.run()
    gens = [driver.result(uid) for uid in uids]
    rows = [driver.finished[uid].req.table_idx for uid in uids]
    computed = [len(g.prompt_ids) + len(g.output_ids) - 1 for g in gens]  # the last token is never fed back
    slots = [tuple(engine.page_table[row, :n].tolist()) for row, n in zip(rows, computed)]
    return gens, slots


def place(engine: Engine, tokens: Sequence[int], cached_len: int, row: int, params: SamplingParams) -> Req:
    """A hand-built Req on page-table row `row`, computing tokens [cached_len, len(tokens)).

    The row's slots are its own contiguous block of pages (row r owns pages [r * n, (r + 1) * n) with
    n = MAX_SEQ_LEN / page_size), written into the page table here; EnginePool's default num_pages holds them all.
    """
    page_size = engine.config.page_size
    per_row = -(-MAX_SEQ_LEN // page_size)
    if (row + 1) * per_row > engine.num_pages:
        raise ValueError(f"row {row} needs pages up to {(row + 1) * per_row}, the engine has {engine.num_pages}")
    first_slot = row * per_row * page_size
    engine.page_table[row, :MAX_SEQ_LEN] = torch.arange(first_slot, first_slot + MAX_SEQ_LEN, dtype=torch.int32)
    ids = torch.tensor(list(tokens), dtype=torch.int32)
    return Req(ids, row, cached_len, params.max_tokens, uid=row, sampling_params=params)


def row_slots(engine: Engine, req: Req) -> torch.Tensor:
    """The KV slots [0, device_len) of a request, from the page table (int64)."""
    return engine.page_table[req.table_idx, : req.device_len].long()


def kv_slot_view(engine: Engine) -> torch.Tensor:
    """The engine's KV pool as [2 (K, V), layers, slots, kv_heads, head_dim] (a view)."""
    pool = engine.kv_cache
    return pool.buffer.view(2, pool.num_layers, pool.num_slots, pool.num_kv_heads, pool.head_dim)


Launch = Callable[[list[Req], Phase], ForwardOutput]


def hand_passes(engine: Engine, reqs: list[Req], phases: Sequence[Phase], pipelined: bool,
                launch: Launch | None = None) -> list[list[int]]:
    """The seed's hand-driven loop: one pass per phase, each pass's tokens appended to its requests. Pipelined,
    pass k+1 starts before pass k's tokens are read (it reads them on the device), as the overlapped driver
    runs. launch(reqs, phase) starts a pass (default: prepare_batch, then forward_batch)."""
    start = launch or (lambda batch_reqs, phase: engine.forward_batch(*engine.prepare_batch(batch_reqs, phase)))
    tokens: list[list[int]] = []
    in_flight: ForwardOutput | None = None
    for phase in phases:
        out: ForwardOutput | None = start(reqs, phase)
        if pipelined:
            in_flight, out = out, in_flight
        if out is None:
            continue
        step = out.result().tolist()
        for req, token in zip(reqs, step):
            req.append_host(token)
        tokens.append(step)
    if in_flight is not None:
        tokens.append(in_flight.result().tolist())
    return tokens
