"""The engine's sampler: statistics of the seed's example, filters, greedy rows in mixed batches, seeds."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from scipy.stats import binomtest

from engine import Batch, NonFiniteLogitsError, Req, SamplingParams, sample_graph
from engine.sample import BaseSampler, BatchSamplingArgs, Sampler, flashinfer_thresholds
from engine.sample_rows import KEYS_EXACT_BELOW
from oracle.checks import check_filtered_distribution
from oracle.sampler import reference_distribution

VOCAB = 6


def _batch(params: list[SamplingParams], position: int = 5) -> Batch:
    reqs = [Req(torch.zeros(position, dtype=torch.int32), i, 0, 1, i, p) for i, p in enumerate(params)]
    return Batch(reqs, "decode")


def _draw(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    return sampler.sample(logits, sampler.prepare(_batch(params)))


def test_seed_statistics_top_k_2() -> None:
    """vocab 6, top-k 2, logits [2, 1, 0, ...]: softmax([2, 1]) puts 0.7311 on the top token.

    N = 20000 draws; two-sided binomial test at α = 1e-4 (so a correct sampler fails 1 run in 10 000).
    """
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=1234)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0, -3.0]]).expand(20000, VOCAB).contiguous()
    tokens = _draw(sampler, logits, [SamplingParams(temperature=1.0, top_k=2)] * 20000)
    assert set(tokens.tolist()) <= {0, 1}
    expected = 1 / (1 + math.exp(-1))
    assert abs(expected - 0.7311) < 1e-4
    assert binomtest(int((tokens == 0).sum()), 20000, expected).pvalue > 1e-4


def test_top_p_keeps_only_the_top_token_when_it_exceeds_p() -> None:
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    logits = torch.tensor([[5.0, 1.5, 1.0, 0.0, 0.0, 0.0]]).expand(2000, VOCAB).contiguous()
    probs = logits[0].softmax(-1)
    assert probs[0] > 0.9
    tokens = _draw(sampler, logits, [SamplingParams(temperature=1.0, top_p=0.9)] * 2000)
    assert (tokens == 0).all()
    # Just above the top token's mass, the second token (mass above it < p) comes back; the third doesn't.
    p = float(probs[0]) + 1e-3
    tokens = _draw(sampler, logits, [SamplingParams(temperature=1.0, top_p=p)] * 2000)
    assert set(tokens.tolist()) == {0, 1}


def test_greedy_rows_in_a_mixed_batch_are_argmax() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 50, generator=gen)
    params = [
        SamplingParams(temperature=0.0) if i % 3 == 0 else SamplingParams(temperature=1.5, top_p=0.95)
        for i in range(64)
    ]
    sampler = Sampler(torch.device("cpu"), 50, seed=0)
    for _ in range(20):
        tokens = _draw(sampler, logits, params)
        greedy = torch.tensor([p.is_greedy for p in params])
        assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy].int())
    assert not torch.equal(tokens[~greedy], logits.argmax(-1)[~greedy].int())  # sampled rows do sample


def test_min_p_drops_tokens_below_the_scaled_max() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.05, 0.02, 0.01]]))
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    args = sampler.prepare(_batch([SamplingParams(temperature=1.0, min_p=0.2)]))
    probs = sampler.filtered_probs(logits, args)[0]
    # threshold 0.2 × 0.5 = 0.1: tokens 0, 1, 2 stay, renormalized (the reference's probabilities: 0.5, 0.3, 0.12
    # over 0.92), within the harness's float32 bound for a filtered distribution.
    ref = reference_distribution(logits[0], SamplingParams(temperature=1.0, min_p=0.2))
    assert ref.support.tolist() == [True, True, True, False, False, False]
    assert check_filtered_distribution(probs, ref) is None


def test_min_p_threshold_scales_the_max_of_the_tempered_distribution() -> None:
    """T 0.5 squares the probabilities [0.5, 0.3, 0.12, ...]: tempered [0.70, 0.25, 0.040, ...], min-p 0.07 cuts at
    0.049 and drops token 2; a threshold from the raw max (0.035) would keep it."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.05, 0.02, 0.01]]))
    params = SamplingParams(temperature=0.5, min_p=0.07)
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    probs = sampler.filtered_probs(logits, sampler.prepare(_batch([params])))[0]
    ref = reference_distribution(logits[0], params)
    assert ref.support.tolist() == [True, True, False, False, False, False]
    assert check_filtered_distribution(probs, ref) is None


