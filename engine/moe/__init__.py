"""MoE backends and MOE_BACKENDS, the registry that picks one by name (EngineConfig.moe_backend)."""

from __future__ import annotations

from collections.abc import Callable

from ..registry import Registry
from .base import BaseMoeBackend
from .layer import FusedMoE
from .torch_backend import TorchMoeBackend, select_experts

MOE_BACKENDS: Registry[Callable[[], BaseMoeBackend]] = Registry("moe_backend")
MOE_BACKENDS.register("torch", TorchMoeBackend)

__all__ = ["MOE_BACKENDS", "BaseMoeBackend", "FusedMoE", "TorchMoeBackend", "select_experts"]
