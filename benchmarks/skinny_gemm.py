"""The skinny split-K Triton GEMM (engine/layers/triton_gemm.py) against cuBLAS for the Qwen3-0.6B projection shapes:
per product, 28 distinct weights (a step's layers: more than L2 holds) in one CUDA graph, across column tiles and
split targets; then the layer's chain through TritonKernels (norm + qkv, o_proj, norm + gate_up, SiLU + down_proj),
routed four ways (the GEMV for narrowing products or not; the GEMM or cuBLAS for the rest).

    python -m benchmarks.skinny_gemm [--chain-only] [--json PATH]

The measurements behind GEMM_MAX_ROWS, gemm_tiles and GEMV_MAX_ROWS (benchmarks/RESULTS.md, issue #26's tenth and
eleventh parts).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from benchmarks.common import graph_us
from benchmarks.gemv_layouts import SHAPES
from engine.layers import triton_gemm, triton_gemv
from engine.layers.kernels import TritonKernels

LAYERS = 28


def per_product_us(run: Callable[[int], object]) -> float:
    return graph_us(lambda: [run(i) for i in range(LAYERS)]) / LAYERS


def sweep(m: int, n: int, k: int) -> dict[str, float]:
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(LAYERS)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    arrivals = torch.zeros(triton_gemm.MAX_TILES, dtype=torch.int32, device="cuda")
    row = {"cublas": per_product_us(lambda i: x @ weights[i].T)}
    for block_n in (32, 64, 128):
        for programs in (132, 264, 528):
            tiles = triton_gemm.gemm_tiles(m, n * 64 // block_n, k, programs)._replace(block_n=block_n)
            row[f"bn{block_n}_mp{programs}_s{tiles.splits}x{tiles.steps}"] = per_product_us(
                lambda i, t=tiles: triton_gemm.gemm(x, weights[i], None, arrivals, t)
            )
    return row


# (name, GEMV_MAX_ROWS, GEMM_MAX_ROWS): the GEMV takes single rows and narrowing products up to its rows, the GEMM
# the rows past those up to its own, cuBLAS the rest.
CHAIN_ROUTES = (
    ("default", triton_gemv.GEMV_MAX_ROWS, triton_gemm.GEMM_MAX_ROWS),
    ("gemv narrowing to 8 rows + cublas", 8, 0),
    ("gemm from 2 rows", 1, 64),
    ("cublas", 1, 0),
)


@contextmanager
def routed(gemv_rows: int | None, gemm_rows: int | None) -> Iterator[None]:
    """GEMV_MAX_ROWS and GEMM_MAX_ROWS set for the block (None: left as they are), then put back."""
    saved = triton_gemv.GEMV_MAX_ROWS, triton_gemm.GEMM_MAX_ROWS
    if gemv_rows is not None:
        triton_gemv.GEMV_MAX_ROWS = gemv_rows
    if gemm_rows is not None:
        triton_gemm.GEMM_MAX_ROWS = gemm_rows
    try:
        yield
    finally:
        triton_gemv.GEMV_MAX_ROWS, triton_gemm.GEMM_MAX_ROWS = saved


def chain(m: int, kernels: TritonKernels) -> float:
    hidden = SHAPES["qkv"][1]
    layers = [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
               for name, (n, k) in SHAPES.items()} for _ in range(LAYERS)]
    norm = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    h0, r0 = (torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def step() -> None:
        h, r = h0, r0
        for w in layers:
            qkv, r = kernels.norm_linear(h, r, norm, 1e-6, w["qkv"])
            o = kernels.linear(qkv[:, : SHAPES["o_proj"][1]].contiguous(), w["o_proj"])
            gate_up, r = kernels.norm_linear(o, r, norm, 1e-6, w["gate_up"])
            h = kernels.linear(gate_up, w["down"], gated=True)

    return graph_us(step) / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--chain-only", action="store_true", help="skip the per-product sweep")
    args = parser.parse_args()
    results: dict[str, object] = {"gpu": torch.cuda.get_device_name()}
    for m in () if args.chain_only else (16, 64):
        for name, (n, k) in SHAPES.items():
            row = sweep(m, n, k)
            best = min((v, c) for c, v in row.items() if c != "cublas")
            print(f"M={m} {name}: cuBLAS {row['cublas']:.2f} us, best {best[1]} {best[0]:.2f} us, "
                  f"gemm_tiles {triton_gemm.gemm_tiles(m, n, k)}")
            results[f"{m}/{name}"] = row
    kernels = TritonKernels()
    for m in (2, 3, 4, 6, 8, 9, 16, 32, 64):
        row = {}
        for name, gemv_rows, gemm_rows in CHAIN_ROUTES:
            with routed(gemv_rows, gemm_rows):
                row[name] = chain(m, kernels)
        print(f"layer chain M={m}, us a layer: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
        results[f"chain/{m}"] = row
    if args.json:
        with open(args.json, "x") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
