"""Property 10: a random scheduler (Hypothesis RuleBasedStateMachine) never breaks paging or parity.

The machine plays the scheduler against one StaticDriver on a deliberately small engine (4 page-table rows, 96 KV
slots), so admission fails often and freed pages are reused at once. Rules:

* join: a request (greedy or seeded sampling, prefill in 1..4 chunks) asks to be admitted. CapacityError must be
  raised exactly when no row is free or too few pages are available;
* step: 1..4 forward passes (each: prefill of waiting requests first, else a decode step of everyone), under a
  drawn per-step prefill token budget;
* abort: a running request leaves, freeing its row and pages (they go to the front of the free list).

Requests also leave by finishing (max_tokens). The setup draws the model, page size and page layout.

Invariants, after every rule:

* paging: no page belongs to two live requests, no live page is on the free list, pages are conserved
  (free + held = total), every live request's cached slots lie in its own pages, the dummy page is nobody's;
* parity: every request that produced tokens since the last check (live, or just finished) matches HF float64
  teacher-forced on its own sequence: each step's logits within the float32 logit bound of oracle.tolerance,
  greedy tokens the reference argmax (near-tie rule), sampled tokens inside the reference support of the engine's
  logits row (oracle.sampler, ambiguous tokens allowed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
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
from engine.driver import LayoutKind, PageLayout, StaticDriver
from oracle.budget import examples
from oracle.checks import assert_logits_close, check_forced_greedy
from oracle.drive import TINY_VOCAB, EnginePool, continuous_archs
from oracle.hf import HFOracle
from oracle.sampler import reference_distribution
from oracle.strategies import RequestSpec, requests, sampling_params, seeds
from oracle.tolerance import logit_tolerance

ROWS = 4
POOL_SLOTS = 96
MAX_PROMPT = 24


def request_params() -> st.SearchStrategy[RequestSpec]:
    params = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.integers(1, 8)) | sampling_params(
        TINY_VOCAB, greedy=False, seeded=True, max_tokens=st.integers(1, 8)
    )
    return requests(TINY_VOCAB, MAX_PROMPT, params=params, split=True)


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

    @initialize(
        data=st.data(),
        kind=st.sampled_from(("contiguous", "shuffled", "interleaved")),
        layout_seed=seeds,
        sampler_seed=seeds,
    )
    def setup(self, data: st.DataObject, kind: LayoutKind, layout_seed: int, sampler_seed: int) -> None:
        arch = data.draw(st.sampled_from(continuous_archs(self.engines.target)), label="arch")
        page_size = data.draw(st.sampled_from(self.engines.target.page_sizes), label="page_size")
        self.engine: Engine = self.engines.get(
            self.models[arch], page_size, max_running_req=ROWS, num_pages=-(-POOL_SLOTS // page_size)
        )
        self.engine.sampler.reseed(sampler_seed)
        self.oracle = self.oracle_for(self.models[arch])
        self.driver = StaticDriver(self.engine, PageLayout(kind, layout_seed), record_logits=True)

    @rule(spec=request_params())
    def join(self, spec: RequestSpec) -> None:
        driver = self.driver
        pages = -(-(len(spec.prompt) + spec.params.max_tokens) // driver.page_size)
        fits = bool(driver.free_rows) and driver.allocator.available >= pages
        try:
            driver.add(spec.prompt, spec.params, spec.chunk_sizes)
        except CapacityError:
            assert not fits, f"refused a request needing {pages} pages with {driver.allocator.available} available"
            self.tally["joins refused"] += 1
            return
        self.tally["joins admitted"] += 1
        assert fits, f"admitted a request needing {pages} pages with only {driver.allocator.available} available"

    @precondition(lambda self: bool(self.driver.running))
    @rule(budget=st.none() | st.integers(1, 32), repeat=st.integers(1, 4))
    def step(self, budget: int | None, repeat: int) -> None:
        self.driver.max_prefill_tokens = budget
        for _ in range(repeat):  # several passes per rule, so runs reach decode and finish often
            self.driver.step()
            self.tally["steps"] += 1

    @precondition(lambda self: bool(self.driver.running))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        self.driver.abort(data.draw(st.sampled_from(sorted(self.driver.running)), label="abort uid"))
        self.tally["aborts"] += 1

    @invariant()
    def pages_are_exclusive(self) -> None:
        if not hasattr(self, "driver"):
            return
        driver, engine = self.driver, self.engine
        held = [p for seq in driver.running.values() for p in seq.pages]
        assert len(held) == len(set(held)), f"a page is shared by two live requests: {sorted(held)}"
        assert not set(held) & set(driver.allocator.free), "a live request's page is on the free list"
        assert len(held) + len(driver.allocator.free) == engine.num_pages, "pages were lost or duplicated"
        assert engine.num_pages not in held, "the dummy page was handed to a request"
        rows = [seq.req.table_idx for seq in driver.running.values()]
        assert len(rows) == len(set(rows)) and not set(rows) & set(driver.free_rows), "page-table rows overlap"
        for seq in driver.running.values():
            slots = engine.page_table[seq.req.table_idx, : seq.req.cached_len]
            assert set((slots // driver.page_size).tolist()) <= set(seq.pages), "cached slots outside own pages"

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
            tokens = seq.req.input_ids.tolist()
            prompt_len = len(tokens) - n
            # Uncached on purpose: the machine checks every live request after every step, and HFOracle's cache
            # would keep every prefix of every request.
            with torch.no_grad():
                forced = self.oracle.model(torch.tensor([tokens])).logits[0, prompt_len - 1 : prompt_len - 1 + n]
            for k, (ours, ref) in enumerate(zip(seq.logits, forced)):
                assert_logits_close(ours, ref, tol, f"request {uid} step {k}")
            params = seq.req.sampling_params
            if params.is_greedy:
                failure = check_forced_greedy(seq.output_ids, seq.logits, forced, tol)
                assert failure is None, f"request {uid}: {failure}"
            else:
                for k, (token, ours) in enumerate(zip(seq.output_ids, seq.logits)):
                    ref_dist = reference_distribution(ours, params)
                    allowed = bool(ref_dist.support[token] or ref_dist.ambiguous[token])
                    assert allowed, f"request {uid} step {k}: sampled token {token} is outside the support"


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
