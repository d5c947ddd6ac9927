"""The seeded sampler's stable full-vocabulary sort (engine/sample_rows.top_k_top_p_filter) by its float32 scores
against a stable sort of the 16-bit logits they were divided from (SortKeys; the same order and ties, docs/sampling.md
keys), alone and inside top-p's filter, and two untried variants (one 1-D sort of packed row + key words; the
division in one pass); the orders, values and kept tokens are compared on every call.

    python -m benchmarks.sort_keys [--json PATH]

Qwen3's vocabulary, bf16 logits N(0, 3^2) (many ties), temperature 0.8, top-p 0.9, one CUDA graph per call.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks.common import graph_us
from engine.sample_rows import SortKeys, row_passes_for, top_k_top_p_filter

VOCAB = 151936


def packed_keys(logits16: torch.Tensor) -> torch.Tensor:
    """int32 [bs, vocab]: the row above 16 order-preserving bits of each 16-bit logit (one sort orders every row)."""
    bits = logits16.view(torch.int16).int() & 0xFFFF
    ordered = torch.where(bits >= 0x8000, 0xFFFF - bits, bits | 0x8000)
    rows = torch.arange(logits16.shape[0], device=logits16.device, dtype=torch.int32).unsqueeze(1)
    return (rows << 16) | ordered


def _one_pass(logits16: torch.Tensor, temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, order = logits16.sort(dim=-1, stable=True)
    return torch.div(values, temperature.unsqueeze(1)), order  # bf16 / float32 computes in float32: the same bits


def run(bs: int) -> dict[str, float | bool]:
    gen = torch.Generator(device="cuda").manual_seed(bs)
    logits = (torch.randn(bs, VOCAB, device="cuda", generator=gen) * 3).to(torch.bfloat16).float()
    temperature = torch.full((bs,), 0.8, device="cuda")
    scores = logits / temperature.unsqueeze(1)
    top_p = torch.full((bs,), 0.9, device="cuda", dtype=torch.float64)
    passes = row_passes_for(scores.device)
    want_values, want_order = scores.sort(dim=-1, stable=True)
    values, order = SortKeys(logits.to(torch.bfloat16), temperature).ascending()
    filtered = top_k_top_p_filter(scores, None, top_p, passes)
    same = torch.equal(order, want_order) and torch.equal(values, want_values)
    same = same and torch.equal(_one_pass(logits.to(torch.bfloat16), temperature)[0], want_values)
    same = same and torch.equal(filtered, top_k_top_p_filter(scores, None, top_p, passes,
                                                             SortKeys(logits.to(torch.bfloat16), temperature)))
    packed_order = packed_keys(logits.to(torch.bfloat16)).view(-1).sort(stable=True).indices.view(bs, -1) % VOCAB
    same = same and torch.equal(packed_order, want_order)
    return {
        "float32 scores": graph_us(lambda: scores.sort(dim=-1, stable=True)),
        "packed int32 keys, one 1-D sort": graph_us(
            lambda: packed_keys(logits.to(torch.bfloat16)).view(-1).sort(stable=True)),
        "SortKeys with one division pass": graph_us(lambda: _one_pass(logits.to(torch.bfloat16), temperature)),
        "bf16 logits": graph_us(lambda: logits.to(torch.bfloat16).sort(dim=-1, stable=True)),
        "bf16 logits + gather": graph_us(lambda: scores.gather(1, logits.to(torch.bfloat16).sort(
            dim=-1, stable=True).indices)),
        "SortKeys (cast, sort, divide)": graph_us(lambda: SortKeys(logits.to(torch.bfloat16), temperature).ascending()),
        "filter, float32 sort": graph_us(lambda: top_k_top_p_filter(scores, None, top_p, passes)),
        "filter, SortKeys": graph_us(lambda: top_k_top_p_filter(scores, None, top_p, passes,
                                                                SortKeys(logits.to(torch.bfloat16), temperature))),
        "same order and kept tokens": bool(same),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = {bs: run(bs) for bs in (1, 8, 64, 256)}
    for bs, row in rows.items():
        print(bs, {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
