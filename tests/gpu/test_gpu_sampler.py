"""The FlashInfer sampler against the exact reference distribution (oracle.sampler), eagerly and drawn inside a
captured graph from static parameters; a captured seeded draw against the eager one, exactly; fresh draws on every
replay of a captured graph.

Statistics: each sampled parameter set gets a chi-square goodness-of-fit test and a support check (oracle.stats),
ambiguous tokens (decisions within rounding of a threshold) excluded. This module runs 22 statistical tests under
a family-wise false-failure budget of 5e-4 (the GPU property module takes the other 5e-4 of the GPU run's 1e-3), so
each uses alpha = 5e-4 / 22 ≈ 2.3e-5. Sample size: 40,960 draws per parameter set, in the mixed batches and in the
replay test; at that alpha a chi-square test with up to 40 bins detects an effect size w = 0.05 with power 0.997
(oracle.stats.power).
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_support import needs_flashinfer

from engine import Batch, Req, SamplingParams
from engine.errors import NonFiniteLogitsError
from engine.sample import BatchSamplingArgs, Sampler
from engine.sample_graph import ROW_BYTES
from oracle.sampler import reference_distribution
from oracle.stats import AlphaBudget, chi_square_gof, support_check

pytestmark = needs_flashinfer

VOCAB = 64
ALPHA = AlphaBudget(tests=22, total=5e-4).per_test
MIXED = [
    SamplingParams(temperature=0.7, top_k=10),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=1.3, top_k=20, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, min_p=0.2),
    SamplingParams(temperature=0.5, top_k=5, top_p=0.6),
    SamplingParams(temperature=0.0),  # greedy rows in the same batch must stay argmax
]
ROWS_PER_SET, CALLS = 4096, 10


def _row(seed: int) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2.0


def _args(sampler: Sampler, params: list[SamplingParams]) -> BatchSamplingArgs:
    reqs = [Req(torch.zeros(3, dtype=torch.int32), i, 2, 1, i, p) for i, p in enumerate(params)]
    return sampler.prepare(Batch(reqs, "decode"))


def _check(counts: torch.Tensor, row: torch.Tensor, params: SamplingParams, what: str) -> None:
    ref = reference_distribution(row, params)
    unclear = ref.unclear(decides_on_probs=True)  # FlashInfer's kernels drew these
    n = int(counts.sum())
    chi = chi_square_gof(counts, ref.probs, ALPHA, exclude=unclear)
    assert chi.passed, f"{what}: {chi.message()}"
    support = support_check(counts, ref.probs, n, ALPHA, ambiguous=unclear)
    assert support.passed, f"{what}: {support.message()}"


def test_flashinfer_sampler_matches_reference_in_a_mixed_batch() -> None:
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=1234, use_flashinfer=True)
    rows = [_row(10 + i) for i in range(len(MIXED))]
    params = [MIXED[r % len(MIXED)] for r in range(len(MIXED) * ROWS_PER_SET)]
    logits = torch.stack([rows[r % len(MIXED)] for r in range(len(params))]).cuda()
    args = _args(sampler, params)
    which = torch.arange(len(params)) % len(MIXED)
    counts = torch.zeros(len(MIXED), VOCAB, dtype=torch.int64)
    for _ in range(CALLS):
        tokens = sampler.sample(logits, args).long().cpu()
        counts.index_put_((which, tokens), torch.ones_like(tokens), accumulate=True)
    for i, p in enumerate(MIXED):
        if p.is_greedy:
            assert counts[i, int(rows[i].argmax())] == ROWS_PER_SET * CALLS, "a greedy row left the argmax"
        else:
            _check(counts[i], rows[i], p, f"parameter set {i} ({p})")


@pytest.mark.parametrize("bad", ["NaN", "+inf", "all -inf", "overflow"])
def test_a_row_with_nothing_to_sample_raises_and_puts_the_philox_offset_back(bad: str) -> None:
    """FlashInfer's path finds such rows in its fused tempered softmax: the call raises naming the row and puts the
    Philox offset back, so the other rows, drawn again without it, get what a fresh sampler draws."""
    good = torch.stack([_row(s) for s in (31, 32, 33)])
    row = _row(34)
    if bad == "NaN":
        row[7] = math.nan
    elif bad == "+inf":
        row[7] = math.inf
    elif bad == "all -inf":
        row[:] = -math.inf
    else:
        row[3] = 1000.0  # / 1e-37 overflows float32
    logits = torch.cat([good[:1], row[None], good[1:]]).cuda()
    others = [MIXED[0], MIXED[2], MIXED[5]]
    row_params = SamplingParams(temperature=1e-37) if bad == "overflow" else MIXED[1]
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=5, use_flashinfer=True)
    with pytest.raises(NonFiniteLogitsError, match=r"batch rows \[1\]") as raised:
        sampler.sample(logits, _args(sampler, [others[0], row_params, *others[1:]]))
    assert raised.value.rows == [1]
    again = sampler.sample(good.cuda(), _args(sampler, others))
    fresh = Sampler(torch.device("cuda"), VOCAB, seed=5, use_flashinfer=True)
    assert torch.equal(again.cpu(), fresh.sample(good.cuda(), _args(fresh, others)).cpu())


@pytest.mark.parametrize("mode", ["draw", "draw_min_p"])
def test_a_captured_draw_follows_each_rows_loaded_parameters(mode: str) -> None:
    """The engine's draw modes: graph_draw captured once over static parameters, a mixed batch's parameters loaded
    before each replay (padding rows greedy); every row follows the reference distribution of its own parameters.
    A batch with a min-p row takes 'draw_min_p', one without 'draw'."""
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=4321, use_flashinfer=True)
    per_set, replays, pad = 512, 80, 8
    kinds = MIXED if mode == "draw_min_p" else [p for p in MIXED if p.min_p == 0.0]
    rows = [_row(40 + i) for i in range(len(kinds))]
    params = [kinds[r % len(kinds)] for r in range(len(kinds) * per_set)]
    reqs = [Req(torch.zeros(3, dtype=torch.int32), i, 2, 1, i, p) for i, p in enumerate(params)]
    batch = Batch(reqs, "decode", padded_reqs=reqs + reqs[-1:] * pad)
    batch.packed_inputs = (torch.zeros(1, dtype=torch.int64), None)  # type: ignore[assignment]  # a graph batch
    args = sampler.prepare(batch)
    assert args.graph_mode == mode
    assert args.graph_params is not None and args.graph_params.shape == (ROW_BYTES * (len(params) + pad),)
    logits = torch.cat([torch.stack([rows[r % len(kinds)] for r in range(len(params))]), rows[0].expand(pad, -1)])
    logits = logits.cuda()
    positions = torch.full((len(logits),), 3, device="cuda")  # each row's device_len
    sampler.load_graph_params(args)
    sampler.graph_draw(logits, mode, positions)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampler.graph_draw(logits, mode, positions)
    which = torch.arange(len(params)) % len(kinds)
    counts = torch.zeros(len(kinds), VOCAB, dtype=torch.int64)
    for _ in range(replays):
        sampler.load_graph_params(args)
        graph.replay()
        tokens = out.long().cpu()
        assert torch.equal(tokens[len(params):], torch.full((pad,), int(rows[0].argmax()))), "a padding row drew"
        counts.index_put_((which, tokens[: len(params)]), torch.ones(len(params), dtype=torch.int64), accumulate=True)
    for i, p in enumerate(kinds):
        if p.is_greedy:
            assert counts[i, int(rows[i].argmax())] == per_set * replays, "a greedy row left the argmax"
        else:
            _check(counts[i], rows[i], p, f"captured draw, parameter set {i} ({p})")


def test_a_captured_seeded_draw_is_the_eager_draw() -> None:
    """The seeded mode: every sampled row seeded, drawn inside a captured step with HF's filters and the seeded noise
    keyed by the row's seed: bitwise the tokens an eager step draws for the same rows."""
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=8, use_flashinfer=True)
    params = [SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, seed=100 + i)
              if not p.is_greedy else p for i, p in enumerate(MIXED * 40)]
    rows = [_row(60 + i) for i in range(len(params))]
    logits = torch.stack(rows + rows[:3]).cuda()
    reqs = [Req(torch.zeros(3, dtype=torch.int32), i, 2, 1, i, p) for i, p in enumerate(params)]
    eager = sampler.sample(logits[: len(params)], sampler.prepare(Batch(reqs, "decode")))
    batch = Batch(reqs, "decode", padded_reqs=reqs + reqs[:3])
    batch.packed_inputs = (torch.zeros(1, dtype=torch.int64), None)  # type: ignore[assignment]  # a graph batch
    args = sampler.prepare(batch)
    assert args.graph_mode == "seeded"
    positions = torch.full((len(logits),), 3, device="cuda")  # each row's device_len
    sampler.load_graph_params(args)
    sampler.graph_draw(logits, "seeded", positions)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampler.graph_draw(logits, "seeded", positions)
    sampler.load_graph_params(args)
    graph.replay()
    assert torch.equal(out[: len(params)], eager), "the captured seeded draw left the eager one"


