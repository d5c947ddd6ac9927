"""Model implementations and the registry that picks one by architecture name."""

from . import llama, qwen2, qwen3, qwen3_moe  # noqa: F401  (each module registers its class)
from .config import ModelConfig, RopeConfig
from .decoder import DecoderForCausalLM
from .registry import get_model_class, supported_architectures
from .weight import fill_dummy_weights, load_weights

__all__ = [
    "DecoderForCausalLM",
    "ModelConfig",
    "RopeConfig",
    "fill_dummy_weights",
    "get_model_class",
    "load_weights",
    "supported_architectures",
]