def test_top_p_reads_the_distribution_renormalized_after_top_k() -> None:
    """Probabilities [0.5, 0.3, 0.12, ...], top-k 2 then top-p 0.6 (HF's order): renormalized [0.625, 0.375], the top
    token alone reaches 0.6. Top-p first would keep tokens 0 and 1 of the full distribution (0.5 < 0.6)."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.05, 0.02, 0.01]]))
    params = SamplingParams(temperature=1.0, top_k=2, top_p=0.6)
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    probs = sampler.filtered_probs(logits, sampler.prepare(_batch([params])))[0]
    ref = reference_distribution(logits[0], params)
    assert ref.support.tolist() == [True, False, False, False, False, False]
    assert check_filtered_distribution(probs, ref) is None


def test_top_k_keeps_every_token_tied_with_the_kth() -> None:
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, 0.0]])
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    probs = sampler.filtered_probs(logits, sampler.prepare(_batch([SamplingParams(temperature=1.0, top_k=2)])))[0]
    assert (probs[:4] > 0).all() and (probs[4:] == 0).all()


def test_top_k_one_samples_among_tied_maxima() -> None:
    """HF's top-k keeps every token tied with the k-th value, so top_k = 1 with a positive temperature samples
    uniformly among tied maxima (it is not greedy). 3000 draws: each tied token is missed with probability
    (2/3)^3000 < 1e-500."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -1.0]])
    params = SamplingParams(temperature=1.0, top_k=1)
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    probs = sampler.filtered_probs(logits, sampler.prepare(_batch([params])))[0]
    assert torch.equal(probs > 0, torch.tensor([False, True, True, False, True, False]))
    tokens = _draw(sampler, logits.expand(3000, VOCAB).contiguous(), [params] * 3000)
    assert set(tokens.tolist()) == {1, 2, 4}


def test_top_p_keeps_the_highest_indices_of_a_tie_it_splits() -> None:
    """probs [0.4, 0.2, 0.2, 0.2], top_p 0.7: HF's ascending sort puts the tied tokens 1, 2, 3 first; their
    cumulative masses 0.2, 0.4, 0.6 against the cut 1 - 0.7 remove token 1 only (lowest-index-first kept 0, 1, 2)."""
    logits = torch.tensor([[0.4, 0.2, 0.2, 0.2, 0.0, 0.0]]).log()
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    args = sampler.prepare(_batch([SamplingParams(temperature=1.0, top_p=0.7)]))
    probs = sampler.filtered_probs(logits, args)[0]
    assert torch.equal(probs > 0, torch.tensor([True, False, True, True, False, False]))


def test_rows_without_top_p_keep_their_tail_next_to_top_p_rows() -> None:
    """Class 3: a batch-mate's top-p must not truncate a row without top-p, whose tail here carries ~1e-9..1e-13
    each (a float32 "mass above" reaches 1.0 long before it)."""
    logits = torch.tensor([[0.0, -21.0, -24.0, -27.0, -30.0, -2.0], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]])
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.5)]
    sampler = Sampler(torch.device("cpu"), VOCAB, seed=0)
    probs = sampler.filtered_probs(logits, sampler.prepare(_batch(params)))
    assert bool((probs[0] > 0).all())
    assert int((probs[1] > 0).sum()) == 3


def test_seeded_requests_reproduce_and_differ_by_seed() -> None:
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(0))
    logits[1] = logits[0]
    params = [SamplingParams(temperature=1.0, seed=s) for s in (7, 7, 8, 9)]
    a = _draw(Sampler(torch.device("cpu"), 200, seed=1), logits, params)
    b = _draw(Sampler(torch.device("cpu"), 200, seed=2), logits, params)  # engine generator differs
    assert torch.equal(a, b)
    assert a[0] == a[1]  # same seed, same logits, same position
    draws = {s: [] for s in (7, 8)}  # type: dict[int, list[int]]
    for pos in range(30):
        for s in draws:
            sampler = Sampler(torch.device("cpu"), 200, seed=0)
            p = [SamplingParams(temperature=1.0, seed=s)]
            draws[s].append(int(sampler.sample(logits[:1], sampler.prepare(_batch(p, position=pos + 1)))[0]))
    assert draws[7] != draws[8]


