"""An example plugin: one's own token sampler, registered by name and checked by the sampling properties.

It subclasses the reference Sampler and overrides the hook that sets what each row draws from, filtered_probs
(engine.sample.BaseSampler states the interface). With ``$EXAMPLE_SAMPLER_BUG`` set (to anything but ``0`` or
empty) the temperature is applied twice, logits / T**2, the kind of slip a fused kernel makes when its caller
has already divided. Check it clean, then with the bug::

    pytest properties/test_op_sampler.py --plugin examples.my_sampler --target cpu-fp32,sampler=example
    EXAMPLE_SAMPLER_BUG=1 pytest properties/test_op_sampler.py --plugin examples.my_sampler \\
        --target cpu-fp32,sampler=example

The flag is read when the sampler is built, so each engine keeps the behaviour it was built with.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from engine import SAMPLERS
from engine.sample import BatchSamplingArgs, Sampler

BUG_ENV = "EXAMPLE_SAMPLER_BUG"


class ExampleSampler(Sampler):
    def __init__(self, device: torch.device, vocab_size: int, seed: int | None) -> None:
        super().__init__(device, vocab_size, seed, use_flashinfer=False)
        self.bug = os.environ.get(BUG_ENV, "0") not in ("", "0")

    def filtered_probs(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        if self.bug:
            args = dataclasses.replace(args, temperature=args.temperature.square())
        return super().filtered_probs(logits, args)


# replace=True: importing the plugin twice (pytest and verify in one process) re-registers the same sampler.
SAMPLERS.register("example", lambda device, vocab, seed: ExampleSampler(device, vocab, seed), replace=True)
