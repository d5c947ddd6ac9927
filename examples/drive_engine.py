"""Drive the engine by hand, with no scheduler: page-table rows, KV pages, one prefill, then decode steps.

Compares each prompt's greedy text with HF `generate` on the same model dir.

    python examples/drive_engine.py [--model DIR] [--max-tokens N] [--page-size P]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from engine import Engine, EngineConfig, EngineError, ModelLoadError, Req, SamplingParams
from engine.core import Phase
from oracle.cli import int_in
from oracle.hf import HFOracle
from oracle.zoo import ModelBuildError

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The three primary colors are",
]


# Any of these makes a loadable tokenizer; without them transformers 5 quietly builds an empty one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    if not any((Path(model_dir) / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{model_dir!r} has no tokenizer ({', '.join(TOKENIZER_FILES)}); the demo needs one to encode its "
            "prompts: save it into the dir with tokenizer.save_pretrained(dir)"
        )
    return AutoTokenizer.from_pretrained(model_dir)


def allocate_slots(engine: Engine, req: Req, free_pages: list[int], upto: int) -> None:
    """Map the request's positions [0, upto) to KV slots, taking pages from the free list as needed."""
    page_size = engine.config.page_size
    row = engine.page_table[req.table_idx]
    have = req.cache_handle or []
    while len(have) * page_size < upto:
        page = free_pages.pop(0)
        start = len(have) * page_size
        row[start : start + page_size] = page * page_size + torch.arange(page_size, dtype=torch.int32)
        have.append(page)
    req.cache_handle = have


def run(model_dir: str, max_tokens: int, page_size: int) -> bool:
    tokenizer = load_tokenizer(model_dir)
    engine = Engine(EngineConfig(model_dir, page_size=page_size, max_running_req=len(PROMPTS)))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    free_pages = list(range(engine.num_pages))
    reqs = [
        Req(tokenizer.encode(p), i, 0, max_tokens, i, params)
        for i, p in enumerate(PROMPTS)
    ]
    # Prefill: every prompt in one batch.
    for req in reqs:
        allocate_slots(engine, req, free_pages, req.device_len)
    phase: Phase = "prefill"
    for _ in range(max_tokens):
        batch, args = engine.prepare_batch(reqs, phase)
        out = engine.forward_batch(batch, args)  # complete_one() ran: device_len now counts the new token
        out.copy_done_event.synchronize()
        for req, token in zip(reqs, out.next_tokens_cpu):
            req.append_host(token)
            allocate_slots(engine, req, free_pages, req.device_len)
        phase = "decode"
    oracle = HFOracle(model_dir, dtype=torch.float32)
    all_match = True
    for prompt, req in zip(PROMPTS, reqs):
        prompt_len = req.max_device_len - max_tokens
        ours = req.token_ids[prompt_len:]
        hf = oracle.greedy(req.token_ids[:prompt_len], max_tokens)
        match = ours == hf
        all_match &= match
        print(f"prompt: {prompt!r}")
        print(f"  engine: {tokenizer.decode(ours)!r}")
        print(f"  HF    : {tokenizer.decode(hf)!r}")
        print(f"  matches HF: {match}")
    engine.shutdown()
    return all_match


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model dir (default: SmolLM2-135M-Instruct, built on first use)")
    parser.add_argument("--max-tokens", type=int_in(1), default=24)
    parser.add_argument("--page-size", type=int_in(1), default=4)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args()
    try:
        if args.model is None:
            from oracle.zoo import smollm2_dir

            args.model = str(smollm2_dir())
        return 0 if run(args.model, args.max_tokens, args.page_size) else 1
    except (EngineError, ModelBuildError, OSError, ValueError) as e:
        if args.debug:
            raise
        message = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = e.hint if isinstance(e, ModelBuildError) else "run with --debug for a traceback"
        print(f"error: {message}\nhint: {hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
