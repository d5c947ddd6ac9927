"""Hypothesis strategies for the engine's inputs: public, so other harnesses can reuse them.

Every strategy returns plain data (token lists, frozen specs, CPU tensors). Randomness that is not drawn value by
value (a logits row, a shuffled page order) comes from a seed that is itself drawn, so a failure replays from its
Hypothesis blob and shrinks: a smaller seed, fewer requests, shorter prompts.

Edge values are listed explicitly and mixed with ranges, so the `ci` profile (derandomized, moderate example count)
still hits them:

* temperature {0, 1e-5, 0.7, 1, 50}; top_k {-1, 1, 2, vocab, vocab + 1}; top_p {1, 1e-6, 0.5}; min_p {0, 0.3, 1};
  for the exact checks also huge (1e4..1e30) and tiny (1e-30..1e-5) temperatures (oracle.sampling_strategies);
* prompt lengths k·page_size - 1, k·page_size, k·page_size + 1;
* long prompts at kernel tile boundaries (``boundary_lengths``: each side of 32 and of every multiple of 64, i.e.
  32, 64, 128, 192, 256, ... ± 1, where a kernel that drops a partial tile goes wrong) and of page edges;
  ``long_requests`` draws one such request past 64 tokens, half the time past 256, for a minority of examples;
* page_size {1, 2, 4, 8, 16}; contiguous, shuffled and interleaved pages; pages freed by earlier requests (finished
  or aborted) and reused;
* prefill split into 1..4 chunks (or at least 2, where a property is about extends);
* logits rows without ties (default), or with many exact ties (oracle.sampling_strategies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import get_args

import torch
from hypothesis import assume
from hypothesis import strategies as st

from engine import SamplingParams
from engine.driver import LayoutKind, PageLayout

PAGE_SIZES = (1, 2, 4, 8, 16)
TEMPERATURES = (0.0, 1e-5, 0.7, 1.0, 50.0)
TOP_PS = (1.0, 1e-6, 0.5)
MIN_PS = (0.0, 0.3, 1.0)
LOGIT_SCALES = (0.1, 1.0, 3.0, 10.0)  # std of a synthetic row: nearly flat .. sharply peaked

seeds = st.integers(min_value=0, max_value=2**32 - 1)
"""A seed for a torch or Python generator (drawn, so failures replay)."""

request_seeds = st.one_of(st.sampled_from((0, 2**32, 2**63 - 1)), st.integers(0, 2**63 - 1))
"""A SamplingParams.seed: the whole valid range, with the 32-bit boundary (CPU generators keep 32 bits) as an edge."""


def high_biased_integers(low: int, high: int) -> st.SearchStrategy[int]:
    """low..high drawn mirrored: Hypothesis favours the small end of a range, this favours the large end (e.g. a
    max_tokens long enough for a request to decode, stop on EOS or wait beside others)."""
    return st.integers(low, high).map(lambda n: low + high - n)


# ---- sampling parameters ---------------------------------------------------------------------------------------


def temperatures(greedy_allowed: bool = True) -> st.SearchStrategy[float]:
    """0 (greedy, unless greedy_allowed is False), 1e-5 (all but greedy), 0.7, 1, 50 (nearly flat), or 0.05..5."""
    edges = TEMPERATURES if greedy_allowed else TEMPERATURES[1:]
    return st.one_of(st.sampled_from(edges), st.floats(0.05, 5.0))


def top_ks(vocab_size: int) -> st.SearchStrategy[int]:
    """-1 (off), 1 (only the tied maxima survive), 2, vocab and beyond (no-ops), or anything between."""
    return st.one_of(st.sampled_from((-1, 1, 2, vocab_size, vocab_size + 1)), st.integers(1, max(1, vocab_size)))


def top_ps() -> st.SearchStrategy[float]:
    """1 (off), 1e-6 (only the top token survives), 0.5, or anything in (0.05, 1)."""
    return st.one_of(st.sampled_from(TOP_PS), st.floats(0.05, 1.0))


def min_ps() -> st.SearchStrategy[float]:
    """0 (off), 0.3, 1 (only tokens tied with the max survive), or anything in [0, 1]."""
    return st.one_of(st.sampled_from(MIN_PS), st.floats(0.0, 1.0))


@st.composite
def sampling_params(
    draw: st.DrawFn,
    vocab_size: int,
    greedy: bool | None = None,
    seeded: bool | None = None,
    max_tokens: st.SearchStrategy[int] | None = None,
) -> SamplingParams:
    """SamplingParams with edge values; EOS is always ignored so lengths stay under the test's control.

    max_tokens defaults to 1..8.

    greedy: True → temperature 0; False → a sampled row (temperature > 0); None → either.
    seeded: True → a per-request seed; False → none (the engine's generator); None → either.
    """
    if greedy:
        temperature, top_k = 0.0, -1
    else:
        temperature = draw(temperatures(greedy_allowed=greedy is None))
        top_k = draw(top_ks(vocab_size))
    seed_strategy = {True: request_seeds, False: st.none(), None: st.none() | request_seeds}[seeded]
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=draw(top_ps()),
        min_p=draw(min_ps()),
        max_tokens=draw(max_tokens if max_tokens is not None else st.integers(1, 8)),
        ignore_eos=True,
        seed=draw(seed_strategy),
    )


# ---- prompts and batches ---------------------------------------------------------------------------------------


def prompt_lengths(max_len: int, page_size: int = 1, min_len: int = 1) -> st.SearchStrategy[int]:
    """min_len..max_len, with page boundaries (k·page_size - 1, k·page_size, k·page_size + 1) as explicit edges."""
    edges = sorted({n for k in range(1, max_len // page_size + 2) for n in (k * page_size + d for d in (-1, 0, 1))})
    edges = [n for n in edges if min_len <= n <= max_len]
    lengths = st.integers(min_len, max_len)
    return st.one_of(st.sampled_from(edges), lengths) if edges else lengths


TILE = 64
"""The common attention kernel tile (BLOCK_N); half of it (32) is a common BLOCK_M. A sequence just past a multiple
of either leaves a partial tile."""


def boundary_edges(max_len: int, page_size: int = 1, min_len: int = 1) -> tuple[list[int], list[int]]:
    """(tile edges, page edges) in min_len..max_len: b - 1, b, b + 1 for b = 32 and every multiple of 64, and the
    same around every multiple of page_size (none for page_size 1, where every length is a page edge)."""
    tiles = {TILE // 2, *range(TILE, max_len + 2, TILE)}
    pages = set(range(page_size, max_len + 2, page_size)) if page_size > 1 else set()

    def around(bounds: set[int]) -> list[int]:
        return sorted({b + d for b in bounds for d in (-1, 0, 1)} & set(range(min_len, max_len + 1)))

    return around(tiles), around(pages)


def boundary_lengths(max_len: int, page_size: int = 1, min_len: int = 1) -> st.SearchStrategy[int]:
    """Lengths in min_len..max_len on each side of a kernel tile boundary or of a page edge (boundary_edges), half
    of the draws from each list where both have some."""
    tiles, pages = boundary_edges(max_len, page_size, min_len)
    if not tiles and not pages:
        raise ValueError(f"no tile or page edge in {min_len}..{max_len} (page_size {page_size})")
    return st.one_of(*(st.sampled_from(edges) for edges in (tiles, pages) if edges))


@st.composite
def prompts(draw: st.DrawFn, vocab_size: int, max_len: int, page_size: int = 1, min_len: int = 1) -> list[int]:
    n = draw(prompt_lengths(max_len, page_size, min_len))
    return draw(st.lists(st.integers(0, vocab_size - 1), min_size=n, max_size=n))


@st.composite
def prefix_splits(draw: st.DrawFn, length: int, max_chunks: int = 4, min_chunks: int = 1) -> tuple[int, ...]:
    """Chunk sizes for prefilling a `length`-token prompt in min_chunks..max_chunks pieces (fewer if the prompt is
    shorter; StaticDriver.add chunk_sizes)."""
    most = min(max_chunks, length)
    k = draw(st.integers(min(min_chunks, most), most))
    cuts = draw(st.lists(st.integers(1, length - 1), min_size=k - 1, max_size=k - 1, unique=True)) if k > 1 else []
    bounds = [0, *sorted(cuts), length]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@dataclass(frozen=True)
class RequestSpec:
    """One request: its prompt, its sampling parameters and how its prefill is chunked (() = one chunk)."""

    prompt: tuple[int, ...]
    params: SamplingParams
    chunk_sizes: tuple[int, ...] = ()


@st.composite
def requests(
    draw: st.DrawFn,
    vocab_size: int,
    max_prompt_len: int = 40,
    page_size: int = 1,
    params: st.SearchStrategy[SamplingParams] | None = None,
    split: bool = False,
    min_chunks: int = 1,
) -> RequestSpec:
    """A request; params default to greedy with 1..8 new tokens; split=True draws a chunked prefill of at least
    min_chunks pieces (the prompt is then at least min_chunks tokens long)."""
    prompt = draw(prompts(vocab_size, max_prompt_len, page_size, min_chunks if split else 1))
    p = draw(params if params is not None else sampling_params(vocab_size, greedy=True))
    chunks = draw(prefix_splits(len(prompt), min_chunks=min_chunks)) if split else ()
    return RequestSpec(tuple(prompt), p, chunks)


@st.composite
def long_requests(
    draw: st.DrawFn,
    vocab_size: int,
    max_prompt_len: int,
    page_size: int = 1,
    params: st.SearchStrategy[SamplingParams] | None = None,
    split: bool = False,
    min_chunks: int = 1,
) -> RequestSpec:
    """A request (as requests()) whose prompt sits at a tile or page edge next to or past 64 tokens, or, half the
    time, next to or past 256 (where max_prompt_len allows: at least 257). The prompt's tokens come from a drawn
    seed: Hypothesis takes ~50 ms to draw 300 tokens one by one, more than the engine and HF take to run them."""
    past = draw(st.sampled_from((64, 256) if max_prompt_len > 256 else (64,)))
    n = draw(boundary_lengths(max_prompt_len, page_size, min_len=past - 1))
    prompt = torch.randint(vocab_size, (n,), generator=torch.Generator().manual_seed(draw(seeds))).tolist()
    p = draw(params if params is not None else sampling_params(vocab_size, greedy=True))
    chunks = draw(prefix_splits(n, min_chunks=min_chunks)) if split else ()
    return RequestSpec(tuple(prompt), p, chunks)


def batches(
    vocab_size: int,
    max_size: int,
    max_prompt_len: int = 40,
    page_size: int = 1,
    params: st.SearchStrategy[SamplingParams] | None = None,
    split: bool = False,
    min_size: int = 1,
    min_chunks: int = 1,
) -> st.SearchStrategy[list[RequestSpec]]:
    """min_size..max_size requests (at most the engine's max_running_req). Decode steps = max_tokens - 1 each."""
    return st.lists(
        requests(vocab_size, max_prompt_len, page_size, params, split, min_chunks), min_size=min_size, max_size=max_size
    )


# ---- page layouts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutSpec:
    """Where a run's KV pages come from.

    page_size picks the engine; layout is the driver's PageLayout (contiguous, shuffled with a seed, interleaved);
    churn lists throwaway greedy requests that run before the real ones: each (prompt, aborted) is prefilled and
    then aborted, or decoded to completion, so the real requests reuse pages they freed (and whatever KV they left).
    """

    page_size: int
    layout: PageLayout = field(default_factory=PageLayout)
    churn: tuple[tuple[tuple[int, ...], bool], ...] = ()


@st.composite
def layouts(
    draw: st.DrawFn,
    vocab_size: int,
    page_sizes: Sequence[int] = PAGE_SIZES,
    max_churn: int = 3,
    max_churn_len: int = 24,
    kinds: Sequence[LayoutKind] = get_args(LayoutKind),
) -> LayoutSpec:
    page_size = draw(st.sampled_from(page_sizes))
    kind = draw(st.sampled_from(kinds))
    layout = PageLayout(kind=kind, seed=draw(seeds) if kind == "shuffled" else 0)
    churn = draw(
        st.lists(
            st.tuples(st.lists(st.integers(0, vocab_size - 1), min_size=1, max_size=max_churn_len).map(tuple),
                      st.booleans()),
            max_size=max_churn,
        )
    )
    return LayoutSpec(page_size, layout, tuple(churn))


# ---- logits rows -----------------------------------------------------------------------------------------------


@st.composite
def logits_rows(draw: st.DrawFn, vocab_size: int, ties: bool = False) -> torch.Tensor:
    """One float32 logits row of `vocab_size` values, generated from a drawn seed.

    ties=False: Gaussian with a drawn scale, every value distinct. ties=True: each token takes one of 1..4 drawn
    levels, so exact ties sit at the top, at the k-th value and at top-p / min-p cuts.
    """
    gen = torch.Generator().manual_seed(draw(seeds))
    if ties:
        levels = draw(st.lists(st.floats(-8.0, 8.0, width=32), min_size=1, max_size=4))
        pick = torch.randint(len(levels), (vocab_size,), generator=gen)
        return torch.tensor(levels, dtype=torch.float32)[pick]
    row = torch.randn(vocab_size, generator=gen) * draw(st.sampled_from(LOGIT_SCALES))
    assume(row.unique().numel() == vocab_size)  # fp32 Gaussians almost never collide; drop the rare row that does
    return row


@st.composite
def logits_batches(draw: st.DrawFn, vocab_size: int, max_rows: int) -> torch.Tensor:
    """[rows, vocab] float32 logits, 1..max_rows rows, each tie-free or tie-heavy (drawn per row)."""
    rows = draw(st.integers(1, max_rows))
    out = [draw(logits_rows(vocab_size, ties=draw(st.booleans()))) for _ in range(rows)]
    return torch.stack(out)
