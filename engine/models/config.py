"""ModelConfig: the architecture facts the engine needs, parsed from an HF config.json.

Accepts both transformers-4 keys (``rope_theta``/``rope_scaling``) and transformers-5 keys
(``rope_parameters``, which carries rope_theta and the scaling together).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    # llama3 scaling (only read when rope_type == "llama3")
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
    # Sparse MoE (Qwen3-MoE); num_experts == 0 means a dense MLP in every layer.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
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
        try:
            hidden = _positive(cfg, "hidden_size")
            num_heads = _positive(cfg, "num_attention_heads")
            head_dim = int(cfg.get("head_dim") or hidden // num_heads)
            model_cfg = cls(
                architecture=str(archs[0]),
                vocab_size=_positive(cfg, "vocab_size"),
                hidden_size=hidden,
                intermediate_size=_positive(cfg, "intermediate_size"),
                num_layers=_positive(cfg, "num_hidden_layers"),
                num_qo_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=head_dim,
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                rope=_parse_rope(cfg),
                # Qwen2 always has a qkv bias; Llama/Qwen3 only when the config says so.
                attention_bias=bool(cfg.get("attention_bias", archs[0] == "Qwen2ForCausalLM")),
                eos_token_ids=_parse_eos(cfg.get("eos_token_id")),
                # transformers 5 writes num_experts as num_local_experts.
                num_experts=int(cfg.get("num_experts", cfg.get("num_local_experts")) or 0),
                num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
                moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                decoder_sparse_step=int(cfg.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
                raw=cfg,
            )
        except KeyError as e:
            raise ModelLoadError(f"config.json lacks the required key {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"config.json has a malformed value: {e}") from None
        for key, value in (
            ("head_dim", model_cfg.head_dim),
            ("num_key_value_heads", model_cfg.num_kv_heads),
            ("max_position_embeddings", model_cfg.max_position_embeddings),
        ):
            if value <= 0:
                raise ModelLoadError(f"config.json: {key}={value} is invalid; it must be >= 1")
        if model_cfg.num_qo_heads % model_cfg.num_kv_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads={model_cfg.num_qo_heads} is not a multiple of "
                f"num_key_value_heads={model_cfg.num_kv_heads}"
            )
        if model_cfg.num_experts > 0:
            _check_moe(model_cfg)
        return model_cfg

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether layer `layer_id` has a sparse MoE block instead of a dense MLP (HF's rule)."""
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
        try:
            cfg = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{cfg_file} is not valid JSON: {e}") from None
        return cls.from_dict(cfg)


def _positive(cfg: dict[str, Any], key: str) -> int:
    value = int(cfg[key])
    if value <= 0:
        raise ModelLoadError(f"config.json: {key}={value} is invalid; it must be >= 1")
    return value


def _check_moe(cfg: ModelConfig) -> None:
    if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
        raise ModelLoadError(
            f"config.json: num_experts_per_tok={cfg.num_experts_per_tok} is invalid; it must be in "
            f"[1, num_experts={cfg.num_experts}]"
        )
    for key, value in (
        ("moe_intermediate_size", cfg.moe_intermediate_size),
        ("decoder_sparse_step", cfg.decoder_sparse_step),
    ):
        if value <= 0:
            raise ModelLoadError(f"config.json: {key}={value} is invalid; it must be >= 1")


def _parse_eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def _parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    # transformers 5 folds rope_theta into rope_parameters; transformers 4 keeps them apart.
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelLoadError(f"config.json: rope_parameters / rope_scaling must be an object, got {params!r}")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in ("default", "llama3"):
        raise ModelLoadError(f"rope_type {rope_type!r} is not supported; supported: 'default', 'llama3'")
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    return RopeConfig(
        theta=float(theta),
        rope_type="llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
