"""F.linear with the weight row-major ([out, in] contiguous, HF's layout) against column-major (a transposed view of
a contiguous [in, out]) for the Qwen3-0.6B projection shapes, each timed inside a CUDA graph of 50 calls.

    python -m benchmarks.gemv_layouts

Prints µs per call per batch size and whether the two layouts give bitwise equal products (the measurement behind
engine/layers/linear.py's column-major narrowing weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.common import graph_us

SHAPES = {"qkv": (4096, 1024), "o_proj": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
CALLS, REPLAYS = 50, 10


def us_per_call(x: torch.Tensor, weight: torch.Tensor) -> float:
    return graph_us(lambda: [F.linear(x, weight) for _ in range(CALLS)], REPLAYS) / CALLS


def main() -> None:
    for m in (1, 8, 64, 256):
        parts = []
        for name, (out, inp) in SHAPES.items():
            row = torch.randn(out, inp, device="cuda", dtype=torch.bfloat16)
            col = row.t().contiguous().t()
            x = torch.randn(m, inp, device="cuda", dtype=torch.bfloat16)
            same = " (bitwise equal)" if torch.equal(F.linear(x, row), F.linear(x, col)) else ""
            parts.append(f"{name} row {us_per_call(x, row):.1f} col {us_per_call(x, col):.1f} us{same}")
        print(f"M={m}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
