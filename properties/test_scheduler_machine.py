"""Property 10: a random scheduler (Hypothesis RuleBasedStateMachine) never breaks paging, accounting or parity.

The machine plays the scheduler against one StaticDriver on a deliberately small engine (4 page-table rows, 96 KV
slots), so admission fails often and freed pages are reused at once. Rules:

* join: a request (greedy or seeded sampling, prefill in 1..4 chunks, EOS honoured or ignored) asks to be admitted.
  CapacityError must be raised exactly when no row is free or too few pages are available;
* step: 1..4 forward passes (each: prefill of waiting requests first, else a decode step of everyone), under a
  drawn per-step prefill token budget;
* step until one finishes: forward passes until a request finishes (so runs finish requests as often as they abort);
* abort: a running request (the newest, or any) leaves, freeing its row, its pages and what is left of its reservation.

Requests also leave by finishing: on max_tokens, or on EOS. The setup draws the model, page size, page layout and the
driver's EOS set (a drawn eighth to half of the vocabulary, so the tiny models' tokens hit it often), admits one
to four requests and prefills them, so every run runs forward passes; the teardown runs whatever is left to its end
and checks the invariants once more, so every run ends with all pages, reservations and rows back.

Invariants, after every rule:

* paging: no page belongs to two live requests, no live page is on the free list, pages are conserved
  (free + held = total), the dummy page is nobody's, every mapped slot of a live request's page-table row lies in
  its own pages, in order;
* accounting: the allocator's reservation is exactly the live requests' unmapped reservations (so available +
  reserved + held = total), each request's reservation covers prompt + max_tokens, rows are conserved
  (free rows + live rows = all rows), and with nothing running every page, reservation and row is back;
* finishing: a request finished with "length" iff it reached max_tokens, with "eos" iff it stopped earlier on a
  token of the EOS set it honours, with "abort" iff the machine aborted it; a live request has not reached
  either;
* parity: every request that produced tokens since the last check (live, or just finished) matches HF float64
  teacher-forced on its own sequence: each step's logits within the float32 logit bound of oracle.tolerance,
  greedy tokens the reference argmax (near-tie rule), sampled tokens inside the reference support of the engine's
  logits row (oracle.sampler, ambiguous tokens allowed).

Vacuity floors (oracle.coverage), per run: a request finished on EOS; a request was aborted while part of its
reservation was still unmapped (the accounting a leak on abort breaks).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engine import CapacityError, Engine
from engine.driver import LayoutKind, PageLayout, RequestState, StaticDriver
from oracle.budget import examples
from oracle.checks import NUMERICS_LAW, assert_logits_close, check_forced_greedy
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, continuous_archs
from oracle.hf import HFOracle
from oracle.sampler import reference_distribution
from oracle.strategies import RequestSpec, high_biased_integers, requests, sampling_params, seeds
from oracle.tolerance import logit_tolerance

ROWS = 4
POOL_SLOTS = 96
MAX_PROMPT = 24


def _honouring(spec: RequestSpec, ignore_eos: bool) -> RequestSpec:
    return replace(spec, params=replace(spec.params, ignore_eos=ignore_eos))


def request_params() -> st.SearchStrategy[RequestSpec]:
    max_tokens = high_biased_integers(1, 8)  # a request needs several tokens to hit EOS
    params = sampling_params(TINY_VOCAB, greedy=True, max_tokens=max_tokens) | sampling_params(
        TINY_VOCAB, greedy=False, seeded=True, max_tokens=max_tokens
    )
    spec = requests(TINY_VOCAB, MAX_PROMPT, params=params, split=True)
    # EOS honoured three times in four: finishing on EOS is a path of its own (pages and reservation released early).
    return st.builds(_honouring, spec, st.sampled_from((False, False, False, True)))


def eos_sets() -> st.SearchStrategy[frozenset[int]]:
    """A drawn 1/8..1/2 of the vocabulary: the tiny models' greedy tokens spread over it, so requests stop on EOS."""
    return st.builds(
        lambda seed, k: frozenset(random.Random(seed).sample(range(TINY_VOCAB), k)),
        seeds,
        st.integers(TINY_VOCAB // 8, TINY_VOCAB // 2),
    )


def expected_finish(seq: RequestState, eos: frozenset[int]) -> str | None:
    """Why a request that produced seq.output_ids must have stopped by now (None: it must still run)."""
    params = seq.req.sampling_params
    if len(seq.output_ids) >= params.max_tokens:
        return "length"
    if seq.output_ids and seq.output_ids[-1] in eos and not params.ignore_eos:
        return "eos"
    return None


ON_EOS = "scheduler machine: a request finished on EOS"
UNMAPPED = "scheduler machine: an abort with part of the reservation unmapped"


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(
        self, models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle], tally: Counter[str]
    ) -> None:
        super().__init__()
        self.models = models
        self.engines = engines
        self.oracle_for = oracle
        self.tally = tally  # what the runs did, printed at the end of the test
        self.tally["runs"] += 1
        self.checked: dict[int, int] = {}  # uid -> tokens verified so far
        self.aborted: set[int] = set()
        self.aborted_unmapped = False  # an abort left part of a reservation unmapped

    @initialize(
        data=st.data(),
        kind=st.sampled_from(("contiguous", "shuffled", "interleaved")),
        layout_seed=seeds,
        sampler_seed=seeds,
        eos=eos_sets(),
        first=st.lists(request_params(), min_size=1, max_size=ROWS),
    )
    def setup(
        self,
        data: st.DataObject,
        kind: LayoutKind,
        layout_seed: int,
        sampler_seed: int,
        eos: frozenset[int],
        first: list[RequestSpec],
    ) -> None:
        arch = data.draw(st.sampled_from(continuous_archs(self.engines.target)), label="arch")
        page_size = data.draw(st.sampled_from(self.engines.target.page_sizes), label="page_size")
        self.engine: Engine = self.engines.get(
            self.models[arch], page_size, max_running_req=ROWS, num_pages=-(-POOL_SLOTS // page_size)
        )
        self.engine.sampler.reseed(sampler_seed)
        self.oracle = self.oracle_for(self.models[arch])
        self.driver = StaticDriver(self.engine, PageLayout(kind, layout_seed), record_logits=True, eos_token_ids=eos)
        for spec in first:
            self.join(spec)
        self.step(None, 1)

    @rule(spec=request_params())
    def join(self, spec: RequestSpec) -> None:
        driver, allocator = self.driver, self.driver.pages.allocator
        pages = -(-(len(spec.prompt) + spec.params.max_tokens) // driver.page_size)
        fits = bool(driver.requests.free_rows) and allocator.available >= pages
        try:
            driver.add(spec.prompt, spec.params, spec.chunk_sizes)
        except CapacityError:
            assert not fits, f"refused a request needing {pages} pages with {allocator.available} available"
            self.tally["joins refused"] += 1
            return
        self.tally["joins admitted"] += 1
        assert fits, f"admitted a request needing {pages} pages with only {allocator.available} available"

    def _forward_pass(self) -> None:
        self.driver.step()
        self.tally["steps"] += 1

    @precondition(lambda self: bool(self.driver.running))
    @rule(budget=st.none() | st.integers(1, 32), repeat=st.integers(1, 4))
    def step(self, budget: int | None, repeat: int) -> None:
        self.driver.loop.max_prefill_tokens = budget
        for _ in range(repeat):  # several passes per rule, so runs reach decode and finish often
            if self.driver.running:
                self._forward_pass()

    @precondition(lambda self: bool(self.driver.running))
    @rule()
    def step_until_one_finishes(self) -> None:
        live = len(self.driver.running)
        while len(self.driver.running) == live:  # a finish (length or EOS) always comes within max_tokens passes
            self._forward_pass()

    @precondition(lambda self: bool(self.driver.running))
    @rule(data=st.data(), newest=st.booleans())
    def abort(self, data: st.DataObject, newest: bool) -> None:
        # newest: the latest admitted request, typically not scheduled yet (its client gave up waiting)
        running = sorted(self.driver.running)
        uid = running[-1] if newest else data.draw(st.sampled_from(running), label="abort uid")
        seq = self.driver.running[uid]
        self.aborted_unmapped |= len(seq.pages) < seq.reserved_pages
        self.driver.abort(uid)
        self.aborted.add(uid)
        self.tally["aborts"] += 1

    @invariant()
    def pages_are_exclusive(self) -> None:
        if not hasattr(self, "driver"):
            return
        driver, engine, free = self.driver, self.engine, self.driver.pages.allocator.free
        held = [p for seq in driver.running.values() for p in seq.pages]
        assert len(held) == len(set(held)), f"a page is shared by two live requests: {sorted(held)}"
        assert not set(held) & set(free), "a live request's page is on the free list"
        assert len(held) + len(free) == engine.num_pages, (
            f"pages lost or duplicated: {len(held)} held + {len(free)} free != {engine.num_pages}"
        )
        assert engine.num_pages not in held, "the dummy page was handed to a request"
        ps, width = driver.page_size, engine.page_table.shape[1]
        for seq in driver.running.values():
            mapped = min(len(seq.pages) * ps, width)
            own = (torch.tensor(seq.pages)[:, None] * ps + torch.arange(ps)).flatten()[:mapped]
            row = engine.page_table[seq.req.table_idx, :mapped].long().cpu()
            assert torch.equal(row, own), f"request {seq.req.uid}: its page-table row maps slots outside its pages"

    @invariant()
    def pages_rows_and_reservations_are_conserved(self) -> None:
        if not hasattr(self, "driver"):
            return
        driver, allocator = self.driver, self.driver.pages.allocator
        live = list(driver.running.values())
        for seq in live:
            prompt_len = seq.req.num_tokens - len(seq.output_ids)
            need = -(-(prompt_len + seq.req.sampling_params.max_tokens) // driver.page_size)
            assert seq.reserved_pages == need, f"request {seq.req.uid} reserved {seq.reserved_pages} pages, not {need}"
            assert len(seq.pages) <= seq.reserved_pages, f"request {seq.req.uid} maps more pages than it reserved"
        unmapped = sum(seq.reserved_pages - len(seq.pages) for seq in live)
        held = sum(len(seq.pages) for seq in live)
        assert allocator.reserved == unmapped, (
            f"the allocator holds {allocator.reserved} reserved pages, the live requests' unmapped reservations are "
            f"{unmapped}: a finished request's reservation leaked"
        )
        assert allocator.available + unmapped + held == allocator.total, "available + reserved + held != total"
        rows = [seq.req.table_idx for seq in live]
        free_rows = list(driver.requests.free_rows)
        assert sorted(rows + free_rows) == list(range(ROWS)), f"rows lost: live {rows}, free {free_rows}"
        if not live:
            assert allocator.available == allocator.total and allocator.reserved == 0, "idle, yet pages are missing"

    @invariant()
    def requests_finish_for_their_reason(self) -> None:
        if not hasattr(self, "driver"):
            return
        eos = self.driver.requests.eos_token_ids
        for uid, seq in self.driver.running.items():
            assert expected_finish(seq, eos) is None, f"request {uid} should have finished: {seq.output_ids}"
        for uid, seq in self.driver.finished.items():
            params = seq.req.sampling_params
            early = seq.output_ids[:-1] if seq.finish_reason != "abort" else seq.output_ids
            assert params.ignore_eos or not set(early) & eos, f"request {uid} ran past an EOS token: {seq.output_ids}"
            want = "abort" if uid in self.aborted else expected_finish(seq, eos)
            assert seq.finish_reason == want, f"request {uid} finished with {seq.finish_reason!r}, expected {want!r}"

    @invariant()
    def tokens_match_oracle(self) -> None:
        if not hasattr(self, "driver"):
            return
        seqs = {**self.driver.finished, **self.driver.running}
        tol = logit_tolerance(self.engine.dtype)
        for uid, seq in seqs.items():
            n = len(seq.output_ids)
            if n == self.checked.get(uid, 0):
                continue
            self.tally["tokens verified"] += n - self.checked.get(uid, 0)
            self.checked[uid] = n
            tokens = list(seq.req.token_ids)
            prompt_len = len(tokens) - n
            # Uncached on purpose: the machine checks every live request after every step, and HFOracle's cache
            # would keep every prefix of every request.
            with torch.no_grad():
                forced = self.oracle.model(torch.tensor([tokens])).logits[0, prompt_len - 1 : prompt_len - 1 + n]
            for k, (ours, ref) in enumerate(zip(seq.logits, forced)):
                assert_logits_close(ours, ref, tol, f"request {uid} step {k} ({NUMERICS_LAW})")
            params = seq.req.sampling_params
            if params.is_greedy:
                failure = check_forced_greedy(seq.output_ids, seq.logits, forced, tol)
                assert failure is None, f"request {uid}: {failure}\n{NUMERICS_LAW}"
            else:
                for k, (token, ours) in enumerate(zip(seq.output_ids, seq.logits)):
                    ref_dist = reference_distribution(ours, params)
                    allowed = bool(ref_dist.support[token] or ref_dist.ambiguous[token])
                    assert allowed, f"request {uid} step {k}: sampled token {token} is outside the support"

    @floors({ON_EOS: 0.4, UNMAPPED: 0.2})  # teardown ends every run: one example each
    def teardown(self) -> None:
        if not hasattr(self, "driver"):
            return
        self.driver.loop.max_prefill_tokens = None
        while self.driver.running:  # what still runs finishes: then every page, reservation and row must be back
            self._forward_pass()
        self.pages_are_exclusive()
        self.pages_rows_and_reservations_are_conserved()
        self.requests_finish_for_their_reason()
        self.tokens_match_oracle()
        reasons = {seq.finish_reason for seq in self.driver.finished.values()}
        exercised(ON_EOS, "eos" in reasons)
        exercised(UNMAPPED, self.aborted_unmapped)
        self.tally.update(f"finished {seq.finish_reason}" for seq in self.driver.finished.values())
        self.tally["runs finishing on EOS"] += "eos" in reasons
        self.tally["runs aborting with an unmapped reservation"] += self.aborted_unmapped


def test_random_scheduler_keeps_paging_and_parity(
    tiny_models: dict[str, Path], engines: EnginePool, oracle: Callable[..., HFOracle]
) -> None:
    tally: Counter[str] = Counter()
    run_state_machine_as_test(
        lambda: SchedulerMachine(tiny_models, engines, oracle, tally),  # type: ignore[arg-type]  # a factory is fine
        settings=settings(
            max_examples=examples(3.2),
            stateful_step_count=40,
            # A run draws up to 40 rules, many of them whole requests: more data than one plain example.
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
    print(f"scheduler machine: {dict(tally)}")  # shown with -s / -rP: how much the runs exercised
