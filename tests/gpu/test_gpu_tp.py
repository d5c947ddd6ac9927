"""Tensor parallelism on two GPUs over NCCL: two ranks (cuda:0 and cuda:1, one process each, the GPU target's
backends) must generate what one GPU generates, greedy tokens equal up to the harness's near-tie rule and logits
within its bf16 bound. Skipped without two GPUs (issue #14 needs nvidia-h200-x2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from gpu_support import TOL, generate, gpu_engine, random_prompt

from engine import TPInfo
from oracle.checks import compare_greedy
from oracle.ranks import run_ranks
from oracle.target import Target

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
PROMPTS = [random_prompt(seed, length, 512) for seed, length in ((1, 9), (2, 17), (3, 33))]
MAX_TOKENS = 16


def _rank_main(rank: int, port: int, target: Target, model: str, out: mp.Queue) -> None:
    engine = gpu_engine(target, Path(model), device="auto", tp_info=TPInfo(rank, 2), distributed_port=port)
    graphs = engine.graph_runner.enabled
    gens = generate(engine, PROMPTS, MAX_TOKENS)
    # Lists, not tensors: a tensor would travel as a handle that dies with this process.
    out.put((rank, (str(engine.device.torch_device), graphs,
                    [(g.output_ids, torch.stack(g.logits).tolist()) for g in gens])))
    engine.shutdown()


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_two_gpus_generate_what_one_does(gpu_target: Target, wide_models: dict[str, Path], arch: str) -> None:
    wide_model = wide_models[arch]
    single = gpu_engine(gpu_target, wide_model)
    expected = generate(single, PROMPTS, MAX_TOKENS)
    graphs = single.graph_runner.enabled
    single.shutdown()
    ranks = run_ranks(_rank_main, 2, gpu_target, str(wide_model), timeout_s=300)
    for rank, (device, rank_graphs, gens) in ranks.items():
        assert device == f"cuda:{rank}" and rank_graphs == graphs
        for (tokens, logits), want in zip(gens, expected):
            rows = list(torch.tensor(logits))
            verdict = compare_greedy(tokens, rows, want.output_ids, want.logits, TOL)
            assert verdict.failure is None, f"rank {rank}: {verdict.failure}"
            same = verdict.compared if verdict.mismatch_at is None else verdict.mismatch_at + 1  # same inputs so far
            for step, (row, ref) in enumerate(zip(rows[:same], want.logits[:same])):
                err = (row - ref.float()).abs().max().item()
                assert err <= TOL.bound(ref), f"rank {rank}, step {step}: max |Δlogit| {err:.3g}"