def test_temperature_zero_is_greedy() -> None:
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(5))
    sampler = Sampler(torch.device("cpu"), 30, seed=0)
    tokens = _draw(sampler, logits, [SamplingParams(temperature=0.0, top_k=5, top_p=0.5)] * 8)
    assert torch.equal(tokens, logits.argmax(-1).int())


def test_reseed_replays_the_draws_of_a_fresh_sampler() -> None:
    params = [SamplingParams(temperature=1.0)] * 64
    batch = Batch([Req(torch.zeros(1, dtype=torch.int32), i, 0, 1, i, p) for i, p in enumerate(params)], "decode")
    logits = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    fresh = Sampler(torch.device("cpu"), 32, seed=11)
    expected = fresh.sample(logits, fresh.prepare(batch))
    used = Sampler(torch.device("cpu"), 32, seed=3)
    used.sample(logits, used.prepare(batch))
    used.reseed(11)
    assert torch.equal(used.sample(logits, used.prepare(batch)), expected)


class TemperatureOnly(BaseSampler):
    """A plugin with only the required hook: softmax(logits / T), no filters."""

    def filtered_probs(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        return (logits / args.temperature.unsqueeze(1)).softmax(dim=-1)


class NoNoise(TemperatureOnly):
    def noise(self, probs: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        return torch.ones_like(probs)


def test_a_plugin_with_only_filtered_probs_gets_greedy_rows_seeds_and_non_finite_rows_from_the_base() -> None:
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(2))
    logits[2] = math.nan
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=1.0),
              SamplingParams(temperature=1.0)]
    sampler = TemperatureOnly(torch.device("cpu"), 40, seed=0)
    tokens, undo = sampler.sample_deferred(logits, sampler.prepare(_batch(params)))
    assert tokens.dtype == torch.int32 and tokens.shape == (4,)
    assert tokens[0] == logits[0].argmax() and tokens[2] == -1
    undo()
    with pytest.raises(NonFiniteLogitsError, match="NaN logits"):
        sampler.sample(logits, sampler.prepare(_batch(params)))
    other = TemperatureOnly(torch.device("cpu"), 40, seed=1)  # the seeded row draws the same token anyway
    assert _draw(other, logits[1:2], params[1:2]) == tokens[1]


def test_the_draw_divides_by_the_noise_hook() -> None:
    logits = torch.randn(8, 40, generator=torch.Generator().manual_seed(3))
    tokens = _draw(NoNoise(torch.device("cpu"), 40, seed=0), logits, [SamplingParams(temperature=1.0)] * 8)
    assert torch.equal(tokens, logits.argmax(dim=-1).int())


def test_a_seeded_graph_draw_is_the_eager_draw() -> None:
    """The 'seeded' graph mode, run eagerly here: a batch's parameters packed into one block (padding rows greedy),
    loaded, and drawn with every filter applied, give bitwise the tokens sample() draws with only the filters the
    batch uses (top-k vocab, top-p 1 and min-p 0 change no probability)."""
    vocab, pad = 48, 3
    sampler = Sampler(torch.device("cpu"), vocab, seed=1)
    kinds = [
        SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, min_p=0.1), SamplingParams(temperature=1.1, top_k=9, top_p=0.7, min_p=0.02),
        SamplingParams(temperature=0.8), SamplingParams(),
    ]
    params = [p if p.is_greedy else SamplingParams(p.temperature, p.top_k, p.top_p, p.min_p, seed=50 + i)
              for i, p in enumerate(kinds * 5)]
    logits = torch.randn(len(params) + pad, vocab, generator=torch.Generator().manual_seed(3)) * 3
    reqs = [Req([1, 2, 3], i, 2, 1, i, p) for i, p in enumerate(params)]
    eager = sampler.sample(logits[: len(params)], sampler.prepare(Batch(reqs, "decode")))
    batch = Batch(reqs, "decode", padded_reqs=reqs + reqs[:pad])
    batch.packed_inputs = (torch.zeros(1, dtype=torch.int64), None)  # type: ignore[assignment]  # a graph batch
    args = sampler.prepare(batch)
    assert args.graph_mode == "seeded" and args.graph_params is not None
    sampler.load_graph_params(args)
    drawn = sampler.graph_draw(logits, "seeded", torch.full((len(logits),), 3))  # each row's device_len
    assert torch.equal(drawn[: len(params)], eager)
    assert torch.equal(drawn[len(params):], logits[len(params):].argmax(dim=-1).to(torch.int32))  # padding: greedy


