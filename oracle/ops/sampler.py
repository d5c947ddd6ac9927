"""Op-level checks of the target's sampler: the filtered distribution each row draws from, against
oracle.sampler's reference (HF's decisions), over vocabularies each side of the kernels' block edges; and the
seeded draws, which must depend on nothing but a request's (seed, position): not on its batch-mates or its row,
and not only on the seed's low 32 bits (torch's CPU generator keeps 32 bits of a seed).

The distribution check is exact (support) and bounded (probabilities: oracle.checks.filtered_rtol). The seed check
draws over a flat row of SEED_VOCAB tokens at SEED_POSITIONS positions: two independent streams give the same
tokens there with probability SEED_VOCAB ** -SEED_POSITIONS (~1e-14, the α of each example), one stream always.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from engine import Batch, Req, SamplingParams
from engine.sample import BaseSampler, BatchSamplingArgs

from ..checks import check_filtered_distribution
from ..sampler import reference_distribution
from ..sampling_strategies import filter_params, tie_heavy_rows
from ..strategies import logits_rows, request_seeds, seeds
from .bench import Bench
from .ledger import label
from .strategies import BLOCK_EDGES, edge_sizes

SEED_VOCAB = 32768
SEED_POSITIONS = 3


def _args(sampler: BaseSampler, params: list[SamplingParams], positions: list[int]) -> BatchSamplingArgs:
    reqs = [Req([0] * pos, i, pos - 1, 1, i, p) for i, (p, pos) in enumerate(zip(params, positions))]
    return sampler.prepare(Batch(reqs, "decode"))


def _declared(bench: Bench, sampler: BaseSampler, args: BatchSamplingArgs) -> tuple[str, str | None]:
    name = str(bench.target.resolved("sampler"))
    if sampler.use_flashinfer and not sampler.draws_with_flashinfer(args):
        return label("sampler", name), "batches with a seeded row draw on the torch path"
    return label("sampler", name), None


@dataclass(frozen=True)
class ProbsCase:
    logits: torch.Tensor  # float32 [rows, vocab], rounded to the target's dtype by the check
    params: tuple[SamplingParams, ...]
    sampler_seed: int


@st.composite
def probs_cases(draw: st.DrawFn) -> ProbsCase:
    vocab = draw(edge_sizes(BLOCK_EDGES, 3, 40000))
    n = draw(st.integers(1, 4))
    rows = [draw(draw(st.sampled_from((logits_rows, tie_heavy_rows)))(vocab)) for _ in range(n)]
    params = tuple(draw(filter_params(vocab, greedy_allowed=i > 0)) for i in range(n))  # row 0 samples
    return ProbsCase(torch.stack(rows), params, draw(seeds))


def check_sampler_probs(bench: Bench, case: ProbsCase) -> None:
    """As an engine's sampler sees them: logits of the target's dtype, upcast, and that dtype declared."""
    vocab = case.logits.shape[1]
    sampler = bench.target.make_sampler(vocab, case.sampler_seed)
    sampler.declare_logits_dtype(bench.dtype)
    logits = case.logits.to(bench.dtype).float()
    args = _args(sampler, list(case.params), [1] * len(case.params))
    expected, declared = _declared(bench, sampler, args)
    got = bench.traced("sampler probs", expected, declared,
                       lambda: sampler.row_distributions(logits.to(sampler.device), args))
    for r, p in enumerate(case.params):
        if p.temperature == 0.0:
            continue
        why = check_filtered_distribution(got[r], reference_distribution(logits[r], p),
                                          decides_on_probs=declared is None and sampler.use_flashinfer)
        if why is not None:
            raise AssertionError(f"op sampler probs at logits[{len(case.params)}, {vocab}] of {bench.dtype} values, "
                                 f"row {r}, {p}: {why}")


@dataclass(frozen=True)
class SeedCase:
    seed: int
    other: int  # a seed equal to `seed` modulo 2**32, or any other seed
    position: int
    mates: int  # batch-mates before the seeded row
    sampler_seed: int


@st.composite
def seed_cases(draw: st.DrawFn) -> SeedCase:
    seed = draw(request_seeds)
    twin = (seed + draw(st.integers(1, 2**31 - 1)) * 2**32) % 2**63
    other = draw(st.sampled_from((twin, twin, twin, (seed + 1) % 2**63)))
    return SeedCase(seed, other, draw(st.integers(1, 5000)), draw(st.integers(0, 3)), draw(seeds))


def check_seeded_draws(bench: Bench, case: SeedCase) -> None:
    """A seeded row draws the same tokens alone and behind batch-mates (bitwise), and another seed, even one equal
    modulo 2**32, draws other tokens."""
    sampler = bench.target.make_sampler(SEED_VOCAB, case.sampler_seed)
    flat = torch.zeros(1, SEED_VOCAB, device=sampler.device)

    def draws(seed: int, mates: int) -> list[int]:
        out = []
        params = [SamplingParams(temperature=1.0, seed=s) for s in [None] * mates + [seed]]
        for step in range(SEED_POSITIONS):
            args = _args(sampler, params, [case.position + step] * len(params))
            expected, declared = _declared(bench, sampler, args)

            def draw(a: BatchSamplingArgs = args) -> torch.Tensor:
                return sampler.sample(flat.expand(len(params), -1), a)

            out.append(int(bench.traced("sampler seeded draw", expected, declared, draw)[-1]))
        return out

    alone, behind, other = draws(case.seed, 0), draws(case.seed, case.mates), draws(case.other, 0)
    call = f"seed {case.seed}, position {case.position}.., vocab {SEED_VOCAB}"
    if alone != behind:
        raise AssertionError(f"op sampler seeded draw at {call}: alone it drew {alone}, behind {case.mates} "
                             f"batch-mates {behind}: a seeded row must not depend on its batch")
    if alone == other:
        raise AssertionError(f"op sampler seeded draw at {call}: seed {case.other} (difference {case.other - case.seed}"
                             f", a multiple of 2**32: {(case.other - case.seed) % 2**32 == 0}) drew the same tokens "
                             f"{alone}: the seeds share one random stream")
