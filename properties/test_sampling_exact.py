"""Property: the target sampler's filtered distribution is oracle.sampler's, row by row, exactly (no draws).

For a drawn batch, the target sampler's row_distributions(logits, args), what sample() draws each row from (a
one-hot argmax on greedy rows; Sampler.filtered_probs on the torch path; FlashInfer's renorm kernels on the
flashinfer path), must pass oracle.checks.check_filtered_distribution against oracle.reference_distribution on
every row: the support exactly, outside the tokens another device's rounding could flip (and, where FlashInfer
decides, the probability ties it cannot split), and probabilities within a stated float32 bound. A support bug
therefore fails on one example whatever mass it moves, where a chi-square test on draws needs that mass to be seen.

Batches mix, row by row: greedy rows; tie-free, tie-heavy (repeated levels, bf16-rounded values, -inf entries) and
wide (std 10..30, tails far below float32's resolution of 1 - mass) rows; top_k = 1 over tied maxima; tiny and huge
temperatures; every combination of top-k, top-p and min-p (oracle.sampling_strategies.filter_params); filter-order
cases for every pair of filters whose order changes the support (class 1, oracle.sampling_strategies.ORDER_PAIRS:
temperature/top-p, temperature/min-p, top-k/top-p, top-p/min-p; temperature/top-k and top-k/min-p commute); and, in
every batch, a row with such a tail and without top-p next to a row with top-p (class 3: a batch-mate's top-p must
not truncate that tail), and one more filter-order case.

Deterministic comparisons, so no α; examples(2.0) batches (50 under `ci`), CPU math only on the torch target.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Batch, Req, SamplingParams
from oracle.budget import examples
from oracle.checks import FLOAT32_FLOOR, check_filtered_distribution
from oracle.coverage import exercised, floors
from oracle.sampler import reference_distribution
from oracle.sampling_strategies import filter_order_cases, filter_params, tie_heavy_rows
from oracle.strategies import logits_rows, seeds
from oracle.target import Target

MAX_ROWS = 6
TAIL_RESOLUTION = 6e-8  # a token this light sits where a float32 "mass above" has already rounded to 1


@st.composite
def wide_rows(draw: st.DrawFn, vocab_size: int) -> torch.Tensor:
    """A Gaussian row with std 10..30: most of its tokens carry far less than TAIL_RESOLUTION."""
    gen = torch.Generator().manual_seed(draw(seeds))
    return torch.randn(vocab_size, generator=gen) * draw(st.sampled_from((10.0, 20.0, 30.0)))


@st.composite
def tail_rows(draw: st.DrawFn, vocab_size: int) -> torch.Tensor:
    """Logits 0 down to -80 in even steps (jittered, shuffled): at temperatures 0.7..1.5 some token always lies
    between float32's smallest normal and TAIL_RESOLUTION."""
    gen = torch.Generator().manual_seed(draw(seeds))
    ramp = -torch.linspace(0.0, 80.0, vocab_size) + torch.randn(vocab_size, generator=gen) * 0.5
    return ramp[torch.randperm(vocab_size, generator=gen)]


@st.composite
def rows(draw: st.DrawFn, vocab_size: int) -> tuple[torch.Tensor, SamplingParams, bool]:
    """(row, params, is a filter-order case)."""
    kind = draw(st.sampled_from(("tie-free", "tie-heavy", "tie-heavy", "wide", "filter order", "filter order")))
    if kind == "filter order":
        return (*draw(filter_order_cases(vocab_size)), True)
    row = draw({"tie-free": logits_rows, "tie-heavy": tie_heavy_rows, "wide": wide_rows}[kind](vocab_size))
    return row, draw(filter_params(vocab_size, greedy_allowed=True)), False


@st.composite
def batches(draw: st.DrawFn) -> tuple[torch.Tensor, list[SamplingParams], list[bool]]:
    vocab = draw(st.integers(4, 24), label="vocab")
    drawn = draw(st.lists(rows(vocab), min_size=1, max_size=MAX_ROWS), label="rows")
    tail = SamplingParams(temperature=draw(st.sampled_from((0.7, 1.0, 1.5))), max_tokens=1, ignore_eos=True)
    nucleus = SamplingParams(temperature=1.0, top_p=draw(st.sampled_from((0.5, 0.9))), max_tokens=1)
    drawn += [(draw(tail_rows(vocab)), tail, False), (draw(logits_rows(vocab)), nucleus, False)]
    drawn.append((*draw(filter_order_cases(vocab)), True))  # every batch holds one (class 1)
    order = draw(st.permutations(range(len(drawn))), label="order")
    return (
        torch.stack([drawn[i][0] for i in order]),
        [drawn[i][1] for i in order],
        [drawn[i][2] for i in order],
    )


def _class3_exposed(row: torch.Tensor, params: SamplingParams, others: list[SamplingParams]) -> bool:
    """A sampled row without top-p whose tail float32 can hold but a float32 mass above cannot, beside top-p."""
    if params.temperature == 0.0 or params.top_p < 1.0 or all(p.top_p == 1.0 for p in others):
        return False
    probs = reference_distribution(row, params).probs
    return bool(((probs > FLOAT32_FLOOR) & (probs < TAIL_RESOLUTION)).any())


CLASS_3 = "batch with a light-tailed row without top-p next to a top-p row (class 3)"
CLASS_1 = "batch with a filter-order case (class 1)"
TIES = "batch with a sampled row with tied float32 probabilities at a cut"


@settings(max_examples=examples(2.0), deadline=None)
@given(batch=batches(), sampler_seed=seeds)
@floors({CLASS_3: 0.8, CLASS_1: 0.9, TIES: 0.25})
def test_filtered_distribution_is_the_reference(
    batch: tuple[torch.Tensor, list[SamplingParams], list[bool]], sampler_seed: int, target: Target
) -> None:
    logits, params, order_cases = batch
    sampler = target.make_sampler(logits.shape[1], sampler_seed)
    reqs = [Req(torch.zeros(1, dtype=torch.int32), i, 0, 1, i, p) for i, p in enumerate(params)]
    args = sampler.prepare(Batch(reqs, "decode"))
    on_probs = sampler.draws_with_flashinfer(args)
    distributions = sampler.row_distributions(logits.to(sampler.device), args).cpu()
    refs = [reference_distribution(logits[r], p) for r, p in enumerate(params)]
    exercised(CLASS_3, any(_class3_exposed(logits[r], p, params) for r, p in enumerate(params)))
    exercised(CLASS_1, any(order_cases))
    ties = any(bool(ref.prob_ties.any()) for ref, p in zip(refs, params) if p.temperature > 0)
    exercised(TIES, ties)
    for r, (p, ref) in enumerate(zip(params, refs)):
        failure = check_filtered_distribution(distributions[r], ref, on_probs)
        assert failure is None, f"row {r} of {len(params)} ({p}, logits {logits[r].tolist()}): {failure}"
