"""Strategies that seek the boundaries where kernels break, for the op-level properties (and the model level).

* sizes: each side of the tile and block sizes kernels use (sequence lengths at oracle.strategies.boundary_edges,
  the tile and page edges the model level draws too; BLOCK_EDGES for widths and vocabularies: k - 1, k, k + 1),
  mixed with uniform draws;
* magnitudes: subnormal, tiny, ordinary, large and near float32's square overflow (MAGNITUDES), attention scores
  up to and past float32's exp overflow (SCORE_MAXIMA);
* layouts: contiguous or strided rows (a gap after each row, filled with poison by oracle.ops.guard);
* indices: slots at the top of the pool, duplicated and aliased slots, rows of the page table past the batch;
* values: exact ties at an argmax, rows of -inf, NaN and +inf.

Every tensor comes from a drawn seed (a torch generator), so a failure replays from Hypothesis' blob and shrinks to
a smaller seed, shape and magnitude.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from ..strategies import boundary_edges, seeds

BLOCK_EDGES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
"""Widths where elementwise and reduction kernels change blocks (power-of-two BLOCK sizes)."""
MAGNITUDES = (1e-39, 1e-6, 1.0, 40.0, 1e18)
"""Input scales: float32/bfloat16 subnormals, tiny, ordinary, large, and squares near float32's overflow."""
SCORE_MAXIMA = (0.5, 10.0, 80.0, 88.0, 89.0, 120.0, 1000.0)
"""The largest attention score of a query row: float32's exp overflows past ~88.72."""


def edge_sizes(edges: Sequence[int], low: int, high: int) -> st.SearchStrategy[int]:
    """low..high, with k - 1, k, k + 1 for every k in edges as explicit choices."""
    marks = sorted({k + d for k in edges for d in (-1, 0, 1)} | {low, high})
    marks = [n for n in marks if low <= n <= high]
    return st.one_of(st.sampled_from(marks), st.integers(low, high))


def seq_lengths(max_len: int, page_size: int = 1, low: int = 1) -> st.SearchStrategy[int]:
    """Lengths each side of a tile or page edge (boundary_edges), or anything in [low, max_len]."""
    tiles, pages = boundary_edges(max_len, page_size, low)
    return st.one_of(st.sampled_from(sorted({*tiles, *pages, low, max_len})), st.integers(low, max_len))


def widths(max_width: int, low: int = 1, even: bool = False) -> st.SearchStrategy[int]:
    """Row widths each side of the block edges (even ones only where the op halves the row)."""
    sizes = edge_sizes(BLOCK_EDGES, low, max_width)
    return sizes.map(lambda n: max(2, n + (n % 2))) if even else sizes


def score_maxima() -> st.SearchStrategy[float]:
    """A batch's largest attention score, the ones past float32's exp overflow drawn as often as the rest."""
    past = tuple(m for m in SCORE_MAXIMA if m > 88.73)
    return st.sampled_from(SCORE_MAXIMA) | st.sampled_from(past)


gaps = st.sampled_from((0, 0, 3, 64))
"""Elements between rows: 0 (contiguous, drawn more often) or a strided view."""


def random_tensor(shape: Sequence[int], dtype: torch.dtype, scale: float, seed: int) -> torch.Tensor:
    """Gaussian values times `scale`, rounded to `dtype` (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


@st.composite
def tensors(
    draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype, scales: Sequence[float] = MAGNITUDES
) -> torch.Tensor:
    return random_tensor(shape, dtype, draw(st.sampled_from(scales)), draw(seeds))
