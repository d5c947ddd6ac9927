"""GPU property: FlashInfer's sampler draws from the distribution HF's logits processors define.

For a drawn logits row (tie-free or tie-heavy) and drawn sampling parameters (temperature, top-k, top-p, min-p,
edge values included), 32,768 draws from one batch of identical rows are tested against oracle.sampler's exact
distribution: a chi-square goodness-of-fit test and a support check, ambiguous tokens excluded. Two checks per
example under a family-wise budget of 5e-4 (the GPU run's other 5e-4 goes to tests/gpu/test_gpu_sampler.py), split
evenly: at the `ci` profile's 8 examples alpha = 3.1e-5 per check, and a chi-square test detects an effect size
w = 0.1 with power > 0.999 up to 255 bins (w = 0.05 with power > 0.99 up to 20 bins).
FlashInfer decides on float32 probabilities, so besides the ambiguous tokens the probability ties it cannot split
as HF does are excluded too (ReferenceDistribution.unclear(decides_on_probs=True)).

Filter order (class 6): a second test draws only rows and top-k/top-p settings where FlashInfer's "joint" order
(top-k and top-p on the original distribution; oracle mode="joint") keeps a token that HF's order, top-k first,
drops (oracle.sampling_strategies.filter_order_cases for the pair top-k/top-p, whose other order is joint). It fails
on a single draw of such a token, a check with no false failures (a correct sampler never draws outside the support),
so it spends none of the α budget. Power: the joint-only tokens carry at least MIN_CASE_MASS = 1e-3 of joint's
distribution, so a joint-order sampler escapes 32,768 draws with probability <= (1 - 1e-3)^32768 < 1e-14.
Runs only with CUDA and flashinfer (pytest -m gpu); skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine import Batch, Req, SamplingParams
from engine.device import flashinfer_installed
from engine.sample import Sampler
from oracle.budget import examples
from oracle.sampler import reference_distribution
from oracle.sampling_strategies import MIN_CASE_MASS, filter_order_cases
from oracle.stats import AlphaBudget, chi_square_gof, support_check
from oracle.strategies import logits_rows, sampling_params, seeds

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and flashinfer_installed()), reason="needs a CUDA GPU and flashinfer"
    ),
]

VOCAB = 256
ROWS, CALLS = 16384, 2
EXAMPLES = examples(0.3)
ALPHA = AlphaBudget(tests=2 * EXAMPLES, total=5e-4).per_test


def draw_counts(row: torch.Tensor, params: SamplingParams, seed: int) -> torch.Tensor:
    """Per-token counts of ROWS * CALLS FlashInfer draws from one batch of identical rows."""
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=seed, use_flashinfer=True)
    reqs = [Req(torch.zeros(2, dtype=torch.int32), i, 1, 1, i, params) for i in range(ROWS)]
    args = sampler.prepare(Batch(reqs, "decode"))
    logits = row.cuda().expand(ROWS, -1).contiguous()
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    for _ in range(CALLS):
        counts += torch.bincount(sampler.sample(logits, args).long().cpu(), minlength=VOCAB)
    return counts


@pytest.mark.statistical
@settings(max_examples=EXAMPLES)
@given(
    row=st.booleans().flatmap(lambda ties: logits_rows(VOCAB, ties=ties)),
    params=sampling_params(VOCAB, greedy=False, seeded=False),
    seed=seeds,
)
def test_flashinfer_draws_follow_the_reference_distribution(row: torch.Tensor, params, seed: int) -> None:
    counts = draw_counts(row, params, seed)
    ref = reference_distribution(row, params)
    unclear = ref.unclear(decides_on_probs=True)
    chi = chi_square_gof(counts, ref.probs, ALPHA, exclude=unclear)
    assert chi.passed, f"{params}: {chi.message()}"
    support = support_check(counts, ref.probs, ROWS * CALLS, ALPHA, ambiguous=unclear)
    assert support.passed, f"{params}: {support.message()}"


@settings(max_examples=EXAMPLES)
@given(case=filter_order_cases(VOCAB, ("top_k", "top_p")), seed=seeds)
def test_flashinfer_follows_top_k_first_where_joint_differs(
    case: tuple[torch.Tensor, SamplingParams], seed: int
) -> None:
    row, params = case
    ref = reference_distribution(row, params)
    joint = reference_distribution(row, params, mode="joint")
    joint_only = joint.support & ~ref.support & ~ref.unclear(decides_on_probs=True)
    assume(float(joint.probs[joint_only].sum()) >= MIN_CASE_MASS)
    counts = draw_counts(row, params, seed)
    outside = counts * (~ref.support & ~ref.unclear(decides_on_probs=True))
    assert not outside.any(), (
        f"{params}: drew tokens outside HF's support {outside.nonzero().flatten().tolist()} (counts "
        f"{outside[outside > 0].tolist()}); joint order keeps {joint_only.nonzero().flatten().tolist()}"
    )
