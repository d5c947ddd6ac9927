"""Property 11: KV isolation. A forward pass writes the KV slots of its batch's new tokens and nothing else.

Requests (greedy, prefill in 1..4 chunks) arrive over the first steps of a StaticDriver run (the first at step 0 and
outliving the others, the others at steps 1..4), on a drawn page size
and page layout, after churn requests that leave stale KV and freed pages behind, under a drawn per-step prefill
token budget (1 included). So the steps take every batch shape the driver makes: single-token batches (a lone
decode, a 1-token prefill chunk), decode batches, prefills of new requests and extends of cached ones, while other
requests' KV waits in the pool.

Law, after every step: the slots whose K or V changed in any layer are among the slots the page table gives the
batch's new tokens (positions [cached_len before, cached_len after) of each request) or the dummy page. Every other
slot, so every other live request's KV and every earlier slot of the batch's own requests, is bitwise unchanged.

Vacuity floors (oracle.coverage), per example: a single-token batch ran; a prefill extended a request's cached KV;
a step ran while a live request with cached KV was outside the batch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.driver import RequestState, StaticDriver
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, continuous_archs, kv_slot_view, run_churn
from oracle.strategies import batches, high_biased_integers, layouts, sampling_params

MAX_REQUESTS = 4
MAX_NEW_TOKENS = 8
LAST_ARRIVAL = 4  # the first request joins at driver step 0, the others at steps 1..LAST_ARRIVAL


def owners(engine: Engine, live: list[RequestState]) -> dict[int, str]:
    """slot -> which live request's KV it holds, for the failure message."""
    out = {}
    for seq in live:
        for position, slot in enumerate(engine.page_table[seq.req.table_idx, : seq.req.cached_len].tolist()):
            out[slot] = f"request {seq.req.uid} position {position}"
    return out


def checked_step(driver: StaticDriver) -> dict[str, bool]:
    """One driver step, asserting the law; returns which batch shapes it had."""
    engine = driver.engine
    view = kv_slot_view(engine).view(torch.uint8)  # bytes: bitwise, and a NaN left in the pool equals itself
    live = list(driver.running.values())
    before = [(seq, seq.req.cached_len, seq.prefilling) for seq in live]
    stored = view.clone()
    driver.step()
    table = engine.page_table
    new = [table[seq.req.table_idx, cached : seq.req.cached_len].long() for seq, cached, _ in before]
    allowed = torch.zeros(engine.kv_cache.num_slots, dtype=torch.bool, device=view.device)
    allowed[torch.cat(new)] = True
    allowed[engine.kv_cache.dummy_page * engine.config.page_size :] = True
    changed = (view != stored).movedim(2, 0).flatten(1).any(dim=1)
    stray = (changed & ~allowed).nonzero().flatten().tolist()
    if stray:
        who = owners(engine, live)
        shown = ", ".join(f"{slot} ({who.get(slot, 'no live KV')})" for slot in stray[:8])
        raise AssertionError(
            f"a step writing slots {torch.cat(new).tolist()} also changed slots {shown}"
            + (f" and {len(stray) - 8} more" if len(stray) > 8 else "")
        )
    written = [len(n) for n in new]
    return {
        "single": sum(written) == 1,
        "extend": any(pre and cached > 0 and n > 0 for (_, cached, pre), n in zip(before, written)),
        "outside": any(cached > 0 and n == 0 for (_, cached, _), n in zip(before, written)),
    }

FLOORS = {
    "kv isolation: a single-token batch": 0.9,
    "kv isolation: a prefill extending cached KV": 0.6,
    "kv isolation: a live request's KV outside the batch": 0.8,
}


@settings(max_examples=examples(1.0))
@given(data=st.data())
@floors(FLOORS)
def test_a_step_writes_only_its_batch_slots(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    arch = data.draw(st.sampled_from(continuous_archs(engines.target)), label="arch")
    layout = data.draw(layouts(TINY_VOCAB, engines.target.page_sizes), label="layout")
    engine = engines.get(tiny_models[arch], layout.page_size)
    params = sampling_params(TINY_VOCAB, greedy=True, max_tokens=high_biased_integers(1, MAX_NEW_TOKENS))
    # Two or more requests: the law is about the KV of the others.
    specs = data.draw(
        batches(TINY_VOCAB, MAX_REQUESTS, 40, layout.page_size, params, split=True, min_size=2), label="requests"
    )
    later = st.lists(st.integers(1, LAST_ARRIVAL), min_size=len(specs) - 1, max_size=len(specs) - 1)
    arrivals = [0, *data.draw(later, label="arrivals")]
    # The first request outlives the others (it decodes at most once per step before they join): its last decode
    # steps run alone, a single-token batch.
    specs[0] = replace(specs[0], params=replace(specs[0].params, max_tokens=MAX_NEW_TOKENS + LAST_ARRIVAL + 1))
    budget = data.draw(st.none() | st.just(1) | st.integers(1, 24), label="max_prefill_tokens")
    driver = StaticDriver(engine, layout.layout, max_prefill_tokens=budget)
    run_churn(driver, layout.churn)
    seen = {"single": False, "extend": False, "outside": False}
    step = 0
    while step <= LAST_ARRIVAL or driver.running:
        for spec, arrival in zip(specs, arrivals):
            if arrival == step:
                driver.add(spec.prompt, spec.params, spec.chunk_sizes)
        if driver.running:
            for shape, hit in checked_step(driver).items():
                seen[shape] |= hit
        step += 1
    for label, shape in zip(FLOORS, ("single", "extend", "outside")):
        exercised(label, seen[shape])
