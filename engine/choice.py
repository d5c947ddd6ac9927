"""Picking an implementation by name: the rule shared by the attention backends and the layer kernels."""

from __future__ import annotations

from collections.abc import Collection

from .errors import ConfigError


def resolve_choice(option: str, name: str, known: Collection[str], fast: str, fast_unusable: str | None) -> str:
    """'auto' is `fast` where it can serve (fast_unusable is None), else 'torch', the reference; an explicit name
    must be known, and `fast` usable here. `option` names the EngineConfig field in the error."""
    if name == "auto":
        return "torch" if fast_unusable else fast
    if name not in known:
        raise ConfigError(f"{option}={name!r} is unknown; known: {', '.join(sorted(['auto', *known]))}")
    if name == fast and fast_unusable is not None:
        raise ConfigError(f"{option}={fast!r} cannot be used: {fast_unusable}; use 'torch' or 'auto'")
    return name
