"""Blame for plugin factories: what a plugin registers in the engine's registries while it imports is wrapped, so
that an exception its factory raises when an engine builds it is a PluginError naming the plugin and the entry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from engine import ATTENTION_BACKENDS, LAYER_KERNELS, MOE_BACKENDS, SAMPLERS, STEP_KERNELS
from engine.registry import ANYWHERE, Registry, Requires

from .plugins import PluginError

REGISTRIES: tuple[Registry[Any], ...] = (ATTENTION_BACKENDS, LAYER_KERNELS, STEP_KERNELS, MOE_BACKENDS, SAMPLERS)


def guarded(plugin: str, option: str, name: str, factory: Callable[..., Any]) -> Callable[..., Any]:
    """factory, whose exceptions become a PluginError naming `plugin` and the entry ``option=name``."""

    def build(*args: Any, **kwargs: Any) -> Any:
        try:
            return factory(*args, **kwargs)
        except Exception as exc:
            raise PluginError(
                f"plugin {plugin!r}: the factory of its {option}={name!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    build.__module__ = getattr(factory, "__module__", None) or build.__module__  # the op ledger's plugin home
    return build


@contextmanager
def blaming(plugin: str) -> Iterator[None]:
    """Within it, each registry's register wraps the factory it is given (an instance attribute over the method,
    removed on the way out: the engine stays untouched)."""

    def register_for(registry: Registry[Any]) -> Callable[..., None]:
        original = registry.register

        def register(name: str, factory: Any, requires: Requires = ANYWHERE, replace: bool = False) -> None:
            original(name, guarded(plugin, registry.option, name, factory), requires, replace)

        return register

    for registry in REGISTRIES:
        setattr(registry, "register", register_for(registry))  # noqa: B010 - mypy refuses assigning a method
    try:
        yield
    finally:
        for registry in REGISTRIES:
            delattr(registry, "register")