def test_prepare_rows_are_the_parameters_as_hf_reads_them() -> None:
    """prepare uploads one parameter block and hands out views of it: temperature and min-p rounded to float32, top-p
    kept in double, top-k vocab where it filters nothing, greedy rows at temperature 1; padding rows greedy."""
    vocab = 40
    params = [SamplingParams(temperature=0.7, top_k=5, top_p=0.3, min_p=0.1, seed=3), SamplingParams(),
              SamplingParams(temperature=1.3, top_k=vocab + 2, seed=4), SamplingParams(temperature=0.9, seed=5)]
    reqs = [Req([1, 2, 3], i, 2, 1, i, p) for i, p in enumerate(params)]
    batch = Batch(reqs, "decode", padded_reqs=reqs + reqs[:2])
    batch.packed_inputs = (torch.zeros(1, dtype=torch.int64), None)  # type: ignore[assignment]  # a graph batch
    args = Sampler(torch.device("cpu"), vocab, seed=0).prepare(batch)
    assert torch.equal(args.greedy, torch.tensor([False, True, False, False]))
    assert torch.equal(args.temperature, torch.tensor([0.7, 1.0, 1.3, 0.9], dtype=torch.float32))
    assert args.top_k is not None and torch.equal(args.top_k, torch.tensor([5, vocab, vocab, vocab]))
    assert args.top_k_max == 5
    assert args.top_p is not None and torch.equal(args.top_p, torch.tensor([0.3, 1.0, 1.0, 1.0], dtype=torch.float64))
    assert args.min_p is not None and torch.equal(args.min_p, torch.tensor([0.1, 0.0, 0.0, 0.0], dtype=torch.float32))
    assert args.graph_mode == "seeded" and args.graph_params is not None
    padded = sample_graph.unpack(args.graph_params)
    assert torch.equal(padded.greedy[4:], torch.tensor([True, True])) and torch.equal(padded.seeds[4:], torch.zeros(2))
    assert torch.equal(padded.top_k[4:], torch.full((2,), vocab))
    assert args.row_seeds[1] is None and padded.seeds[0] == args.row_seeds[0]
    # FlashInfer's thresholds as the block holds them: what the rule makes of the rows (top-p rounded from double).
    assert args.flashinfer_thresholds is not None
    top_k, top_p = args.flashinfer_thresholds
    want_k, want_p = flashinfer_thresholds(dataclasses.replace(args, flashinfer_thresholds=None), 4, vocab)
    assert top_k.dtype == torch.int32 and torch.equal(top_k, want_k) and torch.equal(top_p, want_p)
    assert torch.equal(top_p, torch.tensor([0.3, 2.0, 2.0, 2.0], dtype=torch.float32))
    assert torch.equal(padded.top_p_cut[4:], torch.full((2,), 2.0))
    assert torch.equal(padded.top_k_int[4:], torch.full((2,), vocab, dtype=torch.int32))


