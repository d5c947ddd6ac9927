"""Assertions shared by the properties, the tests and the verify report: logits within the target's tolerance,
greedy runs compared under the near-tie rule, sampled token counts against the reference sampler, and a sampler's
filtered probability vector against the reference distribution itself.

Greedy comparison follows vLLM's ``check_outputs_equal`` / ``check_logprobs_close`` idea: two greedy runs must
produce identical tokens, except at a genuine near-tie (:meth:`oracle.tolerance.LogitTolerance.near_tie`, seen from
both sides), where the comparison stops, because the sequences (and so their prefixes) differ from then on.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from engine import SamplingParams
from oracle.sampler import ReferenceDistribution, reference_distribution
from oracle.stats import MIN_EXPECTED, chi_square_gof, support_check
from oracle.tolerance import YARDSTICK_RATIO, LogitTolerance, logits_error

if TYPE_CHECKING:
    from engine.driver import Generation
    from oracle.hf import HFOracle

NUMERICS_LAW = (
    "law broken: the engine's numerics against HF, seen by a property about something else; the properties for "
    "that law, cheapest first: `pytest properties -m kernel`, properties/test_prefill_logits.py, "
    "properties/test_greedy_parity.py"
)
"""Appended where a property's side check of HF parity fails, so a numerics change points at its own property."""


@dataclass(frozen=True)
class LogitError:
    """The largest |actual - reference| and where it is: index into the tensors, and both sides' values there."""

    value: float
    index: tuple[int, ...]
    actual: float
    reference: float


def worst_logit_error(actual: torch.Tensor, reference: torch.Tensor) -> LogitError:
    """max |actual - reference| in float64 (oracle.tolerance.logits_error) and its position."""
    value = logits_error(actual, reference)
    diff = (actual.double() - reference.double()).abs()
    index = tuple(int(i) for i in torch.unravel_index(diff.flatten().nan_to_num(math.inf).argmax(), diff.shape))
    return LogitError(value, index, float(actual[index]), float(reference[index]))


def assert_logits_close(
    actual: torch.Tensor,
    reference: torch.Tensor,
    tol: LogitTolerance,
    what: str,
    own_error: float | None = None,
) -> float:
    """Raise AssertionError naming `what` unless actual is within the bound of reference; returns the error.

    own_error: HF's own error against `reference` at the engine's dtype on the same input, the yardstick that
    widens the bound where it is larger (LogitTolerance.yardstick_bound; a bf16 MoE router can pick other experts
    than the float64 one, in HF as in the engine).
    """
    worst = worst_logit_error(actual, reference)
    bound = tol.yardstick_bound(reference, own_error)
    if not worst.value <= bound:
        dtype = str(tol.dtype).removeprefix("torch.")
        own = "" if own_error is None else f"; HF's own {dtype} error {own_error:.3g}, x{YARDSTICK_RATIO:g} if larger"
        raise AssertionError(
            f"{what}: max |logit error| {worst.value:.3g} exceeds the bound {bound:.3g} (rel {tol.rel:g}{own}); "
            f"worst at index {worst.index}: engine {worst.actual:.6g} vs reference {worst.reference:.6g}"
        )
    return worst.value


def _below_best(row: torch.Tensor, token: int) -> float:
    return float(row.double().max() - row[token].double())


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
        if tol.near_tie(ref_logits[i], a) and tol.near_tie(ours_logits[i], b):
            return GreedyComparison(i + 1, i, None)
        return GreedyComparison(
            i + 1,
            i,
            f"token {i}: engine {a} vs reference {b}; engine's token {_below_best(ref_logits[i], a):.3g} below the "
            f"reference's best, reference's token {_below_best(ours_logits[i], b):.3g} below the engine's best "
            f"(near-tie within {tol.tie_gap(ref_logits[i]):.3g})\n  engine:    {list(ours)}\n  reference: {list(ref)}",
        )
    return GreedyComparison(len(ours), None, None)


@dataclass(frozen=True)
class Mismatch:
    """A greedy position where the engine's token is not the argmax of its own row (own_row) or is neither the
    reference's argmax nor a near-tie of it. expected: that argmax; gap: how far `token` lies below it in that row;
    tie_gap: the near-tie allowance there (0 for the engine's own row, where none applies)."""

    position: int
    token: int
    expected: int
    gap: float
    tie_gap: float
    own_row: bool

    def reason(self, label: Callable[[int], str] = str) -> str:
        if self.own_row:
            return f"the engine picked {label(self.token)}, not the argmax {label(self.expected)} of its own logits"
        return (
            f"engine {label(self.token)} vs reference argmax {label(self.expected)}; {self.gap:.3g} below the "
            f"reference's best (near-tie within {self.tie_gap:.3g})"
        )

    @property
    def message(self) -> str:
        return f"token {self.position}: {self.reason()}"


