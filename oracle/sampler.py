"""Pure-softmax reference sampler: the exact distribution a sampler should draw from.

Given one logits row and a :class:`~engine.core.SamplingParams`, :func:`reference_distribution`
returns the float64 probability vector after temperature, top-k, top-p and min-p, together with a
mask of *ambiguous* tokens: those whose keep/drop decision lies so close to a threshold that an
fp32 engine may legitimately decide it the other way. Statistical tests exclude or pool them.

Two filter orders are supported:

``mode="hf"``
    Hugging Face transformers' semantics, in the order ``generate`` chains its warpers:
    temperature, then top-k, then top-p on the distribution *renormalized after top-k*, then
    min-p. Top-k keeps every token whose value is ``>=`` the k-th largest value (so all ties with
    the k-th are kept). Top-p keeps a token iff the probability mass strictly above it (in
    descending order) is ``< top_p``; the top token is always kept.

``mode="joint"``
    SGLang / FlashInfer ``filter_apply_order="joint"``: top-k and top-p are both evaluated on the
    *original* temperature-scaled distribution and their keep-sets intersected; min-p follows as
    in ``"hf"``. Joint keeps at least as many tokens as hf: after top-k removes mass, hf's
    renormalized "mass above" of every token grows, so its top-p cuts earlier. The two agree
    whenever at most one of top-k / top-p is active.

Min-p's keep rule ``p_t >= min_p * p_max`` depends only on the logit difference to the best
token, so it is the same whether evaluated before or after renormalization.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from engine.core import SamplingParams

# Decisions closer than this to a threshold are ambiguous. The unit is relative to the magnitude of
# the logits involved (logit comparisons) or absolute probability mass (top-p). fp32 has
# eps = 1.2e-7, so 1e-5 is ~100 ulps: enough for an fp32 engine's rounding in logits / T, exp, and a
# sorted partial sum over a few hundred terms, yet far below any discrepancy worth reporting.
DEFAULT_TOL = 1e-5

Mode = Literal["hf", "joint"]


@dataclass(frozen=True)
class ReferenceDistribution:
    """Exact sampling distribution for one logits row.

    ``probs`` is float64 and sums to 1; ``support`` marks ``probs > 0``; ``ambiguous`` marks tokens
    whose keep/drop decision lies within the tolerance of a filter threshold (or of the argmax for
    greedy); they may be in or out of ``support``. ``is_greedy`` mirrors ``SamplingParams.is_greedy``:
    for ``top_k == 1`` with a positive temperature ``probs`` still follows HF (uniform over exact ties
    at the maximum), while ``temperature == 0`` gives a one-hot on the first argmax.
    """

    probs: torch.Tensor
    support: torch.Tensor
    ambiguous: torch.Tensor
    is_greedy: bool


def _as_row(logits_row: torch.Tensor) -> torch.Tensor:
    if logits_row.dim() != 1 or logits_row.numel() == 0:
        raise ValueError(f"expected a non-empty 1-D logits row, got shape {tuple(logits_row.shape)}")
    row = logits_row.detach().to(device="cpu", dtype=torch.float64)
    if torch.isnan(row).any() or (row == math.inf).any():
        raise ValueError("logits must not contain NaN or +inf")
    if not torch.isfinite(row).any():
        raise ValueError("logits must contain at least one finite value")
    return row


def _near(a: torch.Tensor, b: torch.Tensor | float, tol: float) -> torch.Tensor:
    """Elementwise ``|a - b| <= tol * max(1, |a|, |b|)`` for finite values (never for infinities).

    The scale factor makes the tolerance relative for large logits (e.g. after a small temperature),
    where fp32 rounding error grows with magnitude.
    """
    b_t = torch.as_tensor(b, dtype=torch.float64)
    scale = torch.maximum(torch.maximum(a.abs(), b_t.abs()), torch.ones((), dtype=torch.float64))
    return torch.isfinite(a) & torch.isfinite(b_t) & ((a - b_t).abs() <= tol * scale)


def _masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)


def _top_k(scores: torch.Tensor, k: int, tol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep-mask and ambiguous-mask of HF top-k (keep every value >= the k-th largest)."""
    vocab = scores.numel()
    keep_all = torch.ones(vocab, dtype=torch.bool)
    none = torch.zeros(vocab, dtype=torch.bool)
    if k == -1 or k >= vocab:
        return keep_all, none
    ordered = torch.sort(scores, descending=True).values
    kth = ordered[k - 1].item()
    keep = scores >= kth
    # Only a near-tie across the cut (rank k vs rank k+1) can flip a decision; then every token near
    # the k-th value could land on either side.
    if bool(_near(ordered[k], kth, tol)):
        return keep, _near(scores, kth, tol)
    return keep, none


