"""GPU property: FlashInfer's sampler draws from the distribution HF's logits processors define.

For a drawn logits row (tie-free or tie-heavy) and drawn sampling parameters (temperature, top-k, top-p, min-p,
edge values included), 32,768 draws from one batch of identical rows are tested against oracle.sampler's exact
distribution: a chi-square goodness-of-fit test and a support check, ambiguous tokens excluded. Two checks per
example under a family-wise budget of 5e-4 (the GPU run's other 5e-4 goes to tests/gpu/test_gpu_sampler.py), split
evenly: at the `ci` profile's 8 examples alpha = 3.1e-5 per check, and a chi-square test detects an effect size
w = 0.1 with power > 0.999 up to 255 bins (w = 0.05 with power > 0.99 up to 20 bins).
Runs only with CUDA and flashinfer (pytest -m gpu); skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Batch, Req
from engine.attention.flashinfer_backend import flashinfer_installed
from engine.sample import Sampler
from oracle.budget import examples
from oracle.sampler import reference_distribution
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


@settings(max_examples=EXAMPLES)
@given(
    row=st.booleans().flatmap(lambda ties: logits_rows(VOCAB, ties=ties)),
    params=sampling_params(VOCAB, greedy=False, seeded=False),
    seed=seeds,
)
def test_flashinfer_draws_follow_the_reference_distribution(row: torch.Tensor, params, seed: int) -> None:
    sampler = Sampler(torch.device("cuda"), VOCAB, seed=seed, use_flashinfer=True)
    reqs = [Req(torch.zeros(2, dtype=torch.int32), i, 1, 1, i, params) for i in range(ROWS)]
    args = sampler.prepare(Batch(reqs, "decode"))
    logits = row.cuda().expand(ROWS, -1).contiguous()
    counts = torch.zeros(VOCAB, dtype=torch.int64)
    for _ in range(CALLS):
        counts += torch.bincount(sampler.sample(logits, args).long().cpu(), minlength=VOCAB)
    ref = reference_distribution(row, params)
    chi = chi_square_gof(counts, ref.probs, ALPHA, exclude=ref.ambiguous)
    assert chi.passed, f"{params}: {chi.message()}"
    support = support_check(counts, ref.probs, ROWS * CALLS, ALPHA, ambiguous=ref.ambiguous)
    assert support.passed, f"{params}: {support.message()}"
