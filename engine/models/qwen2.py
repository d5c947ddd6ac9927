"""Qwen2ForCausalLM: Llama plus a bias on the q/k/v projections (ModelConfig.attention_bias)."""

from __future__ import annotations

from .decoder import DecoderForCausalLM
from .registry import register_model


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(DecoderForCausalLM):
    qk_norm = False
