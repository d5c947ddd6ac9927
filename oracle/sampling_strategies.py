"""Hypothesis strategies for the exact sampling checks (public, as oracle.strategies): rows with many exact ties,
extreme temperatures, every combination of top-k, top-p and min-p, and the filter-order cases, whose support
changes when two filters swap places (ORDER_PAIRS)."""

from __future__ import annotations

import math

import torch
from hypothesis import assume
from hypothesis import strategies as st

from engine import SamplingParams
from oracle.sampler import reference_distribution
from oracle.strategies import LOGIT_SCALES, min_ps, seeds, top_ks

TINY_TEMPERATURES = (1e-30, 1e-12, 1e-5)
HUGE_TEMPERATURES = (1e4, 1e8, 1e16, 1e30)
TIE_LEVELS = (-3.0, -1.0, 0.0, 0.5, 2.0)
MASKED_SHARES = (0.0, 0.25, 0.5)  # share of -inf tokens in a tie-heavy row
ORDER_PAIRS = (("temperature", "top_p"), ("temperature", "min_p"), ("top_k", "top_p"), ("top_p", "min_p"))
"""The pairs of filters (HF's order first) whose order changes the support. The others commute: top-k and min-p
each keep a prefix of the descending order by value, and dividing by a temperature keeps that order."""
MIN_CASE_MASS = 1e-3  # a filter-order case's differing token carries at least this share of its distribution


def extreme_temperatures() -> st.SearchStrategy[float]:
    """Tiny (1e-30..1e-5: one-hot but for exact ties), ordinary, or huge (1e4..1e30: float32 probabilities tie
    although the logits differ)."""
    return st.one_of(
        st.sampled_from((*TINY_TEMPERATURES, 0.7, 1.0, 3.0, *HUGE_TEMPERATURES)),
        st.floats(0.05, 5.0),
        st.floats(1e4, 1e30),
    )


@st.composite
def filter_params(draw: st.DrawFn, vocab_size: int, greedy_allowed: bool = False) -> SamplingParams:
    """Every combination of top-k, top-p and min-p, each off or on (edge values included), at an extreme or
    ordinary temperature; greedy_allowed adds temperature 0. One new token, EOS ignored."""
    temperature = draw(st.just(0.0) | extreme_temperatures() if greedy_allowed else extreme_temperatures())
    return SamplingParams(
        temperature=temperature,
        top_k=draw(top_ks(vocab_size)),
        top_p=draw(st.one_of(st.sampled_from((1.0, 1e-9, 0.5, 0.9)), st.floats(0.01, 1.0))),
        min_p=draw(min_ps()),
        max_tokens=1,
        ignore_eos=True,
    )


@st.composite
def tie_heavy_rows(draw: st.DrawFn, vocab_size: int) -> torch.Tensor:
    """A float32 row full of exact ties: 1..4 levels (edge values or drawn floats) repeated, or Gaussians rounded to
    bf16 (ties as a bf16 model makes them); a drawn share of the tokens is -inf, never all of them."""
    gen = torch.Generator().manual_seed(draw(seeds))
    if draw(st.booleans()):
        levels = draw(st.lists(st.sampled_from(TIE_LEVELS) | st.floats(-8.0, 8.0, width=32), min_size=1, max_size=4))
        row = torch.tensor(levels, dtype=torch.float32)[torch.randint(len(levels), (vocab_size,), generator=gen)]
    else:
        scale = draw(st.sampled_from(LOGIT_SCALES))
        row = (torch.randn(vocab_size, generator=gen) * scale).to(torch.bfloat16).float()
    return with_dead_tokens(row, draw(st.sampled_from(MASKED_SHARES)), gen)


def with_dead_tokens(row: torch.Tensor, share: float, gen: torch.Generator) -> torch.Tensor:
    """row with about `share` of its tokens -inf, never all of them."""
    dead = torch.rand(row.shape[0], generator=gen) < share
    dead[int(torch.randint(row.shape[0], (1,), generator=gen))] = False
    return row.masked_fill(dead, float("-inf"))


def _only(params: SamplingParams, name: str, temperature: float) -> SamplingParams:
    """params with only the filter `name` on ("temperature": none), at `temperature`."""
    return SamplingParams(
        temperature=temperature,
        top_k=params.top_k if name == "top_k" else -1,
        top_p=params.top_p if name == "top_p" else 1.0,
        min_p=params.min_p if name == "min_p" else 0.0,
    )


