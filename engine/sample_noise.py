"""The Exp(1) noise of seeded rows, keyed by step_seed(seed, position) alone (so a seeded row's tokens never depend on
its batch): Triton's Philox on CUDA, on the device and capturable, the key mixed there too (engine/sample_triton.py);
elsewhere a generator per row, keyed on the host."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .device import triton_kernels_run_on

# (noise, rows, seeds, positions): fill noise[rows[i]] with the numbers of step_seed(seeds[i], positions[i])
NoiseFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
# (probs, seeds, positions): the race argmax(probs / noise) per row, row i's noise keyed by (seeds[i], positions[i])
RaceFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_SEED_MIX = 0x9E3779B97F4A7C15


def step_seed(seed: int, position: int) -> int:
    """A generator seed for (request seed, position), splitmix64-mixed: torch's CPU generator keeps only 32 bits."""
    x = (seed * _SEED_MIX + position) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % 2**63


def generator_noise_(noise: torch.Tensor, rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> None:
    for row, seed, position in zip(rows.tolist(), seeds.tolist(), positions.tolist()):
        generator = torch.Generator(device=noise.device).manual_seed(step_seed(seed, position))
        noise[row].exponential_(generator=generator)
        noise[row].clamp_(min=torch.finfo(noise.dtype).tiny)


def seeded_noise_for(device: torch.device) -> NoiseFn:
    if triton_kernels_run_on(device):
        from .sample_triton import seeded_noise_

        return seeded_noise_
    return generator_noise_


def generator_race(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    noise = torch.empty_like(probs)
    generator_noise_(noise, torch.arange(probs.shape[0], device=probs.device), seeds, positions)
    return (probs / noise).argmax(dim=-1)


def seeded_race_for(device: torch.device) -> RaceFn:
    if triton_kernels_run_on(device):
        from .sample_triton import seeded_race

        return seeded_race
    return generator_race
