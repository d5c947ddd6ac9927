"""Run a benchmark module with more small-batch routes: attention backends `triton_all` (the triton hybrid with every
decode batch on Triton's paged decode) and `triton_N` (decode batches up to N padded rows on it, N in DECODE_CAPS),
and the GEMV's and the skinny GEMM's row caps set for the run. The measurement behind DECODE_MAX_BS and GEMV_MAX_ROWS
(benchmarks/RESULTS.md, issue #26's eleventh part):

    python -m benchmarks.decode_on_triton [--gemv-max-rows N] [--gemm-max-rows N] benchmarks.profile_step --device cuda
        --set attention_backend=triton_all
"""

from __future__ import annotations

import argparse
import runpy
import sys

from benchmarks.skinny_gemm import routed
from engine.attention import ATTENTION_BACKENDS, Hybrid, Route, TritonDecodeBackend

DECODE_CAPS = (1, 2, 4, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gemv-max-rows", type=int, help="engine.layers.triton_gemv.GEMV_MAX_ROWS for the run")
    parser.add_argument("--gemm-max-rows", type=int, help="engine.layers.triton_gemm.GEMM_MAX_ROWS for the run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the benchmark module to run, then its arguments")
    args = parser.parse_args()
    if not args.command:
        parser.error("name the benchmark module to run")
    ATTENTION_BACKENDS.register("triton_all", Hybrid("triton_all", TritonDecodeBackend, (Route("flashinfer", None),)))
    for cap in DECODE_CAPS:
        name = f"triton_{cap}"
        ATTENTION_BACKENDS.register(name, Hybrid(name, TritonDecodeBackend, (Route("flashinfer", cap),)))
    sys.argv = args.command
    with routed(args.gemv_max_rows, args.gemm_max_rows):
        runpy.run_module(args.command[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