def forced_greedy_mismatches(
    tokens: Sequence[int], ours_logits: Sequence[torch.Tensor], ref_logits: torch.Tensor, tol: LogitTolerance
) -> list[Mismatch]:
    """Every position where greedy tokens disagree with a reference teacher-forced on the same sequence.

    ref_logits[i] is the reference's row for the prefix that produced tokens[i], so the prefixes never diverge
    and every position is checked: each token must be the argmax of the engine's own row and of the reference
    row, or a near-tie of both.
    """
    out = []
    for i, token in enumerate(tokens):
        own = ours_logits[i]
        if own[token] != own.max():
            out.append(Mismatch(i, token, int(own.argmax()), _below_best(own, token), 0.0, own_row=True))
            continue
        best = int(ref_logits[i].argmax())
        if ref_logits[i][token] == ref_logits[i][best]:
            continue
        if not (tol.near_tie(ref_logits[i], token) and tol.near_tie(own, best)):
            gap, tie_gap = _below_best(ref_logits[i], token), tol.tie_gap(ref_logits[i])
            out.append(Mismatch(i, token, best, gap, tie_gap, own_row=False))
    return out


def check_forced_greedy(
    tokens: Sequence[int], ours_logits: Sequence[torch.Tensor], ref_logits: torch.Tensor, tol: LogitTolerance
) -> str | None:
    """The first of :func:`forced_greedy_mismatches`, as a message naming the tokens; None if they agree."""
    mismatches = forced_greedy_mismatches(tokens, ours_logits, ref_logits, tol)
    return f"{mismatches[0].message}; tokens {list(tokens)}" if mismatches else None


def check_teacher_forced(
    ref: HFOracle, gen: Generation, tol: LogitTolerance, what: str, yardstick: Sequence[float] | None = None
) -> list[float]:
    """A greedy generation against `ref` teacher-forced on the same tokens, so every position is compared: each
    token is the argmax of the engine's own row and a near-tie of ref's; each row is within tol of ref's, or, where
    `yardstick` gives HF's own error at the engine's dtype on that row, within tol.yardstick_bound. Returns the
    per-row errors."""
    prompt, out = list(gen.prompt_ids), list(gen.output_ids)
    forced = ref.teacher_forced_logits(prompt + out)[len(prompt) - 1 : len(prompt) - 1 + len(out)]
    dtype = str(tol.dtype).removeprefix("torch.")
    errors = []
    for i, (token, ours, row) in enumerate(zip(out, gen.logits, forced)):
        assert ours[token] == ours.max(), f"{what} token {i}: {token} is not the argmax of the engine's own logits"
        assert tol.near_tie(row, token), f"{what} token {i}: {token} is {float(row.max() - row[token]):.3g} below best"
        err = logits_error(ours, row)
        own = yardstick[i] if yardstick else None
        allowed = tol.yardstick_bound(row, own)
        assert err <= allowed, (
            f"{what} token {i}: max |logit error| vs HF {str(ref.dtype).removeprefix('torch.')} {err:.3g} exceeds "
            f"{allowed:.3g} ({dtype} bound {tol.bound(row):.3g}, HF {dtype}'s own error "
            f"{float('nan') if own is None else own:.3g})"
        )
        errors.append(err)
    return errors


def bucketed_tokens(
    row: torch.Tensor, params: SamplingParams, n: int, decides_on_probs: bool = False
) -> int:
    """Tokens of the reference distribution that get a chi-square bucket of their own with n draws: clear ones (see
    ReferenceDistribution.unclear) with an expected count >= MIN_EXPECTED. Two or more leave at least two buckets."""
    ref = reference_distribution(row, params)
    clear = ~ref.unclear(decides_on_probs) & (ref.probs > 0)
    return int((clear & (ref.probs * n >= MIN_EXPECTED)).sum())


RELAX_MAX_TEMPERATURE = 1024
"""Where relax_until_testable stops heating a row: a logit gap of ~8000 still leaves two buckets at 12,000 draws."""