def swapped_support(row: torch.Tensor, params: SamplingParams, pair: tuple[str, str]) -> torch.Tensor:
    """The support when the two filters of `pair` (the only ones params turns on) run in the other order."""
    first, second = pair
    t = params.temperature
    step = reference_distribution(row, _only(params, second, 1.0 if first == "temperature" else t))
    return reference_distribution(step.probs.log(), _only(params, first, t if first == "temperature" else 1.0)).support


def _order_candidates(x: torch.Tensor, pair: tuple[str, str], t: float) -> list[dict[str, float]]:
    """Parameter settings for `pair` at which one token's fate depends on the order, each decision at a margin.

    x: float64 logits sorted descending; q, a: probabilities and the mass above each token at temperature t.
    """
    q_t = torch.softmax(x / t, dim=0)
    q, a = q_t.tolist(), (torch.cumsum(q_t, 0) - q_t).tolist()
    out: list[dict[str, float]] = []
    vocab = len(q)
    if pair == ("top_k", "top_p"):  # top-k renormalizes first: the mass above j grows from a_j to a_j / Q_k
        for k in range(2, vocab):
            kept = sum(q[:k])
            out += [{"top_k": k, "top_p": (a[j] + min(a[j] / kept, 1)) / 2} for j in range(1, k)
                    if min(a[j] / kept, 1) - a[j] >= 0.02 and q[j] >= MIN_CASE_MASS]
    elif pair == ("top_p", "min_p"):  # min-p first keeps the top r, whose mass Z < 1 scales the mass above j
        for r in range(2, vocab):
            if q[r - 1] >= 1.05 * q[r]:
                kept, m = sum(q[:r]), math.sqrt(q[r - 1] * q[r]) / q[0]
                out += [{"min_p": m, "top_p": (a[j] + min(a[j] / kept, 1)) / 2} for j in range(1, r)
                        if min(a[j] / kept, 1) - a[j] >= 0.02 and q[j] >= MIN_CASE_MASS]
    elif pair == ("temperature", "top_p"):  # top-p on the untempered distribution sees other masses above j
        q1_t = torch.softmax(x, dim=0)
        q1, a1 = q1_t.tolist(), (torch.cumsum(q1_t, 0) - q1_t).tolist()
        out += [{"top_p": (a[j] + a1[j]) / 2} for j in range(1, vocab)
                if abs(a[j] - a1[j]) >= 0.02 and min(q[j], q1[j]) >= MIN_CASE_MASS]
    else:  # ("temperature", "min_p"): threshold exp(-d / sqrt(t)) keeps token j at t > 1 only, or at t < 1 only
        out += [{"min_p": math.exp(-float(x[0] - x[j]) / math.sqrt(t))} for j in range(1, vocab) if x[0] - x[j] >= 0.3]
    return out


@st.composite
def filter_order_cases(
    draw: st.DrawFn, vocab_size: int, pair: tuple[str, str] | None = None
) -> tuple[torch.Tensor, SamplingParams]:
    """A float32 row and params turning on exactly the filters of `pair` (drawn from ORDER_PAIRS if None), built so
    that the other order changes the support (swapped_support) outside the ambiguous tokens: a token of at least
    MIN_CASE_MASS that one order keeps and the other drops, every decision far from float32 rounding. vocab >= 3."""
    pair = pair if pair is not None else draw(st.sampled_from(ORDER_PAIRS))
    gen = torch.Generator().manual_seed(draw(seeds))
    x = torch.randn(vocab_size, generator=gen, dtype=torch.float64) * draw(st.sampled_from((1.0, 2.0, 3.0)))
    t = draw(st.sampled_from((0.25, 0.5, 2.0, 4.0) if pair[0] == "temperature" else (0.7, 1.0, 1.5)))
    candidates = _order_candidates(x.sort(descending=True).values, pair, t)
    assume(candidates)
    setting = candidates[draw(st.integers(0, len(candidates) - 1))]
    params = SamplingParams(
        temperature=t,
        top_k=int(setting.get("top_k", -1)),
        top_p=setting.get("top_p", 1.0),
        min_p=setting.get("min_p", 0.0),
        max_tokens=1,
        ignore_eos=True,
    )
    row = x.float()
    ref = reference_distribution(row, params)
    assume(bool(((swapped_support(row, params, pair) != ref.support) & ~ref.ambiguous).any()))
    return row, params
