"""The key-count filter (engine/sample_keys_triton.py) against oracle.sampler's reference on every row, and each
row's bits the same alone as in its batch (the seeded contract), at widths on both sides of the row passes' chunks,
for bf16 and fp16 logits with ties, -inf entries and zeros of both signs. On CUDA by default;
KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from gpu_support import KERNEL_DEVICE as DEVICE  # noqa: E402
from gpu_support import needs_kernel_device  # noqa: E402

from engine import SamplingParams, sample_keys_triton  # noqa: E402
from engine.sample_rows_triton import CHUNK  # noqa: E402
from oracle.checks import check_filtered_distribution  # noqa: E402
from oracle.sampler import reference_distribution  # noqa: E402

pytestmark = needs_kernel_device
WIDTHS = [2, 17, CHUNK - 1, CHUNK + 1, 2 * CHUNK + 300]
PARAMS = (
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.5, min_p=0.05),
    SamplingParams(temperature=1.7, top_p=0.99),
    SamplingParams(temperature=0.5, top_k=3, min_p=0.2),
)


def _rows(seed: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussians of several spreads rounded to dtype: one with many ties, one a third -inf (never its max), one of
    zeros of both signs beside a few larger values."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, width, generator=gen) * torch.tensor([[1.0], [8.0], [30.0], [3.0]])
    x[1] = (x[1] * 2).round() / 2
    x[2, torch.rand(width, generator=gen) < 0.3] = float("-inf")
    x[2, -1] = 5.0
    x[3] = torch.where(torch.rand(width, generator=gen) < 0.8, x[3] * 0.0, x[3])
    return x.to(dtype).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", WIDTHS)
def test_key_counts_give_the_reference_distribution_and_each_rows_bits_alone(width: int, dtype: torch.dtype) -> None:
    x = _rows(width, width, dtype)
    temperature = torch.tensor([p.temperature for p in PARAMS])
    top_k = torch.tensor([p.top_k if 0 < p.top_k < width else width for p in PARAMS])
    top_p = torch.tensor([p.top_p for p in PARAMS], dtype=torch.float64)
    min_p = torch.tensor([p.min_p for p in PARAMS])

    def filtered(rows: slice) -> torch.Tensor:
        return sample_keys_triton.filtered_probs_by_keys(
            x[rows].to(DEVICE), temperature[rows].to(DEVICE), top_k[rows].to(DEVICE), top_p[rows].to(DEVICE),
            min_p[rows].to(DEVICE), dtype).cpu()

    got = filtered(slice(None))
    for r, params in enumerate(PARAMS):
        why = check_filtered_distribution(got[r], reference_distribution(x[r], params))
        assert why is None, f"row {r}, {params}: {why}"
        assert torch.equal(filtered(slice(r, r + 1))[0], got[r]), f"row {r}: other bits alone than in the batch"
