"""oracle.zoo: the tiny random models and the SmolLM2 build load in transformers and are usable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from oracle import zoo


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def _load(path: Path) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def _last_logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[:, -1, :]


@pytest.mark.parametrize("arch", zoo.TINY_ARCHS)
def test_tiny_loads_with_expected_shape(arch: str, tiny_root: Path) -> None:
    path = zoo.tiny_model_dir(arch, tiny_root)
    assert path == tiny_root / f"tiny-{arch}"
    assert (path / "model.safetensors").is_file()
    assert zoo.is_complete(path)
    cfg = AutoConfig.from_pretrained(path)
    heads = 6 if arch == "llama_gqa3" else 4  # the GQA-group-3 Llama; every other tiny model has 4 query heads
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (16 * heads, heads, 2)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (16, 32 * heads, 512)
    assert cfg.num_hidden_layers in (2, 3)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (0, 1, None)
    assert cfg.tie_word_embeddings is (arch == "qwen3")
    model = _load(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("arch", zoo.TINY_ARCHS)
def test_tiny_logits_finite_and_not_flat(arch: str, tiny_root: Path) -> None:
    model = _load(zoo.tiny_model_dir(arch, tiny_root))
    gen = torch.Generator().manual_seed(1234)
    gaps = []
    for length in range(1, 120, 7):
        ids = torch.randint(0, 512, (1, length), generator=gen)
        logits = _last_logits(model, ids)[0]
        assert torch.isfinite(logits).all()
        assert logits.std() > 1.0  # far from the near-uniform output of the default init
        top2 = logits.topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    # Greedy parity is only meaningful without near-ties at the argmax.
    assert sum(g > 1e-3 for g in gaps) >= 0.9 * len(gaps), gaps


@pytest.mark.parametrize("arch", zoo.TINY_ARCHS)
def test_tiny_is_deterministic(arch: str, tmp_path: Path) -> None:
    a = zoo.tiny_model_dir(arch, tmp_path / "a")
    b = zoo.tiny_model_dir(arch, tmp_path / "b")
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("arch", zoo.TINY_ARCHS)
def test_tiny_generation_config_lists_extra_eos_ids(arch: str, tiny_root: Path) -> None:
    """config.json names EOS 1 everywhere; generation_config.json adds eight ids in EXTRA_EOS_ARCHS, HF loads them."""
    path = zoo.tiny_model_dir(arch, tiny_root)
    eos = _load(path).generation_config.eos_token_id
    if arch not in zoo.EXTRA_EOS_ARCHS:
        assert eos == 1
        return
    assert isinstance(eos, list) and eos[0] == 1 and len(set(eos)) == 9, eos
    assert all(isinstance(i, int) and 0 <= i < 512 for i in eos), eos


@pytest.mark.parametrize("arch", zoo.TINY_ARCHS)
def test_tiny_head_dim_64_is_deterministic_and_loads(arch: str, tmp_path: Path) -> None:
    a = zoo.tiny_model_dir(arch, tmp_path / "a", head_dim=64)
    b = zoo.tiny_model_dir(arch, tmp_path / "b", head_dim=64)
    assert a == tmp_path / "a" / f"tiny-{arch}-hd64"
    assert zoo.is_complete(a)
    for name in ("model.safetensors", "config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    cfg = AutoConfig.from_pretrained(a)
    assert cfg.head_dim == 64
    assert cfg.hidden_size == 64 * cfg.num_attention_heads  # so a loader that derives head_dim gets 64 too
    assert cfg.intermediate_size == 2 * cfg.hidden_size
    # The widened model is the same architecture as the head_dim-16 one, only wider.
    narrow = zoo.tiny_config(arch)
    assert type(cfg) is type(narrow)
    for field in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers", "tie_word_embeddings"):
        assert getattr(cfg, field) == getattr(narrow, field), field
    model = _load(a)
    assert model.model.layers[0].self_attn.o_proj.in_features == 64 * cfg.num_attention_heads
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(0))
    logits = _last_logits(model, ids)
    assert torch.isfinite(logits).all() and logits.std() > 1.0


def test_tiny_gqa3_has_six_query_heads_per_two_kv_heads(tiny_root: Path) -> None:
    cfg = AutoConfig.from_pretrained(zoo.tiny_model_dir("llama_gqa3", tiny_root))
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (6, 2)
    assert cfg.model_type == "llama"
    assert zoo.tiny_config("llama_gqa3", head_dim=64).num_attention_heads == 6


@pytest.mark.parametrize("head_dim", [0, -16, 15, 16.0, True, "64"])
def test_tiny_bad_head_dim(head_dim: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        zoo.tiny_config("llama", head_dim)
    with pytest.raises(ValueError, match="head_dim must be a positive even int"):
        zoo.tiny_model_dir("llama", tmp_path, head_dim=head_dim)
    assert list(tmp_path.iterdir()) == []  # rejected before anything is written


def test_tiny_reuses_complete_dir(tmp_path: Path) -> None:
    path = zoo.tiny_model_dir("qwen3", tmp_path)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert zoo.tiny_model_dir("qwen3", tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp dir left over


def test_tiny_does_not_touch_global_rng(tmp_path: Path) -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    zoo.tiny_model_dir("llama", tmp_path)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_unknown_arch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        zoo.tiny_model_dir("gpt2", tmp_path)


def test_llama3_rope_scaling_active(tiny_root: Path) -> None:
    path = zoo.tiny_model_dir("llama", tiny_root)
    saved = json.loads((path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "llama3"
    model = _load(path)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == "llama3"
    # Against the unscaled frequencies: the fastest band is kept, the slowest divided by the factor.
    theta, dim, factor = 10000.0, 16, 8.0
    plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_freq = rotary.inv_freq.float()
    assert torch.allclose(inv_freq[0], plain[0])
    assert torch.allclose(inv_freq[-1], plain[-1] / factor)
    assert not torch.allclose(inv_freq, plain)


def test_qwen2_biases_nonzero_and_used(tiny_root: Path) -> None:
    model = _load(zoo.tiny_model_dir("qwen2", tiny_root))
    attn = model.model.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert proj.bias is not None
        assert proj.bias.abs().min() > 0
        assert proj.bias.std() > 0.1
    assert attn.o_proj.bias is None
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    before = _last_logits(model, ids)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.zero_()
            layer.self_attn.v_proj.bias.zero_()
    # A loader that dropped the biases would be caught by a logits comparison.
    assert (before - _last_logits(model, ids)).abs().max() > 1e-2


def test_qwen3_qk_norm_and_tied_embeddings(tiny_root: Path) -> None:
    model = _load(zoo.tiny_model_dir("qwen3", tiny_root))
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (16,)
    assert not torch.allclose(attn.q_norm.weight, torch.ones(16))  # jittered, so a skipped weight shows
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_cli_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert zoo.main(["tiny", "qwen2", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "tiny-qwen2")


def test_interrupted_build_is_never_published(tmp_path: Path) -> None:
    def half_written(out: Path) -> dict[str, Any]:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        zoo._publish(half_written, tmp_path / "model")
    assert list(tmp_path.iterdir()) == []  # neither the final name nor the temp dir


def test_stale_temp_dirs_are_swept(tmp_path: Path) -> None:
    stale = tmp_path / ".tiny-llama.abc123.tmp"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    zoo.tiny_model_dir("llama", tmp_path)
    assert not stale.exists()


def test_foreign_dir_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "tiny-qwen3").mkdir()
    (tmp_path / "tiny-qwen3" / "mine.txt").write_text("keep")
    with pytest.raises(zoo.ModelBuildError, match=r"\[publish\]"):
        zoo.tiny_model_dir("qwen3", tmp_path)
    assert (tmp_path / "tiny-qwen3" / "mine.txt").read_text() == "keep"


def test_sha256_mismatch_is_a_typed_error(tmp_path: Path) -> None:
    blob = tmp_path / "x.gguf"
    blob.write_bytes(b"not the model")
    with pytest.raises(zoo.ModelBuildError, match=r"\[verify\]") as info:
        zoo._verify_sha256(blob, zoo.SMOLLM2_GGUF_SHA256)
    assert info.value.step == "verify"
    assert info.value.hint


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    assert zoo.default_cache_dir() == tmp_path
    monkeypatch.delenv(zoo.CACHE_ENV)
    assert zoo.default_cache_dir() == zoo.REPO_ROOT / ".cache"


@pytest.mark.model
def test_smollm2_greedy_says_paris() -> None:
    path = zoo.smollm2_dir()
    assert zoo.is_complete(path)
    saved = json.loads((path / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in saved
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    assert not gen_cfg.get("do_sample", False)

    # Any: transformers' stubs type `generate` on a protocol mypy can't match to PreTrainedModel.
    model: Any = _load(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert getattr(model, "hf_quantizer", None) is None
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.eos_token_id == saved["eos_token_id"] == 2  # <|im_end|>, not the bos token

    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(model(**ids).logits).all()
        out = model.generate(**ids, do_sample=False, max_new_tokens=8)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text, text
