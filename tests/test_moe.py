"""Qwen3-MoE: HF parity of prefill logits and greedy tokens, both expert checkpoint formats, the torch MoE backend
against a per-token reference, the sparse/dense layer rule, and the errors of bad configs and checkpoints."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine import ConfigError, Engine, EngineConfig, ModelLoadError, SamplingParams
from engine.driver import PageLayout, StaticDriver
from engine.models import ModelConfig, get_model_class
from engine.models.qwen3_moe import SparseMoeBlock
from engine.moe import MOE_BACKENDS, TorchMoeBackend
from engine.registry import Where
from oracle.checks import assert_logits_close
from oracle.hf import HFOracle
from oracle.tolerance import logit_tolerance, summation_bound
from oracle.zoo import tiny_model_dir

# fp32 engine vs fp32 HF: the same math in a different op order, within the harness's fp32 bound.
TOL = logit_tolerance(torch.float32)
VOCAB = 512


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model: Path, page_size: int = 1, **kw: Any) -> Engine:
    return Engine(EngineConfig(str(model), page_size=page_size, num_page_override=256, max_running_req=4, **kw))


def _tensor_names(model_dir: Path) -> list[str]:
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return list(f.keys())  # noqa: SIM118  (safe_open is not a dict)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir("qwen3_moe", tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="module")
def fused_dir(moe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model saved in transformers 5's in-memory layout: one 3-D tensor per expert weight kind."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("moe-fused")
    AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).save_pretrained(out, save_original_format=False)
    return out


@pytest.fixture(scope="module", params=["per_expert", "fused"])
def moe_model(request: pytest.FixtureRequest, moe_dir: Path, fused_dir: Path) -> Path:
    return moe_dir if request.param == "per_expert" else fused_dir


def test_checkpoint_formats(moe_dir: Path, fused_dir: Path) -> None:
    """What transformers writes: per-expert 2-D tensors by default, fused 3-D ones with save_original_format=False."""
    per_expert = set(_tensor_names(moe_dir))
    for e in range(8):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.1.mlp.experts.{e}.{proj}.weight" in per_expert
    assert "model.layers.1.mlp.gate.weight" in per_expert
    assert not any(name.endswith("experts.gate_up_proj") for name in per_expert)
    fused = set(_tensor_names(fused_dir))
    assert {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"} <= fused
    assert not any(".experts.0." in name for name in fused)
    saved = json.loads((moe_dir / "config.json").read_text())
    assert saved["num_local_experts"] == 8  # transformers 5's spelling of num_experts
    assert ModelConfig.from_dir(moe_dir).num_experts == 8


def test_prefill_logits_match_hf(moe_model: Path) -> None:
    oracle = HFOracle(moe_model, dtype=torch.float32)
    engine = _engine(moe_model)
    prompts = [_prompt(s, n) for s, n in ((1, 1), (2, 7), (3, 33))]
    gens = StaticDriver(engine, record_logits=True).generate(prompts, SamplingParams(max_tokens=1))
    for prompt, gen in zip(prompts, gens):
        assert_logits_close(gen.logits[0], oracle.prefill_logits(prompt), TOL, f"prompt of {len(prompt)} tokens")
    engine.shutdown()


@pytest.mark.parametrize("page_size,layout", [(1, PageLayout()), (4, PageLayout("shuffled", 7))])
def test_greedy_matches_hf_generate(moe_dir: Path, page_size: int, layout: PageLayout) -> None:
    oracle = HFOracle(moe_dir, dtype=torch.float32)
    engine = _engine(moe_dir, page_size)
    prompts = [_prompt(10 + i, n) for i, n in enumerate((5, 9, 16, 3))]
    gens = StaticDriver(engine, layout).generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    for prompt, gen in zip(prompts, gens):
        assert gen.output_ids == oracle.greedy(prompt, 16)
    engine.shutdown()


def test_every_expert_is_exercised(moe_dir: Path) -> None:
    """The parity tests above mean something for every expert: the test prompts route tokens to all of them."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    hits: dict[int, set[int]] = {}

    def record(layer: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], out: tuple[torch.Tensor, ...]) -> None:
            hits.setdefault(layer, set()).update(out[2].flatten().tolist())  # (logits, weights, indices)

        return hook

    for i, layer in enumerate(hf.model.layers):
        layer.mlp.gate.register_forward_hook(record(i))
    with torch.no_grad():
        for seed, length in ((1, 1), (2, 7), (3, 33)):
            hf(torch.tensor([_prompt(seed, length)]))
    assert hits == {0: set(range(8)), 1: set(range(8))}


