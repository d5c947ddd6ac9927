"""MoE backends and the registry that picks one by name (EngineConfig.moe_backend)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConfigError
from .base import BaseMoeBackend
from .layer import FusedMoE
from .torch_backend import TorchMoeBackend, select_experts

_BACKENDS: dict[str, Callable[[], BaseMoeBackend]] = {"torch": TorchMoeBackend}


def register_moe_backend(name: str, factory: Callable[[], BaseMoeBackend]) -> None:
    _BACKENDS[name] = factory


def known_moe_backends() -> list[str]:
    return sorted(["auto", *_BACKENDS])


def resolve_moe_backend_name(name: str) -> str:
    """'auto' is torch, the only backend so far; an unknown name is a ConfigError."""
    if name == "auto":
        return "torch"
    if not isinstance(name, str) or name not in _BACKENDS:
        raise ConfigError(f"moe_backend={name!r} is unknown; known: {', '.join(known_moe_backends())}")
    return name


def create_moe_backend(name: str) -> BaseMoeBackend:
    return _BACKENDS[resolve_moe_backend_name(name)]()


__all__ = [
    "BaseMoeBackend",
    "FusedMoE",
    "TorchMoeBackend",
    "create_moe_backend",
    "known_moe_backends",
    "register_moe_backend",
    "resolve_moe_backend_name",
    "select_experts",
]