def _top_p(
    scores: torch.Tensor, mask: torch.Tensor, p: float, tol: float, mass_tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep-mask and ambiguous-mask of top-p over the distribution ``softmax(scores[mask])``.

    ``mass_tol`` bounds the error in a token's "mass above"; ``tol`` is the logit tolerance for ties.

    HF sorts ascending and removes tokens with ``cumsum <= 1 - p``; the inclusive ascending cumsum of
    a token is ``1 - (mass strictly above it in descending order)``, so HF keeps a token iff the mass
    above it is ``< p``. That is what is computed here, on a descending sort. Equal probabilities are
    ordered by index (stable sort); HF's order among ties is unspecified, hence the tie rule below.
    """
    vocab = scores.numel()
    if p >= 1.0:
        return torch.ones(vocab, dtype=torch.bool), torch.zeros(vocab, dtype=torch.bool)
    probs = _masked_softmax(scores, mask)
    order = torch.sort(probs, descending=True, stable=True).indices
    sorted_probs = probs[order]
    above = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(sorted_probs, 0)[:-1]])
    keep_sorted = above < p
    keep_sorted[0] = True  # min_tokens_to_keep = 1, as generate passes without beam search
    live = sorted_probs > 0
    # Equal-probability tokens may come in any order, so each (near-)tie group, contiguous in the
    # sorted order, shares one fate: a token could take the place of any token tied with it.
    sorted_scores = scores[order]
    near_prev = torch.zeros(vocab, dtype=torch.bool)
    near_prev[1:] = _near(sorted_scores[1:], sorted_scores[:-1], tol)
    group = torch.cumsum((~near_prev).long(), 0) - 1
    near_cut = live & ((above - p).abs() <= mass_tol)
    near_cut[0] = False  # the top token is kept whatever p is; a tie at the top is handled below
    n_kept = int(keep_sorted.sum())
    if n_kept < vocab and bool(live[n_kept] & near_prev[n_kept]):
        near_cut[n_kept] = True  # a tie group straddles the cut: which members are kept is arbitrary
    flagged = torch.zeros(vocab, dtype=torch.bool)
    flagged[group[near_cut]] = True
    amb_sorted = live & flagged[group]
    keep = torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted)
    amb = torch.empty_like(amb_sorted).scatter_(0, order, amb_sorted)
    return keep, amb


def _min_p(
    scores: torch.Tensor, mask: torch.Tensor, candidates: torch.Tensor, min_p: float, tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep-mask of HF min-p over ``softmax(scores[mask])``; ambiguous-mask over ``candidates``.

    ``candidates`` (a superset of ``mask``) adds the tokens an engine may still have at this stage.
    The keep decision mirrors HF (``probs < min_p * max`` is removed, computed in probability space,
    so underflowed probabilities are removed exactly as HF removes them); ambiguity is measured in
    log space, ``log(p_t / p_max) = s_t - s_max`` against ``log(min_p)``, which is how an engine's
    fp32 error enters.
    """
    vocab = scores.numel()
    if min_p <= 0.0:
        return torch.ones(vocab, dtype=torch.bool), torch.zeros(vocab, dtype=torch.bool)
    probs = _masked_softmax(scores, mask)
    keep = ~(probs < min_p * probs.max())
    masked = scores.masked_fill(~candidates, -math.inf)
    top = int(torch.argmax(masked))
    s_max = masked[top].item()
    margin = masked - s_max - math.log(min_p)
    scale = torch.maximum(masked.abs(), torch.full_like(masked, max(1.0, abs(s_max))))
    amb = candidates & torch.isfinite(margin) & (margin.abs() <= tol * scale)
    # The best token is always kept unless another token is near-tied with it (only possible for
    # min_p close to 1), in which case either could be "the max".
    amb[top] = False
    if bool((amb & _near(masked, s_max, tol)).any()):
        amb[top] = True
    return keep, amb


def top2_gap(logits_row: torch.Tensor) -> float:
    """Top-1 minus top-2 logit (``inf`` for a single-token vocabulary); small means a greedy near-tie."""
    row = _as_row(logits_row)
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
    """Exact (float64, CPU) distribution that sampling ``logits_row`` with ``params`` must follow.

    ``-inf`` logits (masked tokens) are never in the support and never ambiguous.
    """
    if mode not in ("hf", "joint"):
        raise ValueError(f"mode={mode!r} is invalid: use 'hf' or 'joint'")
    if not tol >= 0:
        raise ValueError(f"tol={tol!r} is invalid: use a number >= 0")
    row = _as_row(logits_row)
    vocab = row.numel()

    if params.temperature == 0.0:
        top = int(torch.argmax(row))
        probs = torch.zeros(vocab, dtype=torch.float64)
        probs[top] = 1.0
        near_top = _near(row, row[top].item(), tol)
        ambiguous = near_top if int(near_top.sum()) >= 2 else torch.zeros(vocab, dtype=torch.bool)
        return ReferenceDistribution(probs, probs > 0, ambiguous, is_greedy=True)

    scores = row / params.temperature
    alive = torch.isfinite(scores)
    keep_k, amb_k = _top_k(scores, params.top_k, tol)
    if mode == "hf":
        mask = alive & keep_k
        # Top-p sees the distribution renormalized after top-k; if the engine flips an ambiguous
        # top-k decision, every "mass above" shifts by at most that token mass, so widen tol by it.
        upstream = _masked_softmax(scores, mask | amb_k)[amb_k].sum().item()
        keep_p, amb_p = _top_p(scores, mask, params.top_p, tol, tol + upstream)
        mask &= keep_p
    else:
        keep_p, amb_p = _top_p(scores, alive, params.top_p, tol, tol)
        mask = alive & keep_k & keep_p
    ambiguous = amb_k | amb_p
    # Min-p is judged on every token that could reach it, including upstream-ambiguous ones.
    keep_m, amb_m = _min_p(scores, mask, mask | (ambiguous & alive), params.min_p, tol)
    mask &= keep_m
    ambiguous = (ambiguous | amb_m) & alive
    probs = _masked_softmax(scores, mask)
    return ReferenceDistribution(probs, probs > 0, ambiguous, is_greedy=params.is_greedy)
