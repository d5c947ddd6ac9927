"""The Exp(1) noise of seeded rows, keyed by each row's seed alone (so a seeded row's tokens never depend on its
batch): Triton's Philox on CUDA, on the device and capturable (engine/sample_triton.py); elsewhere a generator per
row, which reads the seeds on the host."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .device import triton_kernels_run_on

NoiseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (noise, rows, seeds): fill those rows


def generator_noise_(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor) -> None:
    for row, seed in zip(rows.tolist(), seeds.tolist()):
        noise[row].exponential_(generator=torch.Generator(device=noise.device).manual_seed(seed))
        noise[row].clamp_(min=torch.finfo(noise.dtype).tiny)


def seeded_noise_for(device: torch.device) -> NoiseFn:
    if triton_kernels_run_on(device):
        from .sample_triton import seeded_noise_

        return seeded_noise_
    return generator_noise_
