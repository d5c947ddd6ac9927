"""Tiny, deterministic random Hugging Face models, one per architecture the engine supports: Qwen3 (q/k norm, tied
embeddings), Qwen2 (q/k/v biases), Llama (llama3 RoPE scaling), Qwen3-MoE (sparse experts) and a Llama whose GQA
group is 3 (6 query heads per 2 KV heads, not a power of two, like SmolLM2's 9/3). Each has its own fixed seed and
weights scaled so greedy decoding has no near-ties. The default head_dim 16 keeps the CPU suites fast; any other
even head_dim widens the same model (hidden and MLP sizes grow with it), e.g. 64 for FlashInfer's smallest kernel on
the GPU suites.

Some of them stop on more tokens than config.json names, as Qwen3's and Llama 3's checkpoints do: their
generation_config.json lists config.json's EOS id plus the tokens the model's own greedy decoding reaches most
often from fixed random prompts, so EOS finishes on ids only that file lists are common. Weights and config.json
do not depend on it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .cache import ModelBuildError, _lock, _publish, _quiet, is_complete

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig

TINY_ARCHS: Final = ("qwen3", "qwen2", "llama", "qwen3_moe", "llama_gqa3")
# One fixed seed per architecture, so each tiny model is reproducible on its own.
_TINY_SEEDS: Final = {"qwen3": 3003, "qwen2": 2002, "llama": 1001, "qwen3_moe": 4004, "llama_gqa3": 5005}
TINY_HEAD_DIM: Final = 16
"""The default head_dim: the models the CPU suites use, in the directory ``tiny-<arch>``."""

# (query heads, kv heads): GQA with two query heads per kv head, except the group of three.
_TINY_HEADS: Final = {"llama_gqa3": (6, 2)}
_DEFAULT_HEADS: Final = (4, 2)

_TINY_COMMON: Final[dict[str, Any]] = {
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": None,
}

# Models whose generation_config.json lists more EOS ids than config.json, and how many more.
EXTRA_EOS_ARCHS: Final = ("qwen2", "llama", "llama_gqa3")
_EXTRA_EOS: Final = 8
# The probe that picks them: this many random prompts of this length, decoded greedily for this many steps.
_PROBE_PROMPTS: Final = 64
_PROBE_LEN: Final = 16
_PROBE_STEPS: Final = 12

# Init scales, see _reinit_weights.
_EMBED_STD: Final = 0.4
_BIAS_STD: Final = 0.5
_NORM_JITTER: Final = 0.1


def _check_head_dim(head_dim: int) -> None:
    # bool is an int subclass, but head_dim=True is a mistake, not 1; odd sizes can't be split into rotary pairs.
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int (RoPE rotates pairs of dimensions), got {head_dim!r}")


def _shape(arch: str, head_dim: int) -> dict[str, int]:
    """Head counts and widths: hidden = heads * head_dim, so a loader that derives head_dim gets the same one."""
    heads, kv_heads = _TINY_HEADS.get(arch, _DEFAULT_HEADS)
    hidden = heads * head_dim
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
    }


def tiny_config(arch: str, head_dim: int = TINY_HEAD_DIM) -> PreTrainedConfig:
    """The transformers config of the tiny ``arch`` model with ``head_dim`` (16: hidden 64 for 4 query heads)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    _check_head_dim(head_dim)
    common = {**_TINY_COMMON, **_shape(arch, head_dim)}
    if arch == "qwen3":
        # q/k RMSNorm is part of Qwen3 itself; tying exercises the shared embedding path.
        return Qwen3Config(
            **common,
            num_hidden_layers=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    if arch == "qwen2":
        # Qwen2's q/k/v projections always carry a bias; three layers to catch a hard-coded count.
        return Qwen2Config(
            **common,
            num_hidden_layers=3,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    if arch in ("llama", "llama_gqa3"):
        # transformers 5 takes rope settings as `rope_parameters` (theta inside); the v4
        # `rope_scaling` + `rope_theta` spelling is converted to the same thing. A 64-token
        # original context puts the llama3 frequency bands inside head_dim 16 (and any wider
        # one), so every branch of the scaling (kept, smoothed, divided by factor) is exercised.
        return LlamaConfig(
            **common,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "qwen3_moe":
        # Every layer sparse: 8 experts, top-2, renormalized top-k weights (Qwen3-30B-A3B's routing).
        return Qwen3MoeConfig(
            **common,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=common["hidden_size"] // 2,  # a quarter of the dense MLP's width, as at head_dim 16
            norm_topk_prob=True,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")


def _reinit_weights(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Replace the default init with one that makes greedy decoding unambiguous.

    transformers' std-0.02 init gives nearly flat logits, so top-2 ties are common and a
    parity test on argmax tokens means little. Instead:

    * projections get std 1/sqrt(fan_in), keeping activations O(1) and attention soft (mean
      entropy ~2.8 nats over 64 positions), so a wrong softmax scale or mask still shows;
      a larger std makes attention near one-hot, which hides such bugs;
    * embeddings / lm_head get std 0.4, which alone sets the logit spread: logits std ~3 and a
      median top-2 gap ~0.7, far above fp32 noise;
    * norm weights are 1 + N(0, 0.1) and biases N(0, 0.5), so a skipped norm weight or bias
      changes the output.
    """
    import torch

    with torch.no_grad():
        # named_parameters yields a tied weight once, so the tie survives the re-init.
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + _NORM_JITTER * noise
            elif name.endswith(".bias"):
                value = _BIAS_STD * noise
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = _EMBED_STD * noise
            elif param.ndim in (2, 3):  # 3-D: MoE experts stacked as [experts, out, in]
                value = noise / math.sqrt(param.shape[-1])
            else:
                raise ModelBuildError("init", f"no init rule for parameter {name}", "extend _reinit_weights")
            param.copy_(value)


def _favourite_tokens(model: torch.nn.Module, generator: torch.Generator, vocab_size: int, skip: int) -> list[int]:
    """The _EXTRA_EOS tokens other than `skip` that greedy decoding reaches from the most probe prompts (ties: the
    lower id), so a stop set holding them ends many greedy runs early."""
    import torch

    tokens = torch.randint(vocab_size, (_PROBE_PROMPTS, _PROBE_LEN), generator=generator)
    with torch.no_grad():
        for _ in range(_PROBE_STEPS):
            tokens = torch.cat([tokens, model(tokens).logits[:, -1:].argmax(-1)], dim=1)
    reached = torch.zeros(vocab_size, dtype=torch.long)
    for row in tokens[:, _PROBE_LEN:]:
        reached[row.unique()] += 1
    reached[skip] = -1
    # Descending count, then ascending id: a stable sort of ids already in ascending order.
    order = torch.sort(reached, descending=True, stable=True).indices
    return order[:_EXTRA_EOS].tolist()


def tiny_model_dir(arch: str, root: Path, head_dim: int = TINY_HEAD_DIM) -> Path:
    """Create (once) and return ``root/tiny-<arch>`` (``root/tiny-<arch>-hd<head_dim>`` for a head_dim other than
    16): a deterministic tiny random HF model."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")
    _check_head_dim(head_dim)
    name = f"tiny-{arch}" if head_dim == TINY_HEAD_DIM else f"tiny-{arch}-hd{head_dim}"
    final = Path(root) / name
    if is_complete(final):
        return final
    with _lock(final):
        if not is_complete(final):
            _publish(lambda out: _build_tiny(arch, head_dim, name, out), final)
    return final


def _build_tiny(arch: str, head_dim: int, name: str, out: Path) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    seed = _TINY_SEEDS[arch]
    config = tiny_config(arch, head_dim)
    # fork_rng: seeding must not leak into the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]), _quiet(True):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        generator = torch.Generator().manual_seed(seed)
        _reinit_weights(model, generator)
        model.eval()
        if arch in EXTRA_EOS_ARCHS:
            extra = _favourite_tokens(model, generator, config.vocab_size, config.eos_token_id)
            model.generation_config.eos_token_id = [config.eos_token_id, *extra]
        model.save_pretrained(out, safe_serialization=True)
    return {"name": name, "seed": seed, "transformers": transformers.__version__}
