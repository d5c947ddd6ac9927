"""CUDA graphs: replay equals eager (batch sizes between captured ones too), padded rows are inert, a replay that
skips an input copy is caught, and shutdown destroys the graphs.

Graph and eager runs take the GPU target's backends (FlashInfer bf16 at cuda-bf16) and differ only in padding and
the decode plan, so they are held to the same bound as FlashInfer vs torch (test_gpu_attention.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from gpu_support import generate, gpu_engine, needs_flashinfer, random_prompt
from test_gpu_attention import assert_runs_match

from engine import Batch, Engine, Req, SamplingParams
from engine.driver import Generation, PageLayout, StaticDriver
from engine.graph import Mode, StepOutputs
from oracle.mutants.catalogue.step import graph_positions_stale
from oracle.target import Target

pytestmark = needs_flashinfer

GRAPH_BS = [1, 2, 4, 8]
SENTINEL = 3.0  # written into every free KV slot: real K/V never equals it exactly


@pytest.fixture(scope="module")
def graph_target(gpu_target: Target, wide_models: dict[str, Path]) -> Target:
    """The GPU target, where its attention backend can be captured: these tests turn graphs on and off themselves."""
    engine = gpu_engine(gpu_target, wide_models["qwen3"], cuda_graph_bs=[1])
    captured = engine.graph_runner.enabled
    engine.shutdown()
    if not captured:
        pytest.skip(f"attention={gpu_target.attention} of target {gpu_target.name!r} cannot be captured")
    return gpu_target


def _count_replays(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (batch size, padded size) of every replay."""
    seen: list[tuple[int, int]] = []
    replay = engine.graph_runner.replay

    def spy(batch: Batch, mode: Mode) -> StepOutputs:
        seen.append((batch.size, batch.padded_size))
        return replay(batch, mode)

    monkeypatch.setattr(engine.graph_runner, "replay", spy)
    return seen


def _shrinking_batches(engine: Engine, layout: PageLayout, n: int) -> list[Generation]:
    """n requests admitted together, finishing one per step: decode batches of n, n - 1, ..., 1."""
    vocab = engine.model_config.vocab_size
    prompts = [random_prompt(200 + i, 3 + 5 * i, vocab) for i in range(n)]
    return generate(engine, prompts, [2 + i for i in range(n)], layout)


# CUDA-core decode with the default sizes up to 16 ([1, 2, 4, 8, 16]); tensor-core decode with sizes up to 8.
@pytest.mark.parametrize("name,n", [("llama", 16), ("llama_gqa3", 8)])
def test_graph_replay_matches_eager(
    graph_target: Target,
    wide_models: dict[str, Path],
    name: str,
    n: int,
    monkeypatch: pytest.MonkeyPatch,
    record_property: pytest.RecordProperty,
) -> None:
    layout = PageLayout("shuffled", seed=3)
    graph_engine = gpu_engine(graph_target, wide_models[name], page_size=4, max_running_req=n, cuda_graph_bs=None)
    captured = sorted(graph_engine.graph_runner.graphs["greedy"])
    assert captured == [bs for bs in (1, 2, 4, 8, 16) if bs <= n]
    replays = _count_replays(graph_engine, monkeypatch)
    graphed = _shrinking_batches(graph_engine, layout, n)
    graph_engine.shutdown()
    eager_engine = gpu_engine(graph_target, wide_models[name], page_size=4, max_running_req=n, cuda_graph_bs=[])
    assert not eager_engine.graph_runner.enabled
    eager = _shrinking_batches(eager_engine, layout, n)
    eager_engine.shutdown()
    assert {size for size, _ in replays} == set(range(1, n + 1)), replays
    expected = {(size, next(bs for bs in captured if bs >= size)) for size in range(1, n + 1)}
    assert set(replays) == expected, "sizes between captured ones must be padded up to the next one"
    worst = assert_runs_match(graphed, eager, f"{name}: graph vs eager")
    record_property(f"max_logit_diff_graph_vs_eager_{name}", round(worst, 5))