def _naive_moe(
    hidden: torch.Tensor,
    logits: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k: int,
    renormalize: bool,
    act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> torch.Tensor:
    """One token at a time, straight from the definition."""
    out = torch.zeros_like(hidden)
    inter = down.shape[2]
    for t in range(hidden.shape[0]):
        probs = torch.softmax(logits[t].float(), dim=-1)
        weights, experts = probs.topk(top_k)
        if renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights.to(hidden.dtype), experts.tolist()):
            gate, up = gate_up[e, :inter] @ hidden[t], gate_up[e, inter:] @ hidden[t]
            out[t] += w * (down[e] @ (act(gate) * up))
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    tokens=st.integers(0, 24),
    experts=st.integers(1, 8),
    data=st.data(),
    renormalize=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_torch_backend_matches_naive_reference(
    tokens: int, experts: int, data: st.DataObject, renormalize: bool, dtype: torch.dtype, seed: int
) -> None:
    top_k = data.draw(st.integers(1, experts), label="top_k")
    hidden_size, inter = 16, 8
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    hidden = randn(tokens, hidden_size)
    logits = randn(tokens, experts, scale=2.0)
    gate_up = randn(experts, 2 * inter, hidden_size, scale=1 / math.sqrt(hidden_size))
    down = randn(experts, hidden_size, inter, scale=1 / math.sqrt(inter))
    got = TorchMoeBackend().forward(hidden, logits, gate_up, down, top_k, renormalize)
    want = _naive_moe(hidden, logits, gate_up, down, top_k, renormalize)
    assert got.dtype == dtype and got.shape == hidden.shape
    # Only the summation order differs (by expert id vs by rank, GEMM vs dot products); the router runs in float32 in
    # both. Each side's rounding amounts to a sum of this many terms: the gate and up dot products (silu's slope is
    # at most 1.1), silu and the product, the down dot product, the weighted sum over top_k experts. Its magnitude:
    # the same expression in absolute values, |g| standing for silu(g).
    terms = math.ceil(2.1 * hidden_size) + 4 + inter + top_k + 1
    args = (hidden.abs().double(), logits, gate_up.abs().double(), down.abs().double(), top_k, renormalize)
    bound = 2 * summation_bound(_naive_moe(*args, act=torch.abs), terms, dtype)
    excess = (got.double() - want.double()).abs() - bound
    assert not (excess > 0).any(), f"max |got - want| - bound = {excess.max():.3g}"


def test_moe_backend_registry(moe_dir: Path) -> None:
    where = Where(torch.device("cpu"), torch.float32, 16)
    assert MOE_BACKENDS.resolve("auto", where) == "torch"
    assert isinstance(MOE_BACKENDS.factory("torch")(), TorchMoeBackend)
    assert MOE_BACKENDS.names() == ["auto", "torch"]
    with pytest.raises(ConfigError, match=r"moe_backend='triton' is unknown; known: auto, torch"):
        _engine(moe_dir, moe_backend="triton")
    engine = _engine(moe_dir, moe_backend="torch")
    blocks = [m for m in engine.model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2 and all(isinstance(b.experts.backend, TorchMoeBackend) for b in blocks)
    engine.shutdown()


def _hf_moe_config(**overrides: Any) -> dict[str, Any]:
    from transformers import Qwen3MoeConfig

    base: dict[str, Any] = dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=48,
        vocab_size=VOCAB, num_hidden_layers=6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    )  # fmt: skip
    cfg = Qwen3MoeConfig(**{**base, **overrides})
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg.to_dict()


@pytest.mark.parametrize("step,mlp_only", [(1, []), (2, [3]), (3, [0, 5])])
def test_sparse_layers_follow_hf(step: int, mlp_only: list[int]) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_dict = _hf_moe_config(decoder_sparse_step=step, mlp_only_layers=mlp_only)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg_dict))
        ours = get_model_class("Qwen3MoeForCausalLM")(ModelConfig.from_dict(cfg_dict))
    hf_sparse = [type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in hf.model.layers]
    our_sparse = [isinstance(layer.mlp, SparseMoeBlock) for layer in ours.model.layers]
    assert our_sparse == hf_sparse
    hf_names = {n for n, _ in hf.named_parameters()}
    our_names = {n for n, _ in ours.named_parameters()}
    # Same weights apart from the merged projections (qkv, dense gate/up).
    assert {n for n in hf_names if ".experts." in n or ".mlp.gate." in n} == {
        n for n in our_names if ".experts." in n or ".mlp.gate." in n
    }


