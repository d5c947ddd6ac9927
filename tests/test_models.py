"""Model parity with HF in fp32: prefill logits, greedy tokens under several page layouts, chunked extends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.driver import PageLayout, StaticDriver
from engine.models import ModelConfig, supported_architectures
from oracle.checks import assert_logits_close
from oracle.hf import HFOracle
from oracle.tolerance import logit_tolerance

# fp32 engine vs fp32 HF (or vs itself): the same math in a different op order, within the harness's fp32 bound.
TOL = logit_tolerance(torch.float32)
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]


def _prompt(seed: int, length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model: Path, page_size: int = 1, **kw: object) -> Engine:
    return Engine(EngineConfig(str(model), page_size=page_size, num_page_override=256, max_running_req=4, **kw))


def test_prefill_logits_match_hf(tiny_model: Path) -> None:
    oracle = HFOracle(tiny_model, dtype=torch.float32)
    engine = _engine(tiny_model)
    prompts = [_prompt(s, n, 512) for s, n in ((1, 1), (2, 7), (3, 33))]
    gens = StaticDriver(engine, record_logits=True).generate(prompts, SamplingParams(max_tokens=1))
    for prompt, gen in zip(prompts, gens):
        assert_logits_close(gen.logits[0], oracle.prefill_logits(prompt), TOL, f"prompt of {len(prompt)} tokens")
    engine.shutdown()


LAYOUTS = [(1, PageLayout()), (4, PageLayout()), (4, PageLayout("shuffled", 7)), (2, PageLayout("interleaved"))]


@pytest.mark.parametrize("page_size,layout", LAYOUTS)
def test_greedy_matches_hf_generate(tiny_model: Path, page_size: int, layout: PageLayout) -> None:
    oracle = HFOracle(tiny_model, dtype=torch.float32)
    engine = _engine(tiny_model, page_size)
    prompts = [_prompt(10 + i, n, 512) for i, n in enumerate((5, 9, 16, 3))]
    gens = StaticDriver(engine, layout).generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    for prompt, gen in zip(prompts, gens):
        assert gen.output_ids == oracle.greedy(prompt, 16)
    engine.shutdown()


def test_extend_in_two_chunks_equals_one_prefill(tiny_model: Path) -> None:
    prompt = _prompt(5, 21, 512)
    engine = _engine(tiny_model, page_size=4)
    whole = StaticDriver(engine, record_logits=True)
    whole.add(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    whole.run()
    split = StaticDriver(engine, PageLayout("shuffled", 3), record_logits=True)
    split.add(prompt, SamplingParams(max_tokens=3, ignore_eos=True), chunk_sizes=[13, 8])
    assert split.step() == {}  # the first chunk yields no token
    assert split.running[0].req.cached_len == 13
    split.run()
    a, b = whole.result(0), split.result(0)
    assert a.output_ids == b.output_ids
    for step, (la, lb) in enumerate(zip(a.logits, b.logits)):
        assert_logits_close(lb, la, TOL, f"two chunks vs one prefill, step {step}")
    engine.shutdown()


@pytest.mark.model
def test_smollm2_prefill_logits_and_greedy(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    oracle = HFOracle(smollm2, dtype=torch.float32)
    engine = Engine(EngineConfig(str(smollm2), page_size=4, max_running_req=4, num_page_override=512))
    prompts = [tok.encode(p) for p in SMOLLM2_PROMPTS]
    for layout in (PageLayout(), PageLayout("shuffled", 1)):
        gens = StaticDriver(engine, layout, record_logits=True).generate(
            prompts, SamplingParams(max_tokens=16, ignore_eos=True)
        )
        for prompt, gen in zip(prompts, gens):
            assert_logits_close(gen.logits[0], oracle.prefill_logits(prompt), TOL, repr(tok.decode(prompt)))
            assert gen.output_ids == oracle.greedy(prompt, 16), tok.decode(prompt)
    assert "Paris" in tok.decode(gens[0].output_ids)
    engine.shutdown()


def test_registry_lists_the_supported_architectures() -> None:
    assert supported_architectures() == [
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    ]


def test_config_accepts_transformers4_and_5_rope_keys(tiny_models: dict[str, Path]) -> None:
    raw = json.loads((tiny_models["llama"] / "config.json").read_text())
    v5 = ModelConfig.from_dict(raw)
    assert v5.rope.rope_type == "llama3"
    # Rewrite the same facts in transformers-4 form: rope_theta at top level, scaling in rope_scaling.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.pop("rope_theta", raw.get("rope_theta"))
    v4_raw = {k: v for k, v in raw.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    v4_raw.update(rope_theta=theta, rope_scaling=params)
    assert ModelConfig.from_dict(v4_raw).rope == v5.rope


def test_tied_embeddings_share_one_tensor(tiny_models: dict[str, Path]) -> None:
    engine = _engine(tiny_models["qwen3"])  # the tiny qwen3 ties its embeddings
    assert engine.model_config.tie_word_embeddings
    assert engine.model.lm_head.tied_to is engine.model.model.embed_tokens
    assert not any(name.startswith("lm_head") for name, _ in engine.model.named_parameters())
    engine.shutdown()


def test_oracle_greedy_ignores_eos_like_the_engine(tiny_models: dict[str, Path]) -> None:
    """The tiny qwen3 continues [0, 1] with its EOS id (1) at once: both sides must run on past it."""
    model = tiny_models["qwen3"]
    eos = ModelConfig.from_dir(model).eos_token_ids
    hf = HFOracle(model, dtype=torch.float32).greedy([0, 1], 5)
    assert len(hf) == 5 and hf[0] in eos
    engine = _engine(model)
    [gen] = StaticDriver(engine).generate([[0, 1]], SamplingParams(max_tokens=5, ignore_eos=True))
    assert gen.output_ids == hf
    [stopped] = StaticDriver(engine).generate([[0, 1]], SamplingParams(max_tokens=5))
    assert stopped.output_ids == hf[:1] and stopped.finish_reason == "eos"
    engine.shutdown()
