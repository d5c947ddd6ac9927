"""Property: top-k then top-p sorted by the 16-bit logits (engine.sample_rows.SortKeys, what the CUDA sampler sorts
where the model's logits are bf16 or fp16 values) filters every row bitwise as the float32 scores' own stable sort.

The two orders agree while the temperature maps distinct 16-bit values to distinct float32 quotients: below
KEYS_EXACT_BELOW (docs/sampling.md, keys). Rows are Gaussians rounded to the dtype at scales from its subnormals to
tens, or ladders of adjacent values of the dtype, dense with ties, a drawn share of them -inf; temperatures run from
0.05 up to just under the bound; vocabularies straddle the row passes' 4096-token chunks. Each example files whether
a row's cut fell inside a run of tied scores, and whether one fell among distinct logits whose scores round to one
16-bit value (what a sort of the rounded scores would get wrong: the mutant `top_p_keys_from_rounded_scores`).

Deterministic comparisons on the target's row passes, so no α; examples(1.0) examples (25 under `ci`).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sample_rows import KEYS_EXACT_BELOW, SortKeys, row_passes_for, top_k_top_p_filter
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops.strategies import BLOCK_EDGES, edge_sizes
from oracle.sampling_strategies import MASKED_SHARES, with_dead_tokens
from oracle.strategies import seeds
from oracle.target import Target

SCALES = (2.0**-140, 1e-3, 0.3, 1.0, 3.0, 30.0)  # 2**-140: bf16 subnormals (fp16 rounds them to signed zeros)
TEMPERATURES = st.sampled_from((0.05, 0.8, 1.0, 1.3, 3.0, 1000.0, KEYS_EXACT_BELOW - 1.0)) | st.floats(0.05, 100.0)
TIED_CUT = "a batch where a row's top-p cut splits a run of tied scores"
ROUNDED_CUT = "a batch where a row's cut falls among distinct logits whose scores round to one 16-bit value"


@st.composite
def keyed_rows(draw: st.DrawFn, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """A Gaussian rounded to dtype, or a ladder: each token one of 2..16 adjacent values of dtype from a Gaussian
    start (where dividing by T rounds neighbours together most often)."""
    gen = torch.Generator().manual_seed(draw(seeds))
    row = (torch.randn(vocab, generator=gen) * draw(st.sampled_from(SCALES))).to(dtype)
    if draw(st.booleans()):
        rungs = torch.randint(draw(st.integers(2, 16)), (vocab,), generator=gen, dtype=torch.int16)
        start = row[:1].abs().view(torch.int16)
        row = (start + rungs).view(dtype) * (1.0 if draw(st.booleans()) else -1.0)
    return with_dead_tokens(row, draw(st.sampled_from(MASKED_SHARES)), gen)


def _cut_events(logits: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor) -> tuple[bool, bool]:
    """(the cut splits tied scores, the cut splits a group of distinct logits whose scores round alike) for one row."""
    finite_kept = kept & scores.isfinite()
    if not finite_kept.any() or kept.all():
        return False, False
    edge = scores[finite_kept].min()
    tied = scores == edge
    rounded = scores.to(logits.dtype)
    group = rounded == edge.to(logits.dtype)
    distinct = logits[group].unique().numel() > 1
    return bool((tied & ~kept).any()), bool(distinct and (group & ~kept).any() and (group & kept).any())


@settings(max_examples=examples(1.0), deadline=None)
@given(data=st.data())
@floors({TIED_CUT: 0.2, ROUNDED_CUT: 0.15})
def test_top_p_sorted_by_16_bit_logits_is_top_p_sorted_by_scores(data: st.DataObject, target: Target) -> None:
    dtype = data.draw(st.sampled_from((torch.bfloat16, torch.float16)), label="dtype")
    vocab = data.draw(edge_sizes(BLOCK_EDGES, 2, 5000), label="vocab")
    n = data.draw(st.integers(1, 4), label="rows")
    logits = torch.stack([data.draw(keyed_rows(vocab, dtype), label=f"logits[{r}]") for r in range(n)])
    temperature = torch.tensor([data.draw(TEMPERATURES, label=f"temperature[{r}]") for r in range(n)])
    top_p = torch.tensor([data.draw(st.floats(0.05, 0.99), label=f"top_p[{r}]") for r in range(n)], dtype=torch.float64)
    ks = [data.draw(st.just(vocab) | st.integers(1, vocab), label=f"top_k[{r}]") for r in range(n)]
    dev = target.torch_device
    logits, temperature, top_p = logits.to(dev), temperature.to(dev), top_p.to(dev)
    top_k = None if all(k == vocab for k in ks) else torch.tensor(ks, device=dev)
    scores = logits.float() / temperature.unsqueeze(1)
    passes = row_passes_for(dev)
    want = top_k_top_p_filter(scores, top_k, top_p, passes)
    got = top_k_top_p_filter(scores, top_k, top_p, passes, SortKeys(logits, temperature))
    events = [_cut_events(logits[r].cpu(), scores[r].cpu(), want[r].cpu() > float("-inf")) for r in range(n)]
    exercised(TIED_CUT, any(tied for tied, _ in events))
    exercised(ROUNDED_CUT, any(rounded for _, rounded in events))
    differ = (got != want).nonzero().tolist()
    assert not differ, (
        f"sorting the {dtype} logits kept other tokens than sorting the float32 scores: (row, token) {differ[:8]}, "
        f"temperature {temperature.tolist()}, top_p {top_p.tolist()}, top_k {ks}, vocab {vocab}"
    )
