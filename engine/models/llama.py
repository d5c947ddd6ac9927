"""LlamaForCausalLM (including llama3 RoPE scaling, read from the config)."""

from __future__ import annotations

from .decoder import DecoderForCausalLM
from .registry import register_model


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False
