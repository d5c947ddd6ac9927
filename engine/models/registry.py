"""Architecture name → model class, chosen by config.json's architectures[0]."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..errors import ModelLoadError
from .decoder import DecoderForCausalLM

_MODELS: dict[str, type[DecoderForCausalLM]] = {}

M = TypeVar("M", bound=type[DecoderForCausalLM])


def register_model(architecture: str) -> Callable[[M], M]:
    def wrap(cls: M) -> M:
        _MODELS[architecture] = cls
        return cls

    return wrap


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[DecoderForCausalLM]:
    try:
        return _MODELS[architecture]
    except KeyError:
        raise ModelLoadError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(supported_architectures())}"
        ) from None