def test_prepare_uploads_a_block_once_while_its_params_repeat() -> None:
    """A decode batch's params come back step after step: prepare reuses their block (and a graph's static buffer
    keeps it) while the same objects come in the same order, with the positions of this step; any other params, order
    or padding get a block of their own, and loading back an earlier block restores it."""
    vocab = 40
    params = [SamplingParams(temperature=0.7, top_k=5, seed=3), SamplingParams(temperature=0.9, top_p=0.5, seed=4)]
    sampler = Sampler(torch.device("cpu"), vocab, seed=0)

    def prepared(ps: list[SamplingParams], length: int, pad: int = 1) -> BatchSamplingArgs:
        reqs = [Req(torch.zeros(length, dtype=torch.int32), i, length - 1, 1, i, p) for i, p in enumerate(ps)]
        batch = Batch(reqs, "decode", padded_reqs=reqs + reqs[:pad])
        batch.packed_inputs = (torch.zeros(1, dtype=torch.int64), None)  # type: ignore[assignment]  # a graph batch
        return sampler.prepare(batch)

    first, second = prepared(params, 6), prepared(params, 7)
    assert second.graph_params is first.graph_params is not None
    assert first.row_positions == [6, 6] and second.row_positions == [7, 7] and second.row_seeds == [3, 4]
    others = [prepared(params[::-1], 7), prepared([params[0], SamplingParams(temperature=0.7, top_k=5, seed=3)], 7),
              prepared(params, 7, pad=2)]
    assert all(o.graph_params is not None and o.graph_params is not first.graph_params for o in others)
    assert torch.equal(others[0].temperature, torch.tensor([0.9, 0.7]))
    sampler.load_graph_params(first)
    sampler.load_graph_params(others[0])
    sampler.load_graph_params(second)
    assert torch.equal(sampler._graph_params.block(3), first.graph_params)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_top_k_off_the_sorted_row_is_top_k_by_topk(device: str) -> None:
    """With top-p on, top-k's k-th largest score is read off top-p's stable sort; without, a topk as wide as the
    largest k gives it. On rows full of ties and -inf, with k from 1 to vocab, both (top-p 1 leaving every row as
    it is) and the captured draw's form (every filter on) give bitwise the same probabilities."""
    vocab, bs = 37, 24
    gen = torch.Generator().manual_seed(11)
    logits = torch.randint(-4, 4, (bs, vocab), generator=gen).float()
    logits[torch.rand(bs, vocab, generator=gen) < 0.2] = float("-inf")
    logits[:, 5] = 1.0  # a finite max on every row
    top_k = torch.tensor([1, 2, 3, 5, 8, vocab - 1, vocab, vocab] * 3)
    temperature = torch.rand(bs, generator=gen) + 0.5
    sampler = Sampler(torch.device(device), vocab, seed=0)

    def probs(k: torch.Tensor, width: int, top_p: torch.Tensor | None, min_p: torch.Tensor | None) -> torch.Tensor:
        args = BatchSamplingArgs(False, torch.zeros(bs, dtype=torch.bool), temperature, k, width, top_p, min_p,
                                 [None] * bs)
        args = BatchSamplingArgs(**{name: value.to(device) if isinstance(value, torch.Tensor) else value
                                    for name, value in vars(args).items()})
        return sampler.filtered_probs(logits.to(device), args).cpu()

    by_topk = probs(top_k, int(top_k[top_k < vocab].max()), None, None)
    assert torch.equal(probs(top_k, vocab, torch.ones(bs, dtype=torch.float64), None), by_topk)
    assert torch.equal(probs(top_k, vocab, torch.ones(bs, dtype=torch.float64), torch.zeros(bs)), by_topk)
    assert torch.equal((by_topk > 0).sum(dim=-1) >= top_k.clamp(max=(logits > float("-inf")).sum(dim=-1)),
                       torch.ones(bs, dtype=torch.bool))  # ties with the k-th stay


def test_top_p_sorts_the_scores_where_the_temperature_rounds_16_bit_logits_together() -> None:
    """Past KEYS_EXACT_BELOW two adjacent bf16 subnormals divide to one float32 score, which HF's tie rule splits by
    index, where their two 16-bit keys would order them: a sampler that filters by key counts (as on CUDA) must sort
    the scores there, eagerly; under the bound it counts the keys, in the captured step too."""
    calls: list[torch.dtype] = []

    def by_keys(logits: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append(logits.dtype)
        return torch.full_like(logits, float("nan"))

    sampler = Sampler(torch.device("cpu"), 2, 0, use_flashinfer=False)
    sampler._row_passes = dataclasses.replace(sampler._row_passes, probs_by_keys=by_keys)  # CUDA's choice, on CPU
    sampler.declare_logits_dtype(torch.bfloat16)
    logits = torch.tensor([[2 * 2.0**-133, 2.0**-133]])
    temperature = 1.5 * KEYS_EXACT_BELOW
    scores = logits / temperature
    assert scores[0, 0] == scores[0, 1] and logits[0, 0] != logits[0, 1]  # one score, two keys
    args = sampler.prepare(_batch([SamplingParams(temperature=temperature, top_p=0.5, seed=7)]))
    assert sampler._graph_mode(args) is None  # a captured step counts the 16-bit keys
    assert sampler.filtered_probs(logits, args).tolist() == [[0.0, 1.0]] and not calls
    under = sampler.prepare(_batch([SamplingParams(temperature=KEYS_EXACT_BELOW - 1.0, top_p=0.5, seed=7)]))
    assert sampler._graph_mode(under) == "seeded"
    assert sampler.filtered_probs(logits, under).isnan().all() and calls == [torch.float32]
