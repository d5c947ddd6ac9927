"""Property 7: the engine samples from exactly the distribution HF's logits processors define.

Mixed batches (greedy and sampled rows, each with its own temperature / top-k / top-p / min-p, seeded or not) are
sampled many times. For every sampled row the observed token counts must pass oracle.stats' support check and
chi-square goodness-of-fit test against oracle.sampler's float64 reference distribution (HF order: temperature,
top-k, top-p on the renormalized result, min-p); tokens whose keep/drop decision lies within fp32 rounding of a
threshold (the reference's ambiguous mask, plus the probability ties FlashInfer cannot split where it drew) are left
out of both. Greedy rows (temperature 0) must draw a maximal logit every time.

Every sampled row must be testable: drawn filters that would leave fewer than two chi-square buckets are relaxed
(oracle.checks.relax_until_testable: min-p, then top-p, then top-k off, then temperature 1, then hotter until a
runner-up token gets a bucket), and the property fails when fewer than 80% of its examples have a sampled row checked
and every one with two buckets (oracle.coverage: an example of greedy rows only counts as a miss, so strategies that
stop drawing sampled rows fail). Each batch, synthetic
or model, holds one sampled row (unseeded in a model batch) at a drawn place among the others: batches of greedy rows
alone were 13% of random synthetic examples and 25-40% of model ones, too near the floor. Edge values that
leave a single token are checked exactly, token by token, by properties/test_sampling_exact.py.

α: every check runs at oracle.budget.STAT_ALPHA, the suite's 5e-4 false-failure budget split by Bonferroni over
every statistical check the active profile can run (8.5e-7 per check under `ci`: 585 checks).

Sample sizes and power: every sampled row gets oracle.budget.CHI_SQUARE_DRAWS = 12,000 draws (N_SYNTHETIC, N_MODEL),
and a chi-square keeps at most 32 buckets (df <= 31, oracle.stats.MAX_BUCKETS), so at α = 8.5e-7 each row's test
detects Cohen's w >= 0.091 with power 0.99 under `ci` (w >= 0.095 at `deep`'s α of 5.3e-8): oracle.budget.detectable_w,
checked by tests/test_budget.py. Synthetic rows have vocab 2..24; tiny-model rows vocab 512, whose small tail tokens
are pooled (a support error there, of any mass, is test_sampling_exact's to find).

SmolLM2 is not sampled here: one draw of a 49152-token row costs ~30 ms on the CI CPU (two full sorts), so a
budget of seconds buys too few draws for a test with power, and the sampler's code path does not depend on the
model or the vocabulary size (the synthetic and tiny-model tests cover it).

Synthetic rows go straight to engine.sample.Sampler: all N copies of the batch are sampled in one call, seeded rows
getting seed + copy index so their draws are independent too. Model rows come from one real prefill through the
engine (forward_batch) of up to MODEL_ROWS unseeded requests and at most one seeded one; its own sampler then draws
N times from those logits, with the unseeded rows' parameters relaxed as above for those logits.
The reference is computed from the engine's logits: this property is about sampling, prefill accuracy is
property 2's. Seeded rows of a model batch must repeat their token on every draw (same seed, same position).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Batch, Engine, Req, SamplingParams
from oracle.budget import (
    MODEL_ROWS,
    SAMPLING_MODEL,
    SAMPLING_SYNTHETIC,
    STAT_ALPHA,
    SYNTHETIC_ROWS,
)
from oracle.checks import bucketed_tokens, check_sample_counts, relax_until_testable
from oracle.coverage import exercised, floors
from oracle.drive import TINY_ARCHS, TINY_VOCAB, EnginePool, place
from oracle.strategies import RequestSpec, batches, logits_batches, requests, sampling_params, seeds
from oracle.target import Target

N_SYNTHETIC = SAMPLING_SYNTHETIC.draws
N_MODEL = SAMPLING_MODEL.draws
COPIES_PER_CALL = 1000  # model rows are drawn in calls of this many copies of the batch (bounded memory)
TESTABLE = "sampled rows, each with a testable chi-square (>= 2 buckets)"


def assert_rows_follow_reference(
    draws: torch.Tensor, logits: torch.Tensor, params: list[SamplingParams], on_probs: bool
) -> None:
    """draws: [N, rows] tokens; every row checked with check_sample_counts at STAT_ALPHA (on_probs: FlashInfer drew)."""
    n, vocab = draws.shape[0], logits.shape[1]
    sampled = [row for row, p in enumerate(params) if not p.is_greedy]
    exercised(TESTABLE, bool(sampled) and all(bucketed_tokens(logits[r], params[r], n, on_probs) >= 2 for r in sampled))
    for row, p in enumerate(params):
        counts = torch.bincount(draws[:, row].long(), minlength=vocab)
        failures = check_sample_counts(counts, logits[row], p, STAT_ALPHA, on_probs)
        assert not failures, f"row {row} of {len(params)}, {p}:\n" + "\n".join(failures)


@pytest.mark.statistical
@settings(max_examples=SAMPLING_SYNTHETIC.examples)
@given(data=st.data())
@floors({TESTABLE: 0.8})
def test_sampler_matches_reference_on_synthetic_logits(data: st.DataObject, target: Target) -> None:
    vocab = data.draw(st.integers(2, 24), label="vocab")
    logits = data.draw(logits_batches(vocab, SYNTHETIC_ROWS), label="logits")
    sampled_row = data.draw(st.integers(0, len(logits) - 1), label="sampled row")  # one sampled row at least
    drawn = [data.draw(sampling_params(vocab, greedy=False if r == sampled_row else None, max_tokens=st.just(1)),
                       label=f"params[{r}]") for r in range(len(logits))]
    sampler = target.make_sampler(vocab, data.draw(seeds, label="sampler_seed"))
    one_token = torch.zeros(1, dtype=torch.int32)
    # Relaxed for what the checks will leave out: FlashInfer's probability ties too, where it draws (seeds decide).
    on_probs = sampler.draws_with_flashinfer(sampler.prepare(Batch(
        [Req(one_token, r, 0, 1, r, p) for r, p in enumerate(drawn)], "decode")))
    params = [relax_until_testable(logits[r], p, N_SYNTHETIC, on_probs) for r, p in enumerate(drawn)]
    reqs = [
        Req(one_token, r, 0, 1, r, p if p.seed is None else replace(p, seed=(p.seed + copy) % 2**63))
        for copy in range(N_SYNTHETIC)
        for r, p in enumerate(params)
    ]
    args = sampler.prepare(Batch(reqs, "decode"))
    tokens = sampler.sample(logits.to(sampler.device).repeat(N_SYNTHETIC, 1), args)
    draws = tokens.cpu().view(N_SYNTHETIC, len(params))
    assert_rows_follow_reference(draws, logits, params, sampler.draws_with_flashinfer(args))


def sample_model_batch(engine: Engine, specs: list[RequestSpec], n: int, sampler_seed: int) -> None:
    reqs = [place(engine, s.prompt, 0, row, s.params) for row, s in enumerate(specs)]
    engine.sampler.reseed(sampler_seed)
    batch, args = engine.prepare_batch(reqs, "prefill")
    out = engine.forward_batch(batch, args)
    out.copy_done_event.synchronize()
    logits = out.logits.cpu()
    on_probs = engine.sampler.draws_with_flashinfer(args)  # relaxing changes no seed: the same for the copies
    for row, req in enumerate(reqs):
        if req.sampling_params.seed is None:
            req.sampling_params = relax_until_testable(logits[row], req.sampling_params, n, on_probs)
    copies = engine.sampler.prepare(Batch(reqs * COPIES_PER_CALL, "prefill"))
    repeated = out.logits.repeat(COPIES_PER_CALL, 1)
    calls = -(-n // COPIES_PER_CALL)
    draws = torch.cat([engine.sampler.sample(repeated, copies).cpu().view(COPIES_PER_CALL, -1) for _ in range(calls)])
    draws = draws[:n]
    params = [r.sampling_params for r in reqs]
    for row, p in enumerate(params):
        if p.seed is not None and not p.is_greedy:
            assert bool((draws[:, row] == draws[0, row]).all()), f"seeded row {row} ({p}) changed its token"
    unseeded = [row for row, p in enumerate(params) if p.seed is None or p.is_greedy]
    assert_rows_follow_reference(draws[:, unseeded], logits[unseeded], [params[r] for r in unseeded], on_probs)


@pytest.mark.statistical
@settings(max_examples=SAMPLING_MODEL.examples)
@given(data=st.data())
@floors({TESTABLE: 0.8})
def test_sampler_matches_reference_on_tiny_model_logits(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    arch = data.draw(st.sampled_from(TINY_ARCHS), label="arch")
    unseeded = sampling_params(TINY_VOCAB, seeded=False, max_tokens=st.just(1))
    specs = data.draw(batches(TINY_VOCAB, MODEL_ROWS - 1, 32, params=unseeded, min_size=0), label="requests")
    # One sampled row at least, anywhere in the batch: short lists of greedy rows alone left the law unchecked.
    sampled = sampling_params(TINY_VOCAB, greedy=False, seeded=False, max_tokens=st.just(1))
    specs.insert(data.draw(st.integers(0, len(specs)), label="sampled row"),
                 data.draw(requests(TINY_VOCAB, 32, params=sampled), label="sampled request"))
    seeded = sampling_params(TINY_VOCAB, greedy=False, seeded=True, max_tokens=st.just(1))
    extra = data.draw(st.none() | requests(TINY_VOCAB, 32, params=seeded), label="seeded request")
    specs += [extra] if extra is not None else []
    sample_model_batch(engines.get(tiny_models[arch]), specs, N_MODEL, data.draw(seeds, label="sampler_seed"))
