"""What one run measures: batch sizes, prompt and output lengths, rounds and the offline workload, per device."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Plan:
    batch_sizes: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    repeats: int
    offline_requests: int
    prefill_budget: int

    @staticmethod
    def for_device(device: torch.device, quick: bool) -> Plan:
        if device.type == "cuda":
            if quick:
                return Plan((1, 64), 512, 32, 1, 32, 16384)
            return Plan((1, 8, 64, 256), 512, 256, 3, 256, 16384)
        if quick:
            return Plan((1, 8), 64, 8, 1, 0, 0)
        return Plan((1, 8), 64, 32, 5, 0, 0)
