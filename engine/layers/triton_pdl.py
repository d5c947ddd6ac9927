"""Programmatic dependent launch (Hopper and later): a kernel launched with it may start while the kernel before it
drains. The contract every kernel here keeps: before ``pdl_wait`` it loads only what no kernel of the model's layers
writes (the weights; the step's own inputs, which plain launches before the first layer write; K/V of earlier steps),
and it reads its inputs and writes its outputs only after it; ``pdl_release`` lets the next one start. A layer kernel
starts only after every plain launch before the first layer has completed, since a PDL launch after a plain one waits
for it to end."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@triton.jit
def pdl_wait(ON: tl.constexpr):
    if ON:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(ON: tl.constexpr):
    if ON:
        tl.extra.cuda.gdc_launch_dependents()


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET=1) instead of compiling them."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def pdl_on(x: torch.Tensor) -> bool:
    """Whether kernels on x's device launch with PDL (never in Triton's interpreter, which has no such launch)."""
    if not x.is_cuda or interpreted():
        return False
    return _capable(x.device.index if x.device.index is not None else torch.cuda.current_device())
