"""Property 9: dummy (padding) rows are inert, and real rows never touch the dummy page.

On CUDA a decode batch is padded up to a captured graph size with the engine's dummy request, whose page-table
row points only into the dummy page (the extra page after the real ones). On CPU the graph runner is disabled, so
the test pads for real: during prepare_batch it lends the engine a GraphRunner enabled for one padded size, which
pads with engine.dummy_req exactly as on CUDA; forward_batch then runs the padded batch eagerly through the model.

* Dummy rows inert: every KV slot of every real page (the real requests' cached KV and the free pages) is filled
  with distinct sentinel values; after a padded decode step each of them still holds its sentinel, except the
  slots the real requests write this step. And the real requests' logits from the padded step equal those of the
  unpadded step, within the float32 logit bound of oracle.tolerance (bitwise equality is reported as an event:
  the padded matmuls have more rows, which CPU kernels may round differently).
* Real rows inert for the dummy page: the dummy page is filled with sentinels and survives real prefill and decode
  steps untouched.
* The dummy row's slots all lie in the dummy page, which lies beyond every real page.

Bug classes: padding that reads or writes a real request's KV (a dummy page the allocator also hands out,
dummy_page_overlap; padded rows writing to slot 0, pad_slot_zero). Vacuity floor: every example's decode batch is
padded (90% at least).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.graph import GraphRunner
from oracle.budget import examples
from oracle.checks import assert_logits_close
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, draw_engine, kv_slot_view, place
from oracle.strategies import RequestSpec, batches, sampling_params, seeds
from oracle.tolerance import logit_tolerance


def decode_step(engine: Engine, specs: list[RequestSpec], next_ids: list[int], pad_to: int | None) -> torch.Tensor:
    """One decode step of every request (prompt + its first token), padded with dummy rows to pad_to; logits.

    pad_to None: an unpadded eager step. Otherwise a runner that only pads builds the batch, which then runs on the
    engine's own runner: eagerly without CUDA graphs, or replaying the graph of pad_to (a captured size) with them.
    """
    reqs = [
        place(engine, [*s.prompt, token], len(s.prompt), row, s.params)
        for row, (s, token) in enumerate(zip(specs, next_ids))
    ]
    graphs = engine.graph_runner
    hand_out = engine.step_kernels.hand_out
    eager = GraphRunner(engine.dummy_req, [], enabled=False, hand_out=hand_out)
    padder = GraphRunner(engine.dummy_req, [pad_to], enabled=True, hand_out=hand_out) if pad_to else eager
    try:
        engine.graph_runner = padder
        batch, args = engine.prepare_batch(reqs, "decode")
        engine.graph_runner = eager if pad_to is None else graphs
        assert batch.padded_size == (pad_to or len(reqs))
        return engine.forward_batch(batch, args).logits
    finally:
        engine.graph_runner = graphs


def fill(view: torch.Tensor, slots: torch.Tensor, seed: int) -> torch.Tensor:
    """Write distinct sentinel values into the given slots of every layer; returns what was written."""
    gen = torch.Generator().manual_seed(seed)
    values = (torch.randn(view[:, :, slots].shape, generator=gen) * 100).to(view.device, view.dtype)
    view[:, :, slots] = values
    return values

PADDED = "the decode batch is padded with dummy rows"


@settings(max_examples=examples(4.0))
@given(data=st.data())
@floors({PADDED: 0.9})
def test_dummy_rows_are_inert(data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool) -> None:
    engine, page_size = draw_engine(data, tiny_models, engines)
    max_req = engine.config.max_running_req
    one_token = sampling_params(TINY_VOCAB, greedy=True, max_tokens=st.just(2))
    specs = data.draw(batches(TINY_VOCAB, max_req - 1, 40, page_size, one_token), label="requests")
    runner = engine.graph_runner
    sizes = [b for b in runner.bs_list if b > len(specs)] if runner.enabled else range(len(specs) + 1, max_req + 1)
    pad_to = data.draw(st.sampled_from(list(sizes)), label="pad_to")
    seed = data.draw(seeds, label="sentinel_seed")
    exercised(PADDED, pad_to > len(specs))
    view = kv_slot_view(engine)
    dummy_slots = torch.arange(engine.num_pages * page_size, (engine.num_pages + 1) * page_size, device=view.device)
    assert engine.kv_cache.dummy_page == engine.num_pages
    assert bool(((engine.page_table[engine.dummy_row] // page_size) == engine.num_pages).all())

    # Real rows leave the dummy page alone: prefill, then an unpadded decode step.
    dummy_sentinel = fill(view, dummy_slots, seed)
    prefill = [place(engine, s.prompt, 0, row, s.params) for row, s in enumerate(specs)]
    out = engine.forward_batch(*engine.prepare_batch(prefill, "prefill"))
    next_ids = out.next_tokens_cpu.tolist()
    unpadded = decode_step(engine, specs, next_ids, None)
    assert torch.equal(view[:, :, dummy_slots], dummy_sentinel), "a real request wrote into the dummy page"

    # Padding does not change the real rows' logits.
    padded = decode_step(engine, specs, next_ids, pad_to)
    assert_logits_close(padded, unpadded, logit_tolerance(engine.dtype), f"real rows padded to {pad_to}")
    event(f"padded logits bitwise equal to unpadded: {torch.equal(padded, unpadded)}")

    # Dummy rows leave every real slot alone, except the ones the real requests write this step.
    written = torch.stack([engine.page_table[row, len(s.prompt)].long() for row, s in enumerate(specs)])
    real_slots = torch.arange(engine.num_pages * page_size, device=view.device)
    kept = real_slots[~torch.isin(real_slots, written)]
    real_sentinel = fill(view, kept, seed + 1)
    decode_step(engine, specs, next_ids, pad_to)
    changed = (view[:, :, kept] != real_sentinel).movedim(2, 0).flatten(1).any(dim=1)
    assert not bool(changed.any()), (
        f"a padded step wrote into real slots {kept[changed].tolist()[:8]} (dummy row slots start "
        f"{engine.page_table[engine.dummy_row, :2].tolist()})"
    )
