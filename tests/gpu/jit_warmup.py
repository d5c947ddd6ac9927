"""Compile FlashInfer's JIT modules the GPU tests use, all at once, before the suite runs.

Each module (paged prefill, paged decode, sampling) compiles on first use, one after another if the tests trigger
them; as three processes they compile side by side. The result lands in FlashInfer's cache (~/.cache/flashinfer),
which later runs reuse. Usage on a CUDA machine:

    python tests/gpu/jit_warmup.py [--head-dim 64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

PARTS = ("prefill", "decode", "sampling")


def warm(part: str, head_dim: int) -> None:
    import flashinfer

    dev = torch.device("cuda")
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=dev)
    one = torch.tensor([0, 1], dtype=torch.int32)
    page = torch.zeros(1, dtype=torch.int32, device=dev)
    last = torch.ones(1, dtype=torch.int32)
    kinds = {"q_data_type": torch.bfloat16, "kv_data_type": torch.bfloat16}
    if part == "prefill":  # also serves tensor-core decode, which runs the same kernels
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        wrapper.plan(one, one, page, last, 2, 2, head_dim, 1, causal=True, **kinds)
    elif part == "decode":
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        wrapper.plan(one, page, last, 4, 2, head_dim, 1, **kinds)
    else:
        probs = torch.full((2, 128), 1 / 128, device=dev)
        k = torch.full((2,), 8, dtype=torch.int32, device=dev)
        p = torch.full((2,), 0.9, device=dev)
        seed, offset = torch.zeros(1, dtype=torch.int64, device=dev), torch.zeros(1, dtype=torch.int64, device=dev)
        flashinfer.sampling.top_k_top_p_sampling_from_probs(
            probs, k, p, filter_apply_order="top_k_first", seed=seed, offset=offset
        )
        flashinfer.sampling.top_k_renorm_probs(probs, k)
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--part", choices=PARTS, help="compile one module in this process (used internally)")
    args = parser.parse_args()
    if args.part:
        warm(args.part, args.head_dim)
        return 0
    start = time.monotonic()
    procs = {
        part: subprocess.Popen([sys.executable, __file__, "--part", part, "--head-dim", str(args.head_dim)])
        for part in PARTS
    }
    failed = [part for part, proc in procs.items() if proc.wait() != 0]
    print(f"FlashInfer JIT warm-up: {time.monotonic() - start:.0f} s, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
