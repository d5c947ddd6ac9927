"""The roofline (GPU): device bandwidth from a large device-to-device copy (read + write bytes), in the same run,
and per B the floor (weight bytes read + KV bytes read) / bandwidth against the engine's measured decode step.
"""

from __future__ import annotations

from typing import Any

import torch

from .contenders import ENGINE_EAGER, ENGINE_GRAPHS
from .grid import GridRow, contenders_by_batch
from .plan import Plan


def measure_bandwidth(device: torch.device, nbytes: int = 2 * 1024**3, reps: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write; best of 5 trials."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = max(best, 2 * src.numel() * reps / (start.elapsed_time(end) / 1e3))
    del src, dst
    torch.cuda.empty_cache()
    return best


def run_roofline(grid: dict[str, Any], plan: Plan, bandwidth: float) -> list[dict[str, Any]]:
    info = grid["engine"]
    # Decode step s (1 ≤ s < n) attends over prompt + s tokens; the grid's ms/step averages over those steps.
    mean_ctx = plan.prompt_len + plan.new_tokens / 2
    by_batch = contenders_by_batch([GridRow(**r) for r in grid["rows"]])
    out = []
    for b, rows in by_batch.items():
        best = rows.get(ENGINE_GRAPHS) or rows.get(ENGINE_EAGER)
        if best is None:  # both engine contenders were skipped
            continue
        kv = b * mean_ctx * info["kv_bytes_per_token"]
        floor_ms = (info["weight_bytes_read"] + kv) / bandwidth * 1e3
        out.append(
            {
                "batch": b,
                "method": best.method,
                "step_ms": best.ms_per_step,
                "floor_ms": floor_ms,
                "weight_bytes": info["weight_bytes_read"],
                "kv_bytes": kv,
                "step_over_floor": best.ms_per_step / floor_ms,
            }
        )
    return out
