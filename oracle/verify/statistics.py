"""The sampling section of verify: which (params, row) cases it draws, the draws from the engine's own sampler in
mixed batches, and their chi-square, support and greedy-row checks; a chi-square left with fewer than two buckets
is reported not-tested, so cases are chosen to leave at least two (:func:`sampling_cases`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine import Batch, Engine, Req, SamplingParams

from ..checks import bucketed_tokens
from ..sampler import reference_distribution
from ..stats import ChiSquareResult, SupportResult, chi_square_gof, power, support_check
from .plan import Plan, describe, sampling_params
from .result import Check, Figure

GREEDY_EVERY = 8  # one greedy row in every 8 of a sampling batch
CHUNK_ROWS = 256  # rows per sampling batch: bounded memory on a 50k vocabulary
SECTION = "sampling"

Advance = Callable[[str], None]


def detectable_w(n: int, df: int, alpha: float, target: float = 0.9) -> float:
    """Smallest Cohen's w the chi-square test detects with `target` power (bisection on oracle.stats.power)."""
    if df < 1 or n < 1:
        return math.inf
    lo, hi = 0.0, 1.0
    while power(n, hi, df, alpha) < target:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power(n, mid, df, alpha) < target else (lo, mid)
    return hi


def chi_square_check(name: str, chi: ChiSquareResult) -> Check:
    """The check of one chi-square result: not-tested when fewer than two buckets remain (df < 1), never a pass."""
    if chi.df < 1:
        why = chi.note.split(":")[0] if chi.note else "fewer than two buckets"
        detail = f"not tested: {why} (df={chi.df}, n={chi.n}, dropped={chi.dropped}), nothing to compare"
        return Check(SECTION, f"chi-square: {name}", "not-tested", None, chi.alpha, ">=", detail)
    w = detectable_w(chi.n, chi.df, chi.alpha)
    detail = f"{chi.message()}; detects w >= {w:.3g} with 90% power"
    return Check.measured(SECTION, f"chi-square: {name}", chi.p_value, chi.alpha, ">=", detail)


def support_check_of(name: str, support: SupportResult) -> Check:
    bad = float(len(support.outside) + len(support.missing))
    return Check.measured(SECTION, f"support: {name}", bad, 0.0, "==", support.message())


@dataclass(frozen=True)
class SamplingCase:
    params: SamplingParams
    row: int  # index into the rows (one per prompt)
    why: str


def _first_testable(
    rows: Sequence[torch.Tensor], order: Sequence[int], params_of: Callable[[int], SamplingParams], n: int, why: str
) -> SamplingCase:
    """The first row in `order` whose params leave two chi-square buckets; else the first row, marked so."""
    for i in order:
        if bucketed_tokens(rows[i], params_of(i), n) >= 2:
            return SamplingCase(params_of(i), i, why)
    note = "no row leaves two chi-square buckets"
    return SamplingCase(params_of(order[0]), order[0], f"{why}; {note}" if why else note)


def _fixed(params: SamplingParams) -> Callable[[int], SamplingParams]:
    return lambda _: params


def _tiers(rows: Sequence[torch.Tensor], first: int | None) -> tuple[range, range]:
    """The rows tried first (rows[:first]) and those tried next; first=None: all in one tier."""
    cut = len(rows) if first is None else first
    return range(cut), range(cut, len(rows))


def boundary_cases(rows: Sequence[torch.Tensor], n: int, first: int | None = None) -> list[SamplingCase]:
    """Two points placed where filter semantics differ (T = 1), each on the row that shows it best among those
    leaving two buckets (rows[:first] before the others). With q1 >= q2 >= q3 the three largest probabilities and
    s = q1 + q2 + q3:

    * top_p = q1 + q2/2, on the row whose 2nd token is most likely: the 2nd token crosses p, and HF keeps it (the
      mass above it, q1, is < p); an inclusive cumulative sum drops it.
    * top_k = 3, top_p midway in (max(q1 + q2, q1/s), (q1 + q2)/s], on the row whose 3rd token is most likely: HF
      applies top-k, renormalizes (the top two now hold (q1 + q2)/s >= p) and keeps two tokens; top-p on the full
      distribution (q1 + q2 < p) keeps the 3rd too.
    """
    tops = [tuple(float(v) for v in torch.softmax(r.double(), -1).topk(3).values) for r in rows]

    def inside_second(i: int) -> SamplingParams:
        q1, q2, _ = tops[i]
        return sampling_params(1.0, top_p=min(1.0, q1 + q2 / 2))

    def k_then_p(i: int) -> SamplingParams:
        q1, q2, q3 = tops[i]
        s = q1 + q2 + q3
        lo, hi = max(q1 + q2, q1 / s), (q1 + q2) / s
        return sampling_params(1.0, top_k=3, top_p=(lo + hi) / 2)

    def by(rank: int) -> list[int]:
        return [i for tier in _tiers(rows, first) for i in sorted(tier, key=lambda i: -tops[i][rank])]

    return [
        _first_testable(rows, by(1), inside_second, n, "p inside the 2nd token's mass"),
        _first_testable(rows, by(2), k_then_p, n, "order of top-k and top-p"),
    ]


