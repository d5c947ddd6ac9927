"""A compact LLM inference engine that computes exactly what Hugging Face computes."""

from .attention import ATTENTION_BACKENDS
from .config import EngineConfig
from .core import Batch, Context, Req, SamplingParams
from .distributed import TPInfo
from .engine import Engine
from .errors import (
    CapacityError,
    ConfigError,
    EngineBusyError,
    EngineClosedError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    NonFiniteLogitsError,
)
from .layers.kernels import LAYER_KERNELS
from .moe import MOE_BACKENDS
from .registry import Registry, Requires, Where
from .sample import SAMPLERS
from .step import STEP_KERNELS, ForwardOutput

__all__ = [
    "ATTENTION_BACKENDS",
    "LAYER_KERNELS",
    "MOE_BACKENDS",
    "SAMPLERS",
    "STEP_KERNELS",
    "Registry",
    "Requires",
    "Where",
    "Batch",
    "CapacityError",
    "ConfigError",
    "Context",
    "Engine",
    "EngineBusyError",
    "EngineClosedError",
    "EngineConfig",
    "EngineError",
    "ForwardOutput",
    "InvalidRequestError",
    "ModelLoadError",
    "NonFiniteLogitsError",
    "Req",
    "SamplingParams",
    "TPInfo",
]
