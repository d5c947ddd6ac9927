"""The B 1 greedy step's graph with the one-row GEMV blocks and the Triton decode's warps, splits and tile varied:
each variant builds an engine of the cuda-bf16 target (attention=triton, the benchmark model's shape, dummy weights),
decodes at the given context and reports the graph's device time and one layer's kernels with the µs each adds
(common.graph_critical_path), the variants alternating over rounds. Kernel blocks are tuned here in the chain of
launches they run in: under programmatic dependent launch a block that wins alone can lose there.

    python -m benchmarks.chain_blocks [--rounds 2] [--context 640] [--json PATH] [VARIANT ...]

A VARIANT is JSON: {"gemv": {"N,K": [BLOCK_N, warps], ...}, "decode_warps": W, "decode_splits": S, "decode_tile": T},
each key optional; the engine's own blocks run first in every round. The measurement behind triton_gemv.ONE_ROW_BLOCKS
(benchmarks/RESULTS.md, issue #26's eighteenth part).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    DecodeStep,
    benchmark_target,
    build_engine,
    graph_critical_path,
    graph_device_ms,
    model_for,
    write_record,
)


@contextmanager
def blocks(variant: dict[str, Any]) -> Iterator[None]:
    """ONE_ROW_BLOCKS with the variant's entries, and the decode's warps, splits and tile as it says, for the
    duration."""
    from engine.attention import triton_decode  # triton: CUDA builds only
    from engine.layers import triton_gemv

    table = dict(triton_gemv.ONE_ROW_BLOCKS)
    decode = {name: getattr(triton_decode, name) for name in ("NUM_WARPS", "choose_splits", "block_n")}
    for shape, (block_n, warps) in variant.get("gemv", {}).items():
        n, k = (int(v) for v in shape.split(","))
        triton_gemv.ONE_ROW_BLOCKS[n, k] = (block_n, warps)
    triton_decode.NUM_WARPS = variant.get("decode_warps", triton_decode.NUM_WARPS)
    if "decode_splits" in variant:
        triton_decode.choose_splits = lambda *args: int(variant["decode_splits"])  # type: ignore[assignment]
    if "decode_tile" in variant:
        triton_decode.block_n = lambda group, head_dim: int(variant["decode_tile"])  # type: ignore[assignment]
    try:
        yield
    finally:
        triton_gemv.ONE_ROW_BLOCKS.clear()
        triton_gemv.ONE_ROW_BLOCKS.update(table)
        for name, value in decode.items():
            setattr(triton_decode, name, value)


def measure(variant: dict[str, Any], context: int) -> dict[str, Any]:
    target = benchmark_target("cuda-bf16,attention=triton", "cuda")
    with blocks(variant):
        engine = build_engine(target, model_for(target), max_running_req=1, kv_tokens=context + 512, graph_bs=[1],
                              max_seq_len=context + 512)
        try:
            step = DecodeStep(engine, 1, context, seed=1)
            for _ in range(3):
                step.step()
            graph_ms = [graph_device_ms(engine, 1) for _ in range(3)]
            _, layer = graph_critical_path(engine, 1)
        finally:
            engine.shutdown()
    torch.cuda.empty_cache()
    return {"variant": variant, "graph_ms": graph_ms, "layer": layer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", type=json.loads, help="JSON variants (see the module docstring)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (and triton)")
    results = []
    for round_ in range(args.rounds):
        for variant in [{}, *args.variants]:
            row = measure(variant, args.context)
            layer = " ".join(f"{k['us']:.2f}" for k in row["layer"])
            print(f"round {round_} {json.dumps(variant)}: graph {min(row['graph_ms']):.4f} ms | layer µs {layer}",
                  flush=True)
            results.append({"round": round_, **row})
    if args.json:
        write_record(args.json, "benchmarks.chain_blocks", results)


if __name__ == "__main__":
    main()