def sampling_cases(rows: Sequence[torch.Tensor], plan: Plan, first: int | None = None) -> list[SamplingCase]:
    """The boundary cases, then each fixed grid point on a row where it leaves two chi-square buckets. rows[:first]
    (the prompts' own rows) are tried before the others (later steps' rows), each tier by decreasing entropy (a
    near one-hot row tests little); grid point i starts at the i-th of the first tier, so the points spread over
    the prompts."""
    entropy = [float(torch.special.entr(torch.softmax(r.double(), -1)).sum()) for r in rows]
    head, rest = (sorted(tier, key=lambda i: -entropy[i]) for tier in _tiers(rows, first))
    cases = boundary_cases(rows, plan.samples, first)
    for i, params in enumerate(plan.grid):
        start = i % len(head)
        order = head[start:] + head[:start] + rest
        cases.append(_first_testable(rows, order, _fixed(params), plan.samples, ""))
    return cases


def draw(engine: Engine, row: torch.Tensor, params: SamplingParams, n: int, seed: int) -> tuple[torch.Tensor, int, int]:
    """The engine's sampler on `row` in mixed batches until n sampled draws: (counts, greedy rows, greedy argmax)."""
    vocab = row.numel()
    rows = CHUNK_ROWS
    greedy = torch.tensor([i % GREEDY_EVERY == GREEDY_EVERY - 1 for i in range(rows)])
    reqs = [
        Req(torch.zeros(1, dtype=torch.int32), i, 0, 1, i, SamplingParams() if g else params)
        for i, g in enumerate(greedy.tolist())
    ]
    sampler = engine.sampler
    sampler.reseed(seed)
    args = sampler.prepare(Batch(reqs, "decode"))
    logits = row.to(engine.device.torch_device, torch.float32).expand(rows, vocab).contiguous()
    argmax = int(row.argmax())
    counts = torch.zeros(vocab, dtype=torch.int64)
    drawn = greedy_rows = greedy_ok = 0
    while drawn < n:
        tokens = sampler.sample(logits, args).cpu().long()
        sampled = tokens[~greedy][: n - drawn]
        counts += torch.bincount(sampled, minlength=vocab)
        drawn += len(sampled)
        greedy_rows += int(greedy.sum())
        greedy_ok += int((tokens[greedy] == argmax).sum())
    return counts, greedy_rows, greedy_ok


def check_sampling(
    engine: Engine,
    rows: Sequence[torch.Tensor],
    row_labels: Sequence[str],
    cases: Sequence[SamplingCase],
    alpha: float,
    seed: int,
    token_label: Callable[[int], str],
    advance: Advance,
    samples: int,
) -> tuple[list[Check], Figure | None]:
    """Per case: chi-square, support and greedy-row checks of `samples` draws; the figure shows the first failing
    case, else the most informative one (the most chi-square buckets)."""
    checks: list[Check] = []
    figure, plotted_df, plotted_failure = None, -1, False
    for i, case in enumerate(cases):
        row, params = rows[case.row], case.params
        name = f"{describe(params)} on {row_labels[case.row]}" + (f" ({case.why})" if case.why else "")
        counts, greedy_rows, greedy_ok = draw(engine, row, params, samples, seed + i)
        ref = reference_distribution(row, params)
        unclear = ref.unclear(decides_on_probs=engine.sampler.use_flashinfer)  # leaving out more only costs power
        chi = chi_square_gof(counts, ref.probs, alpha, exclude=unclear)
        support = support_check(counts, ref.probs, int(counts.sum()), alpha, unclear)
        wrong = float(greedy_rows - greedy_ok)
        detail = f"{greedy_ok}/{greedy_rows} greedy rows in the mixed batches returned the argmax"
        case_checks = [
            chi_square_check(name, chi),
            support_check_of(name, support),
            Check.measured(SECTION, f"greedy rows: {name}", wrong, 0.0, "==", detail),
        ]
        checks += case_checks
        failed = any(c.status == "fail" for c in case_checks)
        if not plotted_failure and (failed or chi.df > plotted_df):
            figure, plotted_df, plotted_failure = _figure(name, counts, ref.probs, token_label), chi.df, failed
        advance(f"sampling {name}")
    return checks, figure


def _figure(name: str, counts: torch.Tensor, probs: torch.Tensor, token_label: Callable[[int], str]) -> Figure:
    n = int(counts.sum())
    top = torch.argsort(probs, descending=True, stable=True)[:20]
    top = top[probs[top] > 0]
    expected = probs[top].tolist()
    observed = (counts[top].double() / n).tolist()
    return Figure(
        f"{name}: observed vs expected (n={n})",
        [token_label(int(t)) for t in top],
        expected,
        observed,
        max(0.0, 1.0 - sum(expected)),
        max(0.0, 1.0 - sum(observed)),
        n,
    )
