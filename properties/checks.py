"""Assertion logic shared by the properties and the verify report: logit tolerances, greedy comparison, and
sampled token counts against the reference sampler.

Logit tolerance, per engine dtype, against a float64 reference: ``max |engine - ref| <= rel * max(1, max |ref|)``.
The bound scales with the row's largest logit because rounding error does (a matmul's error is relative to the
magnitude of what it sums). Measured on the tiny models and SmolLM2-135M with prompts up to 64 tokens:

* float32: worst error / scale about 1.5e-6 (SmolLM2, 30 layers), 6e-7 (tiny). rel = 5e-5 leaves a margin of 30x
  or more; fp32 eps is 1.2e-7, so this is ~400 ulps of the logit scale, and any real bug (a position off by one,
  a wrong mask, a stale KV slot) moves logits by O(0.1..1).
* bfloat16: worst error / scale about 0.014 (tiny), 0.033 (SmolLM2). bf16 keeps 8 significant bits (eps 3.9e-3)
  and its error compounds over layers; rel = 0.06 is still far below what a real bug does to a random-init model.

Greedy comparison follows vLLM's ``check_outputs_equal`` / ``check_logprobs_close`` idea: two greedy runs must
produce identical tokens, except at a genuine near-tie. At the first mismatch the reference's top-2 logits must
lie within the numerical tolerance (twice the logit bound: each of the two logits may be off by one bound), each
side's token must be in the other side's top-2, and the comparison stops there, because the sequences (and so
their prefixes) differ from then on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine import SamplingParams
from oracle.sampler import reference_distribution
from oracle.stats import chi_square_gof, support_check


@dataclass(frozen=True)
class LogitTolerance:
    """``max |actual - reference| <= rel * max(1, max |reference|)``."""

    rel: float

    def bound(self, reference: torch.Tensor) -> float:
        return self.rel * max(1.0, float(reference.abs().max()))

    def tie_gap(self, reference_row: torch.Tensor) -> float:
        """Top-2 logits closer than this may swap places between engine and reference."""
        return 2.0 * self.bound(reference_row)


LOGIT_TOLERANCES: dict[torch.dtype, LogitTolerance] = {
    torch.float32: LogitTolerance(5e-5),
    torch.bfloat16: LogitTolerance(0.06),
}


def logit_tolerance(dtype: torch.dtype) -> LogitTolerance:
    if dtype not in LOGIT_TOLERANCES:
        raise ValueError(f"no logit tolerance for engine dtype {dtype}; known: {sorted(map(str, LOGIT_TOLERANCES))}")
    return LOGIT_TOLERANCES[dtype]


def logits_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference, computed in float64."""
    if actual.shape != reference.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(reference.shape)}")
    return float((actual.double() - reference.double()).abs().max())


def assert_logits_close(
    actual: torch.Tensor, reference: torch.Tensor, tol: LogitTolerance, what: str, slack: float = 0.0
) -> float:
    """Raise AssertionError naming `what` unless actual is within tol (plus `slack`) of reference; returns the error.

    slack: extra absolute error allowed, e.g. the error HF itself makes at the engine's dtype (see
    test_prefill_logits: a bf16 MoE router can pick other experts than the float64 one, in HF as in the engine).
    """
    err = logits_error(actual, reference)
    bound = tol.bound(reference) + slack
    if not err <= bound:
        diff = (actual.double() - reference.double()).abs().flatten()
        worst = int(diff.argmax())
        raise AssertionError(
            f"{what}: max |logit error| {err:.3g} exceeds the bound {bound:.3g} (rel {tol.rel:g}, slack {slack:.3g}); "
            f"worst at flat "
            f"index {worst}: engine {float(actual.flatten()[worst]):.6g} vs reference "
            f"{float(reference.flatten()[worst]):.6g}"
        )
    return err


def in_top2(row: torch.Tensor, token: int) -> bool:
    """Whether `token`'s logit is at least the second-largest value of `row` (exact ties all count)."""
    second = torch.topk(row.double(), min(2, row.numel())).values[-1]
    return bool(row[token].double() >= second)


def top2_gap(row: torch.Tensor) -> float:
    values = torch.topk(row.double(), 2).values
    return float(values[0] - values[1])


