"""The sampler's Triton row passes (engine/sample_rows_triton.py) against the torch reference of engine/sample_rows.py
and float64: softmax within its rounding, top-p's removed count wherever float64 puts the cut clear of float32's
summation error, keep_from exactly, and each row's bits the same alone and in a batch (the seeded contract).

Rows mix ties, -inf entries, a top-k cut and widths on both sides of the CHUNK boundaries. On CUDA by default;
KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from gpu_support import KERNEL_DEVICE as DEVICE  # noqa: E402
from gpu_support import needs_kernel_device  # noqa: E402

from engine import sample_rows, sample_rows_triton  # noqa: E402
from oracle.tolerance import rounding_bound, summation_bound, unit_roundoff  # noqa: E402

pytestmark = needs_kernel_device
CHUNK = sample_rows_triton.CHUNK
WIDTHS = [2, 17, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 300]


def _rows(seed: int, bs: int, width: int) -> torch.Tensor:
    """Gaussian rows of several spreads, one with many ties, one with -inf entries (never its max): a whole chunk of
    them where the row has more than one chunk, as top-k leaves a row."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, width, generator=gen) * torch.tensor([1.0, 8.0, 30.0, 3.0])[torch.arange(bs) % 4, None]
    x[1 % bs] = (x[1 % bs] * 2).round() / 2
    if bs > 2:
        x[2, torch.rand(width, generator=gen) < 0.3] = float("-inf")
        if width > CHUNK:
            x[2, :CHUNK] = float("-inf")
        x[2, -1] = 5.0
    return x


def _softmax_bound(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float64 softmax of float32 scores, the error bound of a chunked float32 one against it): exp, the
    division and the rescale of each chunk's sum: a few roundings; scores - max rounded, which exp turns into a
    relative error |scores - max| u; the row's sum: width terms."""
    exact = scores.double().softmax(dim=-1)
    shift = (scores.double() - scores.double().amax(dim=-1, keepdim=True)).abs().nan_to_num(0.0)
    bound = (summation_bound(exact, scores.shape[1], torch.float32) + rounding_bound(exact, torch.float32, 4)
             + exact * shift * unit_roundoff(torch.float32))
    return exact, bound


@pytest.mark.parametrize("width", WIDTHS)
def test_softmax_within_its_rounding_and_the_same_alone_as_in_a_batch(width: int) -> None:
    x = _rows(width, 4, width)
    got = sample_rows_triton.softmax(x.to(DEVICE)).cpu()
    ref, bound = _softmax_bound(x)
    assert bool(((got.double() - ref).abs() <= bound).all()), float((got.double() - ref).abs().max())
    for r in range(x.shape[0]):
        assert torch.equal(sample_rows_triton.softmax(x[r : r + 1].to(DEVICE)).cpu()[0], got[r]), f"row {r}"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("with_top_k", [False, True])
def test_top_p_removed_count_where_the_cut_is_clear_and_the_same_alone(width: int, with_top_k: bool) -> None:
    x = _rows(width + 1, 4, width)
    values, _ = x.sort(dim=-1, stable=True)
    gen = torch.Generator().manual_seed(width)
    cut = torch.tensor([0.5, 0.1, 0.0, 0.95])  # the flat row 0 cuts in its second chunk
    kth = None
    if with_top_k:
        k = torch.randint(1, width + 1, (4,), generator=gen)
        kth = values.gather(1, (width - k).unsqueeze(1)).squeeze(1)
    got = sample_rows_triton.top_p_removed(values.to(DEVICE), None if kth is None else kth.to(DEVICE), cut.to(DEVICE))
    masked = values if kth is None else values.masked_fill(values < kth.unsqueeze(1), float("-inf"))
    cumulative = masked.double().softmax(dim=-1).cumsum(dim=-1)[:, :-1]
    slack = summation_bound(torch.ones(()), 2 * width, torch.float32)  # the exact sums against either order's
    low = (cumulative <= cut.double().unsqueeze(1) - slack).sum(dim=-1)
    high = (cumulative <= cut.double().unsqueeze(1) + slack).sum(dim=-1)
    torch_count = sample_rows.top_p_removed(masked, None, cut)
    for r in range(4):
        assert low[r] <= got[r].item() <= high[r], f"row {r}: {got[r].item()} outside [{low[r]}, {high[r]}]"
        assert low[r] <= torch_count[r] <= high[r], f"row {r}: the torch reference is outside the same band"
        alone = sample_rows_triton.top_p_removed(values[r : r + 1].to(DEVICE),
                                                 None if kth is None else kth[r : r + 1].to(DEVICE),
                                                 cut[r : r + 1].to(DEVICE))
        assert alone.item() == got[r].item(), f"row {r}: {alone.item()} alone, {got[r].item()} in the batch"


