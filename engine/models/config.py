"""ModelConfig: the architecture facts the engine needs, from an HF config.json (transformers 4 or 5 keys), every value
checked for its kind, not coerced (ModelLoadError naming the key; absent or null takes the default). EOS ids follow
HF's generate: generation_config.json's when the file exists (unset: no EOS stop), else config.json's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..checks import is_int, is_real
from ..distributed.info import TPInfo
from ..errors import ModelLoadError

GENERATION_CONFIG = "generation_config.json"
MAX_COUNT = 2**31 - 1  # a product of a few counts stays inside torch's int64 sizes


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    tp: TPInfo = TPInfo()  # the rank sharded for: the heads and MLP width are its share
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"config.json must hold a JSON object, got a {type(cfg).__name__}")
        archs = cfg.get("architectures") or []
        if not isinstance(archs, list) or not archs:
            raise ModelLoadError(
                f"config.json's 'architectures' is {archs!r}; use a non-empty list such as [\"LlamaForCausalLM\"]"
            )
        hidden = _int(cfg, "hidden_size")
        num_heads = _int(cfg, "num_attention_heads")
        num_layers = _int(cfg, "num_hidden_layers")
        # transformers 5 writes num_experts as num_local_experts.
        experts_key = "num_experts" if "num_experts" in cfg else "num_local_experts"
        vocab_size = _int(cfg, "vocab_size")
        model_cfg = cls(
            architecture=str(archs[0]),
            vocab_size=vocab_size,
            hidden_size=hidden,
            intermediate_size=_int(cfg, "intermediate_size"),
            num_layers=num_layers,
            num_qo_heads=num_heads,
            num_kv_heads=_int(cfg, "num_key_value_heads", default=num_heads),
            head_dim=_head_dim(cfg, hidden // num_heads),
            rms_norm_eps=_positive_float(cfg, "rms_norm_eps", default=1e-6),
            max_position_embeddings=_int(cfg, "max_position_embeddings", default=4096),
            tie_word_embeddings=_flag(cfg, "tie_word_embeddings", default=False),
            rope=_parse_rope(cfg),
            # Qwen2 always has a qkv bias; Llama/Qwen3 only when the config says so.
            attention_bias=_flag(cfg, "attention_bias", default=archs[0] == "Qwen2ForCausalLM"),
            eos_token_ids=_parse_eos(cfg, vocab_size),
            num_experts=_int(cfg, experts_key, default=0, minimum=0),
            num_experts_per_tok=_int(cfg, "num_experts_per_tok", default=0, minimum=0),
            moe_intermediate_size=_int(cfg, "moe_intermediate_size", default=0, minimum=0),
            norm_topk_prob=_flag(cfg, "norm_topk_prob", default=False),
            decoder_sparse_step=_int(cfg, "decoder_sparse_step", default=1),
            mlp_only_layers=_layer_list(cfg, "mlp_only_layers", num_layers),
            raw=cfg,
        )
        if model_cfg.num_qo_heads % model_cfg.num_kv_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads={model_cfg.num_qo_heads} is not a multiple of "
                f"num_key_value_heads={model_cfg.num_kv_heads}"
            )
        if model_cfg.num_experts > 0:
            _check_moe(model_cfg)
        return model_cfg

    def is_sparse_layer(self, layer_id: int) -> bool:
        return (
            self.num_experts > 0
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_dir(cls, model_path: str | Path) -> ModelConfig:
        path = Path(model_path)
        cfg_file = path / "config.json"
        if not path.is_dir():
            raise ModelLoadError(f"model_path {str(path)!r} is not a directory; pass an HF model dir")
        if not cfg_file.is_file():
            raise ModelLoadError(
                f"{str(path)!r} has no config.json; an HF model dir needs config.json and *.safetensors"
            )
        model_cfg = cls.from_dict(read_json(cfg_file))
        eos = generation_eos(path / GENERATION_CONFIG, model_cfg.vocab_size)
        return model_cfg if eos is None else replace(model_cfg, eos_token_ids=eos)


def read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{file} is not UTF-8 text: {e}") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{file} is not valid JSON: {e}") from None
    except OSError as e:
        raise ModelLoadError(f"{file} cannot be read: {e}") from None


def generation_eos(file: Path, vocab_size: int) -> tuple[int, ...] | None:
    """The EOS ids of generation_config.json (() where it sets none), or None without the file."""
    if not file.exists() and not file.is_symlink():  # a dangling link is a broken file
        return None
    if not file.is_file():
        raise ModelLoadError(f"{file} is not a regular file; remove it or write the generation config there")
    gen = read_json(file)
    if not isinstance(gen, dict):
        raise ModelLoadError(f"{file} must hold a JSON object, got a {type(gen).__name__}")
    return _parse_eos(gen, vocab_size, GENERATION_CONFIG)


_REQUIRED: Any = object()


def _value(cfg: dict[str, Any], key: str, default: Any, section: str = "") -> Any:
    value = cfg.get(key)
    if value is not None:
        return value
    if default is _REQUIRED:
        raise ModelLoadError(f"config.json lacks the required key {section + key!r}")
    return default


def _invalid(key: str, value: Any, rule: str, file: str = "config.json") -> ModelLoadError:
    return ModelLoadError(f"{file}: {key}={value!r} is invalid; {rule}")


def _int(cfg: dict[str, Any], key: str, default: Any = _REQUIRED, minimum: int = 1, section: str = "") -> int:
    value = _value(cfg, key, default, section)
    if not is_int(value) or not minimum <= value <= MAX_COUNT:
        raise _invalid(section + key, value, f"use an integer in [{minimum}, {MAX_COUNT}]")
    return value


def _positive_float(cfg: dict[str, Any], key: str, default: Any = _REQUIRED, section: str = "") -> float:
    value = _value(cfg, key, default, section)
    number = _to_float(value) if is_real(value) else math.nan
    if not math.isfinite(number) or number <= 0:
        raise _invalid(section + key, value, "use a finite number > 0")
    return number


def _to_float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = _value(cfg, key, default)
    if not isinstance(value, bool):
        raise _invalid(key, value, "use a JSON boolean, true or false")
    return value


def _head_dim(cfg: dict[str, Any], derived: int) -> int:
    head_dim = _int(cfg, "head_dim", default=derived)
    if head_dim % 2:
        raise _invalid("head_dim", head_dim, "use an even integer: rotary embedding rotates pairs of dimensions")
    return head_dim


def _layer_list(cfg: dict[str, Any], key: str, num_layers: int) -> tuple[int, ...]:
    value = _value(cfg, key, [])
    if not isinstance(value, list) or not all(is_int(i) and 0 <= i < num_layers for i in value):
        raise _invalid(key, value, f"use a list of layer indices in [0, num_hidden_layers={num_layers})")
    return tuple(value)


def _check_moe(cfg: ModelConfig) -> None:
    if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
        raise _invalid(
            "num_experts_per_tok", cfg.num_experts_per_tok, f"it must be in [1, num_experts={cfg.num_experts}]"
        )
    if cfg.moe_intermediate_size <= 0:
        raise _invalid("moe_intermediate_size", cfg.moe_intermediate_size, "it must be >= 1")


def _parse_eos(cfg: dict[str, Any], vocab_size: int, file: str = "config.json") -> tuple[int, ...]:
    value = _value(cfg, "eos_token_id", [])
    ids = value if isinstance(value, list) else [value]
    # An id past the vocabulary can never be sampled: a stop set holding one is a broken file, not a choice.
    if not all(is_int(i) and 0 <= i < vocab_size for i in ids):
        raise _invalid(
            "eos_token_id", value, f"use a token id or a list of them (integers in [0, vocab_size={vocab_size}))", file
        )
    return tuple(ids)


def _parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    # transformers 5 folds rope_theta into rope_parameters; transformers 4 keeps them apart.
    section = next((key for key in ("rope_parameters", "rope_scaling") if cfg.get(key)), None)
    params = cfg[section] if section else {}
    if not isinstance(params, dict):
        raise ModelLoadError(f"config.json: rope_parameters / rope_scaling must be an object, got {params!r}")
    where = f"{section}." if section else ""
    if params.get("rope_theta") is not None:
        theta = _positive_float(params, "rope_theta", section=where)
    else:
        theta = _positive_float(cfg, "rope_theta", default=10000.0)
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "llama3"):
        raise ModelLoadError(f"rope_type {rope_type!r} is not supported; supported: 'default', 'llama3'")
    if rope_type == "default":
        return RopeConfig(theta=theta)
    rope = RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=_positive_float(params, "factor", section=where),
        low_freq_factor=_positive_float(params, "low_freq_factor", section=where),
        high_freq_factor=_positive_float(params, "high_freq_factor", section=where),
        original_max_position_embeddings=_int(params, "original_max_position_embeddings", section=where),
    )
    # The blend between the two frequency bands divides by their difference.
    if rope.high_freq_factor == rope.low_freq_factor:
        raise _invalid(where + "high_freq_factor", params["high_freq_factor"], "it must differ from low_freq_factor")
    return rope
