"""A compact LLM inference engine that computes exactly what Hugging Face computes."""

from .config import EngineConfig
from .core import Batch, Context, Req, SamplingParams
from .distributed import TPInfo
from .engine import Engine, ForwardOutput
from .errors import (
    CapacityError,
    ConfigError,
    EngineClosedError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    NonFiniteLogitsError,
)

__all__ = [
    "Batch",
    "CapacityError",
    "ConfigError",
    "Context",
    "Engine",
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
