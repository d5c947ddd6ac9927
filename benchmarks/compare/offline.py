"""The offline workload (GPU), shaped like nano-vllm's bench: random requests of random input and output lengths,
EOS ignored, seed 0, through the static driver with a prefill token budget, once per sampling mode; total output
tokens/s.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from engine.driver import StaticDriver
from oracle.target import Target

from ..common import ModelChoice, build_engine, graphs_captured, random_prompts, timed
from .plan import Plan
from .sampling import GREEDY, request_params


def run_offline(
    target: Target, choice: ModelChoice, plan: Plan, log: Callable[[str], None], modes: tuple[str, ...] = (GREEDY,)
) -> list[dict[str, Any]]:
    """One run of the workload per sampling mode, on the same requests and engine."""
    gen = torch.Generator().manual_seed(0)
    count = plan.offline_requests
    in_lens = torch.randint(100, 1025, (count,), generator=gen).tolist()
    out_lens = torch.randint(100, 1025, (count,), generator=gen).tolist()
    engine = build_engine(target, choice, max_running_req=count, kv_tokens=None, max_seq_len=2048 + 1)
    vocab = engine.model_config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in in_lens]
    driver = StaticDriver(engine, max_prefill_tokens=plan.prefill_budget)
    warm = random_prompts(min(count, 16), 128, vocab, seed=1)  # JIT, graph pools, allocator growth
    out = []
    for mode in modes:
        driver.generate(warm, request_params(mode, [16] * len(warm)))
        results: list[Any] = []
        params = request_params(mode, out_lens)
        call = partial(driver.generate, prompts, params)
        seconds = timed(lambda out=results, run=call: out.extend(run()), target.torch_device)
        produced = sum(len(g.output_ids) for g in results)
        if produced != sum(out_lens):
            raise RuntimeError(f"the offline run ({mode}) produced {produced} tokens, expected {sum(out_lens)}")
        log(f"offline {mode}: {count} requests, {produced} output tokens in {seconds:.2f}s")
        out.append(
            {
                "sampling": mode,
                "requests": count,
                "input_tokens": sum(in_lens),
                "output_tokens": produced,
                "seconds": seconds,
                "output_tokens_per_s": produced / seconds,
                "prefill_budget": plan.prefill_budget,
                "graphs_captured": graphs_captured(engine),
            }
        )
    engine.shutdown()
    return out