def _map_pages(engine: Engine, req: Req, pages: list[int], length: int) -> list[int]:
    """Write the slots of `pages` into req's page-table row for positions [0, length); returns the pages used."""
    size = engine.config.page_size
    used = pages[: -(-length // size)]
    slots = (torch.tensor(used)[:, None] * size + torch.arange(size)).flatten()[:length]
    engine.page_table[req.table_idx, :length] = slots.to(torch.int32).to(engine.page_table.device)
    return used


def _padded_step(engine: Engine, poison_dummy: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Prefill 4 requests, then decode 3 of them in one step (padded to 4 on a graph engine).

    Returns the decode logits and slot masks: which slots changed in the step, the real requests' write slots,
    every slot of the 4th request (not in the batch), and the dummy page's slots.
    """
    vocab, size = engine.model_config.vocab_size, engine.config.page_size
    order = torch.randperm(engine.num_pages, generator=torch.Generator().manual_seed(11)).tolist()
    reqs, owned = [], []
    for i in range(4):
        prompt = torch.tensor(random_prompt(300 + i, 6 + 3 * i, vocab), dtype=torch.int32)
        req = Req(prompt, i, 0, 4, i, SamplingParams(max_tokens=4, ignore_eos=True))
        owned.append(_map_pages(engine, req, order[8 * i : 8 * i + 8], len(prompt) + 4))
        reqs.append(req)
    out = engine.forward_batch(*engine.prepare_batch(reqs, "prefill"))
    out.copy_done_event.synchronize()
    for req, token in zip(reqs, out.next_tokens_cpu):
        req.append_host(token)
    kv = engine.kv_cache.buffer
    slot_owner = torch.zeros(engine.kv_cache.num_slots, dtype=torch.bool)
    for pages in owned:
        for page in pages:
            slot_owner[page * size : (page + 1) * size] = True
    dummy = torch.zeros_like(slot_owner)
    dummy[engine.kv_cache.dummy_page * size :] = True
    flat = kv.view(2, kv.shape[1], -1, *kv.shape[-2:])  # [2, layers, slots, heads, dim]
    flat[:, :, (~slot_owner & ~dummy).to(kv.device)] = SENTINEL
    if poison_dummy:  # padded rows read only the dummy page; garbage there must not reach real rows
        flat[:, :, dummy.to(kv.device)] = 1e4
    before = kv.clone()
    batch, args = engine.prepare_batch(reqs[:3], "decode")
    write_slots = torch.zeros_like(slot_owner)
    table = engine.page_table.cpu()
    write_slots[[int(table[r.table_idx, r.cached_len]) for r in batch.reqs]] = True
    out = engine.forward_batch(batch, args)
    out.copy_done_event.synchronize()
    changed = (kv != before).view(2, kv.shape[1], -1, kv.shape[-2] * kv.shape[-1]).any(-1).any(1).any(0).cpu()
    fourth = torch.zeros_like(slot_owner)
    for page in owned[3]:
        fourth[page * size : (page + 1) * size] = True
    padded = batch.padded_size
    return out.logits.float().cpu(), {"changed": changed, "writes": write_slots, "fourth": fourth, "dummy": dummy,
                                      "padded": torch.tensor(padded)}


def test_padded_rows_are_inert(
    graph_target: Target, wide_models: dict[str, Path], record_property: pytest.RecordProperty
) -> None:
    model = wide_models["llama"]
    graph_engine = gpu_engine(graph_target, model, page_size=4, cuda_graph_bs=GRAPH_BS)
    logits, masks = _padded_step(graph_engine, poison_dummy=True)
    graph_engine.shutdown()
    assert int(masks["padded"]) == 4, "3 requests should pad to the captured size 4"
    changed = masks["changed"]
    stray = changed & ~masks["writes"] & ~masks["dummy"]
    assert not stray.any(), f"slots {stray.nonzero().flatten().tolist()[:10]} changed outside the batch's writes"
    assert (changed & masks["writes"]).sum() == 3, "each real request writes its one new slot"
    assert not (changed & masks["fourth"]).any(), "the request outside the batch lost KV"
    eager_engine = gpu_engine(graph_target, model, page_size=4, cuda_graph_bs=[])
    eager_logits, eager_masks = _padded_step(eager_engine, poison_dummy=False)
    eager_engine.shutdown()
    assert int(eager_masks["padded"]) == 3
    err = float((logits - eager_logits).abs().max())
    bound = 0.06 * max(1.0, float(eager_logits.abs().max()))
    assert err <= bound, f"real rows next to padded ones differ from eager by {err:.3g} (bound {bound:.3g})"
    record_property("max_logit_diff_padded_vs_eager", round(err, 5))


def test_replay_that_skips_the_positions_copy_is_caught(
    graph_target: Target, wide_models: dict[str, Path], record_property: pytest.RecordProperty
) -> None:
    """A mutant runner that copies the packed inputs but not their positions reuses the capture's zeros: the
    comparison must fail (or the slot checks refuse the step, whose stale positions write over cached KV)."""
    model = wide_models["llama"]
    vocab = 512
    prompts = [random_prompt(400 + i, 20 + 3 * i, vocab) for i in range(3)]
    runs = {}
    for label, graphs in (("eager", []), ("graph", GRAPH_BS), ("mutant", GRAPH_BS)):
        engine = gpu_engine(graph_target, model, cuda_graph_bs=graphs)
        with graph_positions_stale() if label == "mutant" else contextlib.nullcontext():
            runs[label] = generate(engine, prompts, 6)
        engine.shutdown()
    assert_runs_match(runs["graph"], runs["eager"], "graph vs eager")
    mutant = runs["mutant"]
    if all(g.error is None for g in mutant):
        with pytest.raises(AssertionError):
            assert_runs_match(mutant, runs["eager"], "mutant vs eager")
        deviation = max(float((m.logits[1] - e.logits[1]).abs().max()) for m, e in zip(mutant, runs["eager"]))
        record_property("mutant_first_decode_logit_deviation", round(deviation, 4))
    else:
        record_property("mutant_refused", next(str(g.error) for g in mutant if g.error is not None)[:200])


def test_each_decode_batch_replays_its_mode(graph_target: Target, wide_models: dict[str, Path]) -> None:
    """Greedy batches replay the greedy step; sampled ones the step that draws inside the graph where the sampler
    has one for them (unseeded: FlashInfer's 'draw', or 'draw_min_p' where a row uses min-p; every sampled row seeded:
    'seeded'); others the logits-only
    step, their draw made after it."""
    engine = gpu_engine(graph_target, wide_models["qwen3"], cuda_graph_bs=[1, 2, 4])
    modes: list[Mode] = []
    replay = engine.graph_runner.replay

    def spy(batch: Batch, mode: Mode) -> StepOutputs:
        modes.append(mode)
        return replay(batch, mode)

    engine.graph_runner.replay = spy  # type: ignore[method-assign]
    vocab = engine.model_config.vocab_size
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=3, ignore_eos=True)
    seeded = [SamplingParams(temperature=0.8, top_k=7, seed=s, max_tokens=3, ignore_eos=True) for s in (3, 4)]
    runs: dict[Mode, list[SamplingParams]] = {
        "greedy": [SamplingParams(max_tokens=3, ignore_eos=True)] * 3,
        "draw": [sampled, SamplingParams(temperature=0.7, top_k=5, max_tokens=3, ignore_eos=True)],
        "draw_min_p": [sampled, SamplingParams(temperature=0.7, top_k=5, min_p=0.1, max_tokens=3, ignore_eos=True)],
        "seeded": seeded,
        "logits": [sampled, seeded[0]],
    }
    captured = ("greedy", "logits", *engine.sampler.graph_modes())
    for expected, params in runs.items():
        modes.clear()
        gens = StaticDriver(engine).generate([random_prompt(i, 5, vocab) for i in range(len(params))], params)
        assert all(len(g.output_ids) == 3 and all(0 <= t < vocab for t in g.output_ids) for g in gens)
        want = expected if expected in captured else "logits"
        assert modes and set(modes) == {want}, f"{expected} batch replayed {modes}"
    engine.shutdown()


def test_shutdown_destroys_graphs(graph_target: Target, wide_models: dict[str, Path]) -> None:
    engine = gpu_engine(graph_target, wide_models["qwen3"], cuda_graph_bs=[1, 2])
    assert sorted(engine.graph_runner.graphs["greedy"]) == [1, 2]
    engine.shutdown()
    assert engine.graph_runner.graphs == {} and engine.graph_runner.inputs is None
    engine.shutdown()  # idempotent
