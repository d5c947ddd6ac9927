"""Evidence: what FlashInfer's renorm kernels do with the ties HF's rules split, and why the harness leaves exactly
those out on the flashinfer sampler (oracle.sampler's prob_ties, ReferenceDistribution.unclear).

HF decides top-k on scores (every token tied with the k-th score stays) and top-p on a stable ascending sort by
score (of exact ties the cut splits, the highest indices stay; of equal float32 probabilities with distinct scores,
the higher scores). FlashInfer's top_k_renorm_probs and top_p_renorm_probs see probabilities only, and top-p masks
"the probabilities less than a threshold" (its docstring): equal probabilities share one fate, so where HF splits a
tie group FlashInfer cannot follow. Each case prints what both keep (run with -s) and asserts that

* outside the probability ties FlashInfer's filtered vector (Sampler.row_distributions) is the reference
  distribution (oracle.checks.check_filtered_distribution with decides_on_probs=True), the claim the harness's
  flashinfer checks rest on;
* for a top-p cut inside a tie group, the group's members all get the same probability (the threshold rule).

Deterministic, no draws, no α. Skipped without CUDA and flashinfer.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_support import needs_flashinfer

from engine import Batch, Req, SamplingParams
from engine.sample import Sampler
from oracle.checks import check_filtered_distribution
from oracle.sampler import reference_distribution

pytestmark = needs_flashinfer

_OUT = -30.0  # padding tokens, far below every cut
CASES = [
    ("top_k=1 over three tied maxima", [1.0, 3.0, 3.0, 0.0, 3.0, -1.0, _OUT, _OUT], SamplingParams(1.0, top_k=1)),
    ("top_k=2 with three tokens tied at the k-th", [3.0, 2.0, 2.0, 2.0, 1.0, 0.0, _OUT, _OUT], SamplingParams(1.0, 2)),
    (
        "top-p cut inside a tie group (HF keeps tokens 0, 2, 3)",
        [math.log(0.4), *[math.log(0.2)] * 3, _OUT, _OUT, _OUT, _OUT],
        SamplingParams(1.0, top_p=0.7),
    ),
    (
        "T=1e30: equal float32 probabilities, distinct scores (HF keeps the top 6 scores)",
        [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0],
        SamplingParams(1e30, top_p=0.7),
    ),
]


@pytest.mark.parametrize(("name", "row", "params"), CASES, ids=[c[0] for c in CASES])
def test_flashinfer_renorm_kernels_on_ties(name: str, row: list[float], params: SamplingParams) -> None:
    logits = torch.tensor(row)
    sampler = Sampler(torch.device("cuda"), len(row), seed=0, use_flashinfer=True)
    args = sampler.prepare(Batch([Req(torch.zeros(2, dtype=torch.int32), 0, 1, 1, 0, params)], "decode"))
    probs = sampler.row_distributions(logits.cuda()[None], args)[0].cpu()
    ref = reference_distribution(logits, params)
    print(
        f"\n{name}: HF keeps {ref.support.nonzero().flatten().tolist()}, FlashInfer keeps "
        f"{(probs > 0).nonzero().flatten().tolist()} ({probs.tolist()}); probability ties "
        f"{ref.prob_ties.nonzero().flatten().tolist()}"
    )
    assert ref.prob_ties.any(), f"{name}: the case holds no probability tie at a cut"
    failure = check_filtered_distribution(probs, ref, decides_on_probs=True)
    assert failure is None, f"{name}: FlashInfer differs from HF outside the probability ties: {failure}"
    if params.top_k == -1:
        tied = probs[ref.prob_ties]
        assert bool((tied == tied[0]).all()), f"{name}: top-p gave tied probabilities different fates: {tied}"