def relax_until_testable(
    row: torch.Tensor, params: SamplingParams, n: int, decides_on_probs: bool = False
) -> SamplingParams:
    """params for a sampled row, relaxed until a chi-square on n draws from row has two buckets: min-p off, then
    top-p, then top-k, then temperature 1, then temperatures doubling up to RELAX_MAX_TEMPERATURE for rows whose
    logits spread so far that temperature 1 leaves one token (edge values that leave one token are the exact checks'
    business)."""
    filters_off: list[dict[str, Any]] = [{}, {"min_p": 0.0}, {"top_p": 1.0}, {"top_k": -1}]
    hotter = ({"temperature": float(2**i)} for i in range(RELAX_MAX_TEMPERATURE.bit_length()))
    for change in itertools.chain(filters_off, hotter):
        params = replace(params, **change)
        if params.is_greedy or bucketed_tokens(row, params, n, decides_on_probs) >= 2:
            break
    return params


def check_sample_counts(
    counts: torch.Tensor,
    logits_row: torch.Tensor,
    params: SamplingParams,
    alpha: float,
    decides_on_probs: bool = False,
) -> list[str]:
    """Failures of tokens drawn (as per-token counts) from one logits row with params; [] if none.

    Greedy rows (temperature 0) must always take a maximal logit. Sampled rows must pass the support check and the
    chi-square goodness-of-fit test against oracle.sampler's exact HF-order distribution, each at level alpha; tokens
    whose keep/drop decision is ambiguous in fp32 are excluded from both, and so are the probability ties a
    sampler deciding on probabilities cannot split (decides_on_probs: FlashInfer's kernels drew the row).
    """
    n = int(counts.sum())
    if params.is_greedy:
        drawn = counts.nonzero().flatten()
        off = [int(t) for t in drawn if logits_row[t] != logits_row.max()]
        return [f"greedy row drew non-argmax tokens {off} (argmax {int(logits_row.argmax())})"] if off else []
    ref = reference_distribution(logits_row, params)
    unclear = ref.unclear(decides_on_probs)
    failures = []
    support = support_check(counts, ref.probs, n, alpha, unclear)
    if not support.passed:
        failures.append(support.message())
    chi = chi_square_gof(counts, ref.probs, alpha, exclude=unclear)
    if not chi.passed:
        failures.append(chi.message())
    return failures


FLOAT32_FLOOR = torch.finfo(torch.float32).tiny
"""2^-126, float32's smallest normal: a probability below it may be 0 in a float32 sampler (underflow, flushing)."""


def filtered_rtol(vocab: int) -> float:
    """Relative error allowed in a float32 filtered distribution: a softmax and a renormalization over the row (each
    term rounded, then a sum of vocab terms: at most (vocab + 1) eps each), times 4 for FlashInfer's fast exp and
    its two renorm passes."""
    return 4 * (vocab + 8) * torch.finfo(torch.float32).eps


def check_filtered_distribution(
    probs: torch.Tensor, ref: ReferenceDistribution, decides_on_probs: bool = False
) -> str | None:
    """Why a sampler's probability vector for one row (what it draws from) is not ref; None if it is.

    Outside ref.unclear(decides_on_probs) the support must be the reference's exactly: a token of reference
    probability above FLOAT32_FLOOR must have probability > 0, one of reference probability 0 must have 0. Then
    |p - ref| <= filtered_rtol(vocab) * ref + FLOAT32_FLOOR per token; where unclear tokens exist, for the
    distributions conditioned on the clear tokens (an unclear decision, either way, only rescales the rest).
    """
    p = probs.detach().to(device="cpu", dtype=torch.float64)
    clear = ~ref.unclear(decides_on_probs)
    lost = clear & (ref.probs > FLOAT32_FLOOR) & (p == 0)
    added = clear & (ref.probs == 0) & (p > 0)
    if lost.any() or added.any():
        return (
            f"support differs from the reference: tokens {lost.nonzero().flatten().tolist()} dropped (reference "
            f"probabilities {ref.probs[lost].tolist()}), tokens {added.nonzero().flatten().tolist()} added "
            f"(probabilities {p[added].tolist()})"
        )
    r = ref.probs
    if not bool(clear.all()):
        p_mass, r_mass = p[clear].sum(), r[clear].sum()
        if not (p_mass > 0 and r_mass > 0):
            return None  # nothing clear carries mass: only the support could be checked
        p, r = torch.where(clear, p / p_mass, 0.0), torch.where(clear, r / r_mass, 0.0)
    rtol = filtered_rtol(len(p))
    excess = (p - r).abs() - (rtol * r + FLOAT32_FLOOR)
    worst = int(excess.argmax())
    if excess[worst] > 0:
        return (
            f"token {worst}: probability {float(p[worst]):.9g} vs reference {float(r[worst]):.9g}, beyond the bound "
            f"{rtol:.3g} relative + {FLOAT32_FLOOR:.3g}"
        )
    return None
