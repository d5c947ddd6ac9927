"""Tensor parallelism on CPU: two gloo ranks hold half the heads and half the MLP each, and must produce the
same logits (within fp32 reassociation of the row-parallel sums) and the same greedy tokens as one rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from engine import ConfigError, Engine, EngineConfig, SamplingParams, TPInfo
from engine.distributed.tp import shard_config
from engine.driver import StaticDriver
from engine.models import get_model_class, load_weights
from oracle.checks import assert_logits_close
from oracle.ranks import run_ranks
from oracle.tolerance import logit_tolerance

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8], [1, 6, 1, 8, 0, 3, 3, 9, 8, 8, 7]]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)
# Splitting a sum over ranks changes fp32 rounding only: the harness's fp32 bound holds.
TOL = logit_tolerance(torch.float32)


def _config(model: Path, tp: TPInfo, port: int = 29500) -> EngineConfig:
    return EngineConfig(
        str(model), tp_info=tp, device="cpu", page_size=4, num_page_override=64, distributed_port=port
    )


def _generate(engine: Engine) -> list[tuple[list[int], torch.Tensor]]:
    gens = StaticDriver(engine, record_logits=True).generate(PROMPTS, PARAMS)
    return [(g.output_ids, torch.stack(g.logits)) for g in gens]


def _qkv_rows(engine: Engine) -> int:
    return engine.model.get_parameter("model.layers.0.self_attn.qkv_proj.weight").shape[0]


def _rank_main(rank: int, port: int, model: str, out: mp.Queue) -> None:
    engine = Engine(_config(Path(model), TPInfo(rank, 2), port), sampler_seed=0)
    shapes = (engine.kv_cache.num_kv_heads, _qkv_rows(engine))
    # Logits as lists: a tensor would travel as a file descriptor that dies with this process (a flaky receive).
    out.put((rank, (shapes, [(tokens, logits.tolist()) for tokens, logits in _generate(engine)])))
    engine.shutdown()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_two_ranks_match_one(arch: str, tiny_models: dict[str, Path]) -> None:
    model = tiny_models[arch]
    single = Engine(_config(model, TPInfo()), sampler_seed=0)
    expected = _generate(single)
    full_qkv = _qkv_rows(single)
    single.shutdown()

    results = run_ranks(_rank_main, 2, str(model))
    for rank, ((kv_heads, qkv_rows), gens) in results.items():
        assert kv_heads == 1 and qkv_rows == full_qkv // 2, f"rank {rank} does not hold half the heads"
        for (tokens, logits), (want_tokens, want_logits) in zip(gens, expected):
            assert tokens == want_tokens
            assert_logits_close(torch.tensor(logits), want_logits, TOL, f"rank {rank}")


def test_tp_size_must_divide_the_heads(tiny_models: dict[str, Path]) -> None:
    model = tiny_models["llama"]  # 4 query heads, 2 KV heads
    with pytest.raises(ConfigError, match="num_key_value_heads=2"):
        Engine(_config(model, TPInfo(0, 4)))


def test_each_parallel_layer_loads_its_rank_slice(tiny_models: dict[str, Path]) -> None:
    """Rank 1 of 2: the merged column-parallel layers hold the second half of q, k, v, gate and up (rows), the
    row-parallel ones the second half of o_proj and down_proj (columns); the rest is whole. No process group is
    needed: the layers cut their slices themselves (engine/layers/linear.py)."""
    model_dir = tiny_models["qwen2"]  # q/k/v biases too
    cfg = shard_config(EngineConfig(str(model_dir), device="cpu").model_config, TPInfo(1, 2))
    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg, None)
    model = model.to_empty(device="cpu")
    load_weights(model, model_dir, cfg.tie_word_embeddings)
    full = load_file(str(model_dir / "model.safetensors"))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q, k, v = (full[f"model.layers.0.self_attn.{p}_proj.weight"].chunk(2, 0)[1] for p in "qkv")
    assert torch.equal(attn.qkv_proj.weight, torch.cat([q, k, v]).to(attn.qkv_proj.weight.dtype))
    bias = torch.cat([full[f"model.layers.0.self_attn.{p}_proj.bias"].chunk(2, 0)[1] for p in "qkv"])
    assert torch.equal(attn.qkv_proj.bias, bias.to(attn.qkv_proj.bias.dtype))
    gate, up = (full[f"model.layers.0.mlp.{p}_proj.weight"].chunk(2, 0)[1] for p in ("gate", "up"))
    assert torch.equal(mlp.gate_up_proj.weight, torch.cat([gate, up]).to(mlp.gate_up_proj.weight.dtype))
    for layer, name in ((attn.o_proj, "self_attn.o_proj"), (mlp.down_proj, "mlp.down_proj")):
        want = full[f"model.layers.0.{name}.weight"].chunk(2, 1)[1]
        assert torch.equal(layer.weight, want.to(layer.weight.dtype))
    embed = full["model.embed_tokens.weight"]
    assert torch.equal(model.model.embed_tokens.weight, embed.to(model.model.embed_tokens.weight.dtype))
