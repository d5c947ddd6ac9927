"""Tensor parallelism in the Megatron layout: each rank holds 1/size of the heads and of the MLP.

q/k/v and gate/up are split along their outputs (column parallel); o_proj and down_proj along their inputs (row
parallel), and their partial outputs are summed across ranks. Embeddings, norms and the LM head are replicated,
so every rank ends with the same logits and samples the same token.
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from ..errors import ConfigError
from ..models.config import ModelConfig
from .comm import Comm
from .info import TPInfo

_COLUMN_RE = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_ROW_RE = re.compile(r"\.(o_proj|down_proj)\.weight$")
_ROW_MODULES = ("o_proj", "down_proj")


def shard_config(cfg: ModelConfig, tp: TPInfo) -> ModelConfig:
    """The model one rank builds: its share of the heads and of the MLP width."""
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
    )


def shard_tensor(name: str, value: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    """This rank's slice of a full checkpoint tensor (the whole tensor where the layer is replicated)."""
    if tp.size == 1:
        return value
    if _COLUMN_RE.search(name):
        return value.chunk(tp.size, dim=0)[tp.rank]
    if _ROW_RE.search(name):
        return value.chunk(tp.size, dim=1)[tp.rank]
    return value


def install_all_reduce(model: nn.Module, comm: Comm) -> None:
    """Sum the row-parallel projections' partial outputs across ranks, right after each one runs."""

    def reduce(_module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce(output)

    for name, module in model.named_modules():
        if name.endswith(_ROW_MODULES):
            module.register_forward_hook(reduce)