@dataclass(frozen=True)
class GreedyComparison:
    """compared: positions looked at; mismatch_at: the first differing position (None if none); failure: why the
    sequences disagree under the rule (None if they agree)."""

    compared: int
    mismatch_at: int | None
    failure: str | None

    @property
    def ok(self) -> bool:
        return self.failure is None


def compare_greedy(
    ours: Sequence[int],
    ours_logits: Sequence[torch.Tensor],
    ref: Sequence[int],
    ref_logits: Sequence[torch.Tensor],
    tol: LogitTolerance,
) -> GreedyComparison:
    """Compare two greedy continuations of one prompt under the near-tie rule (module doc).

    ours_logits[i] / ref_logits[i] are the rows each side chose token i from.
    """
    if len(ours) != len(ref):
        return GreedyComparison(0, None, f"lengths differ: {len(ours)} vs {len(ref)} tokens")
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a == b:
            continue
        gap, limit = top2_gap(ref_logits[i]), tol.tie_gap(ref_logits[i])
        if gap <= limit and in_top2(ref_logits[i], a) and in_top2(ours_logits[i], b):
            return GreedyComparison(i + 1, i, None)
        return GreedyComparison(
            i + 1,
            i,
            f"token {i}: engine {a} vs reference {b}; reference top-2 gap {gap:.3g} (near-tie below {limit:.3g}), "
            f"engine token in reference top-2: {in_top2(ref_logits[i], a)}, reference token in engine top-2: "
            f"{in_top2(ours_logits[i], b)}\n  engine:    {list(ours)}\n  reference: {list(ref)}",
        )
    return GreedyComparison(len(ours), None, None)


def check_forced_greedy(
    tokens: Sequence[int], ours_logits: Sequence[torch.Tensor], ref_logits: torch.Tensor, tol: LogitTolerance
) -> str | None:
    """Greedy tokens against a reference teacher-forced on the same sequence; None if they agree.

    ref_logits[i] is the reference's row for the prefix that produced tokens[i], so the prefixes never diverge
    and every position is checked: each token must be the argmax of the engine's own row and of the reference
    row, or, at a reference near-tie, a top-2 token of both.
    """
    for i, token in enumerate(tokens):
        own = ours_logits[i]
        if own[token] != own.max():
            return f"token {i}: the engine picked {token}, not the argmax {int(own.argmax())} of its own logits"
        best = int(ref_logits[i].argmax())
        if ref_logits[i][token] == ref_logits[i][best]:
            continue
        gap, limit = top2_gap(ref_logits[i]), tol.tie_gap(ref_logits[i])
        if not (gap <= limit and in_top2(ref_logits[i], token) and in_top2(own, best)):
            return (
                f"token {i}: engine {token} vs reference argmax {best}; reference top-2 gap {gap:.3g} (near-tie "
                f"below {limit:.3g}); tokens {list(tokens)}"
            )
    return None


def check_sample_counts(
    counts: torch.Tensor, logits_row: torch.Tensor, params: SamplingParams, alpha: float
) -> list[str]:
    """Failures of tokens drawn (as per-token counts) from one logits row with params; [] if none.

    Greedy rows (temperature 0 or top_k 1) must always take a maximal logit. Sampled rows must pass the support
    check and the chi-square goodness-of-fit test against oracle.sampler's exact HF-order distribution, each at
    level alpha; tokens whose keep/drop decision is ambiguous in fp32 are excluded from both.
    """
    n = int(counts.sum())
    if params.is_greedy:
        drawn = counts.nonzero().flatten()
        off = [int(t) for t in drawn if logits_row[t] != logits_row.max()]
        return [f"greedy row drew non-argmax tokens {off} (argmax {int(logits_row.argmax())})"] if off else []
    ref = reference_distribution(logits_row, params)
    failures = []
    support = support_check(counts, ref.probs, n, alpha, ref.ambiguous)
    if not support.passed:
        failures.append(support.message())
    chi = chi_square_gof(counts, ref.probs, alpha, exclude=ref.ambiguous)
    if not chi.passed:
        failures.append(chi.message())
    return failures