def test_seeded_requests_do_not_depend_on_their_batch() -> None:
    """Seeded rows take the torch path (FlashInfer's Philox stream depends on the row index)."""
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=5, use_flashinfer=True)
    seeded = SamplingParams(temperature=1.0, top_k=30, seed=99)
    row = _row(3).cuda()
    alone = sampler.sample(row[None], _args(sampler, [seeded]))
    mixed = sampler.sample(row.expand(3, -1).contiguous(), _args(sampler, [MIXED[0], seeded, MIXED[1]]))
    assert int(alone[0]) == int(mixed[1])


def test_reseed_restarts_the_philox_stream() -> None:
    """reseed(s) after some draws replays what a fresh sampler seeded with s draws: FlashInfer's seed and offset
    restart with the generator, or replayed runs of an unseeded sampled batch would draw other tokens."""
    params = [SamplingParams(temperature=1.0, top_k=64)] * 256
    logits = _row(21).cuda().expand(256, -1).contiguous()
    fresh = Sampler(torch.device("cuda"), VOCAB, seed=11, use_flashinfer=True)
    expected = [fresh.sample(logits, _args(fresh, params)).cpu() for _ in range(2)]
    used = Sampler(torch.device("cuda"), VOCAB, seed=3, use_flashinfer=True)
    used.sample(logits, _args(used, params))
    used.reseed(11)
    got = [used.sample(logits, _args(used, params)).cpu() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert not torch.equal(got[0], got[1])


def test_graph_replays_draw_fresh_samples() -> None:
    """One captured draw, replayed: the device-side Philox offset advances inside the graph, so every replay
    draws anew, and the pooled draws follow the reference distribution."""
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=7, use_flashinfer=True)
    params = SamplingParams(temperature=0.9, top_k=32, top_p=0.95, min_p=0.01)
    rows, replays = 4096, 10
    row = _row(77)
    args = _args(sampler, [params] * rows)
    probs = (row.cuda() / params.temperature).softmax(-1).expand(rows, -1).contiguous()
    sampler.flashinfer_draw(probs, args)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampler.flashinfer_draw(probs, args)
    draws = []
    for _ in range(replays):
        graph.replay()
        draws.append(out.clone())
    torch.cuda.synchronize()
    for i in range(replays - 1):
        assert not torch.equal(draws[i], draws[i + 1]), f"replays {i} and {i + 1} drew the same {rows} tokens"
    counts = torch.bincount(torch.cat(draws).long().cpu(), minlength=VOCAB)
    _check(counts, row, params, "pooled graph replays")
    # The check has teeth: with seed and offset baked in as Python ints, every replay repeats the first.
    top_k = torch.full((rows,), 32, dtype=torch.int32, device="cuda")
    top_p = torch.full((rows,), 0.95, device="cuda")
    baked = torch.cuda.CUDAGraph()
    with torch.cuda.graph(baked):
        frozen = sampler._fi.top_k_top_p_sampling_from_probs(probs, top_k, top_p, seed=5, offset=0)
    baked.replay()
    first = frozen.clone()
    baked.replay()
    assert torch.equal(first, frozen)
