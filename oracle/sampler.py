"""Reference sampler: the exact distribution a sampler should draw from, HF's own decisions included.

Given one logits row and a :class:`~engine.core.SamplingParams`, :func:`reference_distribution` returns the float64
probability vector after temperature, top-k, top-p and min-p, and two masks: *ambiguous* tokens, whose keep/drop
decision another device's float32 rounding could flip, and *prob_ties*, tied float32 probabilities at a cut that a
sampler deciding on probabilities alone (FlashInfer's kernels) cannot split the way HF does. Statistical tests and
exact checks leave them out (see :meth:`ReferenceDistribution.unclear`).

Keep/drop decisions are transformers 5.17's float32 computation, step by step as its warpers run in ``generate``
(``mode="hf"``), on the row cast to float32 (generate casts logits to float32 before its processors):

1. temperature: ``scores = row / T`` in float32 (T rounded to float32; on CPU that is what HF's division by a Python
   float computes, bit for bit);
2. top-k: keep ``scores >= the k-th largest score``: every token tied with the k-th stays, so ``top_k=1`` keeps
   every tied maximum and samples among them;
3. top-p: sort the scores ascending (stably: tied scores by index), take the softmax of the sorted row and its
   cumulative sum, and remove tokens whose cumsum is ``<= float32(1 - top_p)``, never the last (top) one. Of exact
   ties that the cut splits, the highest indices stay: what a stable ascending sort leaves at the top. HF's own
   ``torch.sort(stable=False)`` is introsort on CPU, stable only up to 16 elements, so beyond that *which* members
   of a split tie group HF keeps is an artefact of its sort (and differs on CUDA); their number never is. The
   oracle pins the stable choice and the engine follows it;
4. min-p: softmax of the filtered row, remove ``probs < min_p * max`` (min_p rounded to float32); the top token
   always stays.

Only then does float64 enter: ``probs`` is the float64 softmax of the float32 scores over the kept tokens.

``mode="joint"`` is SGLang / FlashInfer ``filter_apply_order="joint"``: top-k and top-p are both evaluated on the
temperature-scaled distribution and their keep-sets intersected; min-p follows as in ``"hf"``. Joint keeps at least
as many tokens as hf (top-k's renormalization makes hf's top-p cut earlier); they agree when at most one of top-k
and top-p is on.

Ambiguity is what rounding elsewhere could flip, never what HF's rule decides: identical logits stay identical
under any device's ``x / T``, ``exp`` and comparisons, so exact ties are decided by the rules above. What can flip:
a score within ``tol`` (relative) of another score across a top-k cut or inside a top-p group that the cut splits
(a device's division or sort may order them otherwise), a cumulative mass within ``tol`` (absolute, plus the mass
of upstream-ambiguous tokens) of the top-p threshold, and a min-p margin ``s_t - s_max - log(min_p)`` within ``tol``
of 0 (relative to the scores' magnitude, absolute floor 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from engine.core import SamplingParams

# Decisions closer than this to a threshold are ambiguous: ~100 float32 ulps (eps = 1.2e-7), enough for another
# device's rounding in x / T, exp and a partial sum over a few hundred terms, far below any error worth reporting.
DEFAULT_TOL = 1e-5

Mode = Literal["hf", "joint"]


@dataclass(frozen=True)
class ReferenceDistribution:
    """Exact sampling distribution for one logits row.

    ``probs`` is float64 and sums to 1; ``support`` marks ``probs > 0``. ``ambiguous`` marks tokens whose decision
    another device's rounding could flip; ``prob_ties`` marks tokens whose float32 probability ties with a token on
    the other side of a top-k or top-p cut (or, at the k-th value, with more tokens than k leaves room for), which a
    sampler deciding on probabilities cannot split as HF does. Both may be in or out of ``support``. ``is_greedy``
    mirrors ``SamplingParams.is_greedy`` (temperature 0: a one-hot on the first argmax).
    """

    probs: torch.Tensor
    support: torch.Tensor
    ambiguous: torch.Tensor
    prob_ties: torch.Tensor
    is_greedy: bool

    def unclear(self, decides_on_probs: bool = False) -> torch.Tensor:
        """Tokens a check must leave out: the ambiguous ones, plus prob_ties for a probability-based sampler."""
        return self.ambiguous | self.prob_ties if decides_on_probs else self.ambiguous


def _as_row(logits_row: torch.Tensor) -> torch.Tensor:
    if logits_row.dim() != 1 or logits_row.numel() == 0:
        raise ValueError(f"expected a non-empty 1-D logits row, got shape {tuple(logits_row.shape)}")
    row = logits_row.detach().to(device="cpu", dtype=torch.float32)
    if torch.isnan(row).any() or (row == math.inf).any():
        raise ValueError("logits must not contain NaN or +inf")
    if not torch.isfinite(row).any():
        raise ValueError("logits must contain at least one finite value")
    return row


def _near(a: torch.Tensor, b: torch.Tensor | float, tol: float) -> torch.Tensor:
    """Elementwise ``|a - b| <= tol * max(|a|, |b|)`` for finite values: a division's rounding is relative."""
    b_t = torch.as_tensor(b, dtype=a.dtype)
    close = (a - b_t).abs() <= tol * torch.maximum(a.abs(), b_t.abs())
    return torch.isfinite(a) & torch.isfinite(b_t) & close


