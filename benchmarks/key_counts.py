"""The seeded sampler's filter (Sampler.filtered_probs: top-k, top-p, min-p, softmax) on CUDA by the stable float32
sort and by the counts of the logits' 16-bit keys (engine.sample_keys_triton, docs/sampling.md keys), one CUDA graph
per call, with the tokens each keeps compared on every call, and the key-count path's kernels profiled; then the
seeded race over those probabilities, written noise + division + argmax against engine.sample_triton.seeded_race,
their tokens compared.

    python -m benchmarks.key_counts [--json PATH]

Qwen3's vocabulary, bf16 logits N(0, 3^2) (many ties), the benchmark grid's mixed filters (benchmarks.common
MIXED_PARAMS, greedy rows as T = 1 rows) row by row.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import MIXED_PARAMS, graph_us
from engine import sample_triton
from engine.sample import BatchSamplingArgs, Sampler
from oracle.environment import git_commit

VOCAB = 151936


def _args(bs: int, with_min_p: bool) -> BatchSamplingArgs:
    params = [MIXED_PARAMS[i % len(MIXED_PARAMS)] for i in range(bs)]

    def col(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device="cuda")

    return BatchSamplingArgs(
        False, col([False] * bs, torch.bool), col([p.temperature or 1.0 for p in params], torch.float32),
        col([p.top_k if 0 < p.top_k < VOCAB else VOCAB for p in params], torch.int64), VOCAB,
        col([p.top_p for p in params], torch.float64), col([p.min_p for p in params], torch.float32)
        if with_min_p else None, [None] * bs)


def run(bs: int) -> dict[str, object]:
    gen = torch.Generator(device="cuda").manual_seed(bs)
    logits = (torch.randn(bs, VOCAB, device="cuda", generator=gen) * 3).to(torch.bfloat16).float()
    by_sort = Sampler(torch.device("cuda"), VOCAB, 0, use_flashinfer=False)
    by_keys = Sampler(torch.device("cuda"), VOCAB, 0, use_flashinfer=False)
    by_keys.declare_logits_dtype(torch.bfloat16)
    row: dict[str, object] = {}
    for name, with_min_p in (("with min-p", True), ("without min-p", False)):
        args = _args(bs, with_min_p)
        want, got = by_sort.filtered_probs(logits, args), by_keys.filtered_probs(logits, args)
        row[f"{name}: tokens kept by one path only"] = int(((want > 0) != (got > 0)).sum())
        row[f"{name}: tokens kept"] = int((want > 0).sum())
        row[f"{name}: float32 sort us"] = graph_us(lambda: by_sort.filtered_probs(logits, args))  # noqa: B023
        row[f"{name}: key counts us"] = graph_us(lambda: by_keys.filtered_probs(logits, args))  # noqa: B023
    args = _args(bs, True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            by_keys.filtered_probs(logits, args)
        torch.cuda.synchronize()
    row["key counts: device us per kernel"] = {e.key[:48]: round(e.device_time_total / 10, 1)
                                               for e in prof.key_averages() if e.device_time_total > 0}
    row.update(_race(by_keys.filtered_probs(logits, args)))
    return row


def _race(probs: torch.Tensor) -> dict[str, object]:
    bs = probs.shape[0]
    seeds = torch.arange(bs, device="cuda") * 7919 + 1
    positions = torch.arange(bs, device="cuda") + 512
    rows = torch.arange(bs, device="cuda")

    def written() -> torch.Tensor:
        noise = torch.empty_like(probs)
        sample_triton.seeded_noise_(noise, rows, seeds, positions)
        return (probs / noise).argmax(dim=-1)

    def fused() -> torch.Tensor:
        return sample_triton.seeded_race(probs, seeds, positions)

    return {
        "race: rows drawing another token": int((written() != fused()).sum()),
        "race: noise + division + argmax us": graph_us(written),
        "race: seeded_race us": graph_us(fused),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = {bs: run(bs) for bs in (1, 8, 64, 256)}
    for bs, row in rows.items():
        print(bs, json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "commit": git_commit(), "us_per_call": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