@pytest.mark.parametrize("width", WIDTHS)
def test_keep_from_is_the_torch_reference(width: int) -> None:
    x = _rows(width + 2, 4, width)
    values, order = x.sort(dim=-1, stable=True)
    place = torch.tensor([0, width // 2, width - 1, width // 3]).unsqueeze(1)
    value, index = values.gather(1, place).squeeze(1), order.gather(1, place).squeeze(1)
    got = sample_rows_triton.keep_from(x.to(DEVICE), value.to(DEVICE), index.to(DEVICE)).cpu()
    assert torch.equal(got, sample_rows.keep_from(x, value, index))


def _bad_rows(width: int) -> torch.Tensor:
    """Rows with nothing to sample: a NaN, a +inf, every logit -inf, and one that overflows at temperature 1e-3."""
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(width))
    x[0, width // 2] = float("nan")
    x[1, width - 1] = float("inf")
    x[2] = float("-inf")
    x[3, 0] = 1e38
    return x


@pytest.mark.parametrize("width", WIDTHS)
def test_tempered_softmax_within_its_rounding_with_the_first_argmax_and_the_same_alone(width: int) -> None:
    x = torch.cat([_rows(width + 3, 4, width), _bad_rows(width)])
    top = x[0].max()
    x[0, -1] = top  # the max tied in the row's last chunk: its first index is earlier
    temperature = torch.tensor([1.0, 0.7, 2.5, 1.0, 1.0, 0.5, 1.0, 1e-3])
    got, argmax, finite = (t.cpu() for t in sample_rows_triton.tempered_softmax(x.to(DEVICE), temperature.to(DEVICE)))
    ref, ref_argmax, ref_finite = sample_rows.tempered_softmax(x, temperature)
    assert torch.equal(finite, ref_finite) and finite.tolist() == [True] * 4 + [False] * 4
    assert argmax.dtype == ref_argmax.dtype == torch.int32 and torch.equal(argmax[:4], ref_argmax[:4])
    assert torch.equal(got[4:], ref[4:]), "a row with nothing to sample is a one-hot at token 0"
    exact, bound = _softmax_bound(x[:4] / temperature[:4].unsqueeze(1))
    assert bool(((got[:4].double() - exact).abs() <= bound).all()), float((got[:4].double() - exact).abs().max())
    for r in range(x.shape[0]):
        alone = sample_rows_triton.tempered_softmax(x[r : r + 1].to(DEVICE), temperature[r : r + 1].to(DEVICE))
        assert torch.equal(alone[0].cpu()[0], got[r]) and alone[1].item() == argmax[r].item(), f"row {r}"


@pytest.mark.parametrize("width", WIDTHS)
def test_min_p_renorm_keeps_the_reference_tokens_within_its_rounding_and_the_same_alone(width: int) -> None:
    probs = _rows(width + 4, 4, width).softmax(dim=-1)
    min_p = torch.tensor([0.0, 0.05, 0.5, 1.0])
    top = probs.amax(dim=-1)
    got, mass = (t.cpu() for t in sample_rows_triton.min_p_renorm(probs.to(DEVICE), min_p.to(DEVICE), top.to(DEVICE)))
    kept = probs >= (min_p * top).unsqueeze(1)
    assert torch.equal(got > 0, kept & (probs > 0))
    exact_mass = (probs.double() * kept).sum(dim=-1)
    assert bool(((mass.double() - exact_mass).abs() <= summation_bound(exact_mass, width, torch.float32)).all())
    exact = probs.double() * kept / exact_mass.unsqueeze(1)
    bound = 2 * summation_bound(exact, width, torch.float32) + rounding_bound(exact, torch.float32, 1)
    assert bool(((got.double() - exact).abs() <= bound).all()), float((got.double() - exact).abs().max())
    for r in range(4):
        alone, _ = sample_rows_triton.min_p_renorm(probs[r : r + 1].to(DEVICE), min_p[r : r + 1].to(DEVICE),
                                                   top[r : r + 1].to(DEVICE))
        assert torch.equal(alone.cpu()[0], got[r]), f"row {r}"


@pytest.mark.parametrize("width", WIDTHS)
def test_min_p_mask_drops_the_tokens_float64_drops_where_clear_and_the_same_alone(width: int) -> None:
    x = _rows(width + 5, 4, width)
    min_p = torch.tensor([0.3, 0.05, 0.0, 0.9])
    got = sample_rows_triton.min_p_mask(x.to(DEVICE), min_p.to(DEVICE)).cpu()
    exact, error = _softmax_bound(x)
    threshold = min_p.double().unsqueeze(1) * exact.amax(dim=-1, keepdim=True)
    clear = (exact - threshold).abs() > error + 2 * threshold * (width + 4) * unit_roundoff(torch.float32)
    dropped = got == float("-inf")
    assert torch.equal(dropped[clear], (exact < threshold)[clear])
    assert torch.equal(got[~dropped], x[~dropped]), "a kept token keeps its score"
    assert bool(clear[[0, 1, 3]].float().mean() > 0.9), "the cut is clear of rounding for most tokens"
    assert torch.equal(dropped[2], x[2] == float("-inf")), "min_p 0 drops nothing"
    for r in range(4):
        alone = sample_rows_triton.min_p_mask(x[r : r + 1].to(DEVICE), min_p[r : r + 1].to(DEVICE)).cpu()[0]
        assert torch.equal(alone, got[r]), f"row {r}"
