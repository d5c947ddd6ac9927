"""Qwen3ForCausalLM: Llama plus a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from .decoder import DecoderForCausalLM
from .registry import register_model


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True