def test_mixed_dense_and_sparse_layers_match_hf(tmp_path: Path) -> None:
    """A dense MLP inside a MoE model (mlp_only_layers) loads and computes what HF computes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**_hf_moe_config(num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=False))
    torch.manual_seed(5)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # larger than HF's std-0.02 init, so the logits are far from flat
        for name, param in hf.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else noise / math.sqrt(param.shape[-1]))
    hf.save_pretrained(tmp_path)
    assert "model.layers.1.mlp.gate_proj.weight" in _tensor_names(tmp_path)
    oracle = HFOracle(tmp_path, dtype=torch.float32)
    engine = _engine(tmp_path)
    prompts = [_prompt(20, 11), _prompt(21, 4)]
    gens = StaticDriver(engine, record_logits=True).generate(prompts, SamplingParams(max_tokens=1))
    for prompt, g in zip(prompts, gens):
        want = oracle.prefill_logits(prompt)
        assert want.std() > 0.5
        assert_logits_close(g.logits[0], want, TOL, f"prompt of {len(prompt)} tokens")
    engine.shutdown()


def _copy_with(src: Path, dst: Path, edit: dict[str, torch.Tensor | None]) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    for name, value in edit.items():
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_missing_expert_tensor_is_named(moe_dir: Path, tmp_path: Path) -> None:
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    bad = _copy_with(moe_dir, tmp_path / "m", {name: None})
    with pytest.raises(ModelLoadError, match=rf"missing tensor\(s\) .*{name}"):
        _engine(bad)


def test_expert_out_of_range_is_rejected(moe_dir: Path, tmp_path: Path) -> None:
    extra = torch.zeros(32, 64)
    bad = _copy_with(moe_dir, tmp_path / "m", {"model.layers.0.mlp.experts.8.gate_proj.weight": extra})
    with pytest.raises(ModelLoadError, match=r"expert 8, but the model config says num_experts=8"):
        _engine(bad)


def test_expert_shape_mismatch_is_rejected(moe_dir: Path, tmp_path: Path) -> None:
    name = "model.layers.0.mlp.experts.2.down_proj.weight"
    bad = _copy_with(moe_dir, tmp_path / "m", {name: torch.zeros(64, 16)})
    with pytest.raises(ModelLoadError, match=rf"{name}.*shape \(64, 16\).*expects \(64, 32\)"):
        _engine(bad)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"num_experts_per_tok": 5}, r"num_experts_per_tok=5 is invalid; it must be in \[1, num_experts=4\]"),
        ({"num_experts_per_tok": 0}, r"num_experts_per_tok=0 is invalid"),
        ({"moe_intermediate_size": 0}, r"moe_intermediate_size=0 is invalid"),
        ({"decoder_sparse_step": 0}, r"decoder_sparse_step=0 is invalid"),
    ],
)
def test_bad_moe_config_is_rejected(overrides: dict[str, int], message: str) -> None:
    cfg = _hf_moe_config()
    cfg.update(overrides)
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_dict(cfg)


def test_moe_config_parsing() -> None:
    cfg = _hf_moe_config(decoder_sparse_step=2, mlp_only_layers=[1], norm_topk_prob=True)
    parsed = ModelConfig.from_dict(cfg)
    assert (parsed.num_experts, parsed.num_experts_per_tok, parsed.moe_intermediate_size) == (4, 2, 32)
    assert (parsed.norm_topk_prob, parsed.decoder_sparse_step, parsed.mlp_only_layers) == (True, 2, (1,))
    older = {k: v for k, v in cfg.items() if k != "num_local_experts"} | {"num_experts": 4}
    assert ModelConfig.from_dict(older).num_experts == 4  # transformers 4 / Qwen's own spelling
    dense = ModelConfig.from_dict({k: v for k, v in cfg.items() if "expert" not in k})
    assert dense.num_experts == 0 and not any(dense.is_sparse_layer(i) for i in range(6))