def _masked(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(~mask, -math.inf)


def _none(vocab: int) -> torch.Tensor:
    return torch.zeros(vocab, dtype=torch.bool)


def _near_any(values: torch.Tensor, pool: torch.Tensor, tol: float) -> torch.Tensor:
    """values[i] within ``tol`` (relative) of some element of pool: another device's softmax may make them equal."""
    if pool.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.bool)
    ordered = torch.sort(pool).values
    at = torch.searchsorted(ordered, values)
    below = ordered[(at - 1).clamp(min=0)]
    above = ordered[at.clamp(max=ordered.numel() - 1)]
    gap = torch.minimum((values - below).abs(), (values - above).abs())
    return gap <= tol * values.abs()


def _tie_groups_split(probs: torch.Tensor, kept: torch.Tensor, candidates: torch.Tensor, tol: float) -> torch.Tensor:
    """Candidates whose probability (near-)equals that of candidates on both sides of the kept/removed split."""
    kept_values = probs[candidates & kept]
    removed_values = probs[candidates & ~kept]
    return candidates & _near_any(probs, kept_values, tol) & _near_any(probs, removed_values, tol)


def _top_k(
    scores: torch.Tensor, row: torch.Tensor, k: int, tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep-mask, ambiguous-mask and probability-tie mask of HF top-k (keep every score >= the k-th largest)."""
    vocab = scores.numel()
    if k == -1 or k >= vocab:
        return torch.ones(vocab, dtype=torch.bool), _none(vocab), _none(vocab)
    # Division by T is monotone on every device, so the k-th score belongs to the k-th logit everywhere.
    kth_logit = torch.sort(row, descending=True, stable=True).values[k - 1]
    kth = torch.sort(scores, descending=True, stable=True).values[k - 1]
    keep = scores >= kth
    amb = (row < kth_logit) & _near(scores, kth.item(), tol)
    probs = torch.softmax(scores, dim=-1)
    p_kth = probs[scores == kth][0]
    tied = _near(probs, p_kth.item(), tol) if p_kth > 0 else probs == p_kth
    overfull = int((probs > p_kth).sum() - (tied & (probs > p_kth)).sum()) + int(tied.sum()) > k
    ties = tied & torch.isfinite(scores) if overfull else _none(vocab)
    return keep, amb, ties


def _top_p(
    scores: torch.Tensor, row: torch.Tensor, mask: torch.Tensor, p: float, tol: float, mass_tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep-mask, ambiguous-mask and probability-tie mask of HF top-p over ``scores[mask]`` (module doc, step 3)."""
    vocab = scores.numel()
    if p >= 1.0:
        return torch.ones(vocab, dtype=torch.bool), _none(vocab), _none(vocab)
    values, order = torch.sort(_masked(scores, mask), stable=True)
    cum = torch.softmax(values, dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= 1 - p  # a Python float: compared in float32, as HF's comparison does
    remove_sorted[-1] = False
    live = torch.isfinite(values)
    logits = row[order]
    # Runs of near-equal scores in the sorted order: another device may order the members of a run otherwise,
    # which matters only where the run holds distinct logits and the cut splits it or may move into it.
    linked = torch.zeros(vocab, dtype=torch.bool)
    linked[1:] = live[1:] & live[:-1] & _near(values[1:], values[:-1], tol)
    group = torch.cumsum((~linked).long(), 0) - 1
    groups = int(group[-1]) + 1
    distinct = torch.zeros(vocab, dtype=torch.bool)
    distinct[1:] = linked[1:] & (logits[1:] != logits[:-1])
    near_cut = live & ((cum - (1 - p)).abs() <= mass_tol)
    near_cut[-1] = False
    mixed, removed, kept, at_cut = (torch.zeros(groups, dtype=torch.bool) for _ in range(4))
    mixed[group[distinct]] = True
    removed[group[live & remove_sorted]] = True
    kept[group[live & ~remove_sorted]] = True
    at_cut[group[near_cut]] = True
    amb_sorted = near_cut | (live & (mixed & ((removed & kept) | at_cut))[group])
    keep = torch.empty_like(remove_sorted).scatter_(0, order, ~remove_sorted)
    amb = torch.empty_like(amb_sorted).scatter_(0, order, amb_sorted)
    ties = _tie_groups_split(torch.softmax(_masked(scores, mask), dim=-1), keep, mask & torch.isfinite(scores), tol)
    return keep, amb, ties


def _min_p(
    scores: torch.Tensor, row: torch.Tensor, mask: torch.Tensor, candidates: torch.Tensor, min_p: float, tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep-mask of HF min-p over ``scores[mask]``; ambiguous and surely-removed masks over ``candidates``.

    ``candidates`` (a superset of ``mask``) adds the tokens another device may still have at this stage. Ambiguity
    is measured in log space, ``log(p_t / p_max) = s_t - s_max`` against ``log(min_p)``, which is how float32 error
    enters; a token with the top token's very logit is kept everywhere (min_p <= 1).
    """
    vocab = scores.numel()
    if min_p <= 0.0:
        return torch.ones(vocab, dtype=torch.bool), _none(vocab), _none(vocab)
    probs = torch.softmax(_masked(scores, mask), dim=-1)
    keep = ~(probs < min_p * probs.amax())
    cand = _masked(scores, candidates).double()
    top = int(torch.argmax(cand))
    margin = cand - cand[top] - math.log(min_p)
    slack = tol * torch.clamp(torch.maximum(cand.abs(), cand[top].abs()), min=1.0)
    amb = candidates & torch.isfinite(margin) & (margin.abs() <= slack) & (row != row[top])
    surely_removed = candidates & (margin < -slack)
    return keep, amb, surely_removed


def top2_gap(logits_row: torch.Tensor) -> float:
    """Top-1 minus top-2 logit (``inf`` for a single-token vocabulary); small means a greedy near-tie."""
    row = _as_row(logits_row).double()
    if row.numel() == 1:
        return math.inf
    top2 = torch.topk(row, 2).values
    return float(top2[0] - top2[1])


def reference_distribution(
    logits_row: torch.Tensor,
    params: SamplingParams,
    mode: Mode = "hf",
    tol: float = DEFAULT_TOL,
) -> ReferenceDistribution:
    """Exact distribution that sampling ``logits_row`` (cast to float32) with ``params`` must follow.

    ``-inf`` logits (masked tokens) are never in the support and never ambiguous. Raises ValueError for rows the
    engine rejects (NaN, +inf, all -inf, logits / temperature past float32).
    """
    if mode not in ("hf", "joint"):
        raise ValueError(f"mode={mode!r} is invalid: use 'hf' or 'joint'")
    if not tol >= 0:
        raise ValueError(f"tol={tol!r} is invalid: use a number >= 0")
    row = _as_row(logits_row)
    vocab = row.numel()

    if params.temperature == 0.0:
        # Greedy: the first argmax (torch.argmax's documented rule), exact on the same float32 logits everywhere.
        probs = torch.zeros(vocab, dtype=torch.float64)
        probs[int(torch.argmax(row))] = 1.0
        return ReferenceDistribution(probs, probs > 0, _none(vocab), _none(vocab), is_greedy=True)

    scores = row / float(params.temperature)
    if torch.isposinf(scores).any():
        raise ValueError(f"logits / temperature={params.temperature!r} overflow float32")
    alive = torch.isfinite(scores)
    keep_k, amb_k, ties_k = _top_k(scores, row, params.top_k, tol)
    if mode == "hf":
        mask = alive & keep_k
        # Top-p sees the distribution renormalized after top-k; if another device flips an ambiguous top-k
        # decision, every cumulative mass shifts by at most that token mass, so widen the mass tolerance by it.
        upstream = torch.softmax(_masked(scores, mask | amb_k).double(), dim=-1)[amb_k].sum().item()
        keep_p, amb_p, ties_p = _top_p(scores, row, mask, params.top_p, tol, tol + upstream)
        mask &= keep_p
    else:
        keep_p, amb_p, ties_p = _top_p(scores, row, alive, params.top_p, tol, tol)
        mask = alive & keep_k & keep_p
    upstream_amb = (amb_k | amb_p) & alive
    keep_m, amb_m, removed_m = _min_p(scores, row, mask, mask | upstream_amb, params.min_p, tol)
    mask &= keep_m
    ambiguous = ((upstream_amb & ~removed_m) | amb_m) & alive
    probs = torch.softmax(_masked(scores.double(), mask), dim=-1)
    return ReferenceDistribution(probs, probs > 0, ambiguous, (ties_k | ties_p) & alive, is_greedy=params.is_greedy)
