"""Tensor parallelism in the Megatron layout: each rank holds 1/size of the heads and of the MLP; embeddings, norms
and the LM head are replicated, so every rank samples the same token.
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from ..models.config import ModelConfig
from .info import TPInfo


def shard_config(cfg: ModelConfig, tp: TPInfo) -> ModelConfig:
    if tp.size == 1:
        return cfg
    if cfg.num_experts:
        raise ConfigError(f"tp_info.size={tp.size}: tensor parallelism does not support MoE models yet")
    for name, value in (
        ("num_attention_heads", cfg.num_qo_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if value % tp.size:
            raise ConfigError(f"tp_info.size={tp.size} does not divide the model's {name}={value}")
    return dataclasses.replace(
        cfg,
        num_qo_heads=cfg.num_qo_heads // tp.size,
        num_kv_heads=cfg.num_kv_heads // tp.size,
        intermediate_size=cfg.intermediate_size // tp.size,
        tp=tp,
    )
