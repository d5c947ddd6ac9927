"""The seeded rows' Triton noise (engine/sample_triton.py): its in-kernel step_seed is the host's, bit for bit, over the
whole seed range and large positions, and a row's numbers are those of tl.rand at that key, wherever the row sits.
On CUDA by default; KERNEL_TEST_DEVICE=cpu with TRITON_INTERPRET=1 runs it in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from gpu_support import KERNEL_DEVICE as DEVICE  # noqa: E402
from gpu_support import needs_kernel_device  # noqa: E402

from engine import sample_triton  # noqa: E402
from engine.sample_noise import step_seed  # noqa: E402

pytestmark = needs_kernel_device
VOCAB = 3000  # past two noise blocks
SEEDS = [0, 1, 7, 2**31 - 1, 2**31, 2**32 + 5, 2**62 + 12345, 2**63 - 1]
POSITIONS = [0, 1, 3, 640, 2**31 - 1, 2**31 + 1, 2**40]


@triton.jit
def _step_seeds_kernel(seeds_ptr, positions_ptr, out_ptr):
    i = tl.program_id(0)
    tl.store(out_ptr + i, sample_triton.step_seed(tl.load(seeds_ptr + i), tl.load(positions_ptr + i)))


@triton.jit
def _rand_kernel(keys_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    u = tl.rand(tl.load(keys_ptr + i), cols)
    tl.store(out_ptr + i * vocab + cols, tl.maximum(-tl.log(u), 1.1754943508222875e-38), mask=cols < vocab)


def test_the_kernels_step_seed_is_the_hosts() -> None:
    pairs = [(s, p) for s in SEEDS for p in POSITIONS]
    seeds = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=DEVICE)
    positions = torch.tensor([p for _, p in pairs], dtype=torch.int64, device=DEVICE)
    out = torch.empty_like(seeds)
    _step_seeds_kernel[(len(pairs),)](seeds, positions, out)
    assert out.tolist() == [step_seed(s, p) for s, p in pairs]


def test_seeded_noise_is_tl_rand_at_the_stepped_key_wherever_the_row_is() -> None:
    """Rows 3 and 0 of a 4-row buffer get the numbers of their keys; the rows not named keep theirs; a key differing in
    its position alone gives other numbers."""
    seeds, positions = [2**63 - 1, 5], [700, 2**31 + 1]
    noise = torch.full((4, VOCAB), -1.0, device=DEVICE)
    sample_triton.seeded_noise_(noise, torch.tensor([3, 0], device=DEVICE), torch.tensor(seeds, device=DEVICE),
                                torch.tensor(positions, device=DEVICE))
    keys = torch.tensor([step_seed(s, p) for s, p in zip(seeds, positions)], device=DEVICE)
    expected = torch.empty(2, VOCAB, device=DEVICE)
    _rand_kernel[(2, triton.cdiv(VOCAB, 1024))](keys, expected, VOCAB, BLOCK=1024)
    assert torch.equal(noise[3], expected[0]) and torch.equal(noise[0], expected[1])
    assert bool((noise[1:3] == -1.0).all())
    moved = torch.empty(1, VOCAB, device=DEVICE)
    sample_triton.seeded_noise_(moved, torch.tensor([0], device=DEVICE), torch.tensor(seeds[:1], device=DEVICE),
                                torch.tensor([positions[0] + 1], device=DEVICE))
    assert not torch.equal(moved[0], noise[3])


def test_seeded_race_is_the_argmax_of_probs_over_the_written_noise() -> None:
    """The fused race (engine/sample_triton.seeded_race) picks what (probs / noise).argmax picks with seeded_noise_'s
    numbers, over nine chunks of its block, zeros included; of exact ties (p = noise x 2**-20 divides back exactly)
    the first column wins, across chunks and inside one."""
    block = sample_triton.RACE_BLOCK
    vocab = 8 * block + 5
    seeds = torch.tensor(SEEDS[:6], device=DEVICE)
    positions = torch.tensor(POSITIONS[:6], device=DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(11)
    probs = torch.rand(6, vocab, generator=generator, device=DEVICE)
    probs[probs < 0.7] = 0.0
    probs[2] = 0.0
    probs[2, vocab - 1] = 1.0  # the one live token in the last chunk's tail
    noise = torch.empty(6, vocab, device=DEVICE)
    sample_triton.seeded_noise_(noise, torch.arange(6, device=DEVICE), seeds, positions)
    for row, (first, second) in ((3, (2 * block + 10, vocab - 2)), (4, (4 * block + 4, 4 * block + 104))):
        probs[row] = noise[row] * 2.0**-22
        probs[row, first] = noise[row, first] * 2.0**-20
        probs[row, second] = noise[row, second] * 2.0**-20
    expected = (probs / noise).argmax(dim=-1)
    assert expected[2] == vocab - 1 and expected[3] == 2 * block + 10 and expected[4] == 4 * block + 4
    assert torch.equal(sample_triton.seeded_race(probs, seeds, positions), expected)
