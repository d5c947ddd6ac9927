"""Run a benchmark module with one more attention backend, `triton_all`: the triton hybrid with every decode batch on
Triton's paged decode (the registered `triton` takes only batches of one), to time that kernel at any batch size.

    python -m benchmarks.decode_on_triton benchmarks.profile_step --device cuda --set attention_backend=triton_all
"""

from __future__ import annotations

import runpy
import sys

from engine.attention import ATTENTION_BACKENDS, Hybrid, Route, TritonDecodeBackend


def main() -> None:
    ATTENTION_BACKENDS.register("triton_all", Hybrid("triton_all", TritonDecodeBackend, (Route("flashinfer", None),)))
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
