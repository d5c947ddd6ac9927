"""Registry: the one type behind every choice of implementation by name (attention backends, layer kernels, MoE
backends), and the public way to plug in one's own.

An entry is a factory plus an optional ``unusable(where) -> reason | None`` check. ``resolve("auto", where)`` takes
the first of the registry's preferred names that is usable here, else the reference (``torch``); an explicit name
must be registered and usable, or it is a ConfigError naming the EngineConfig field. Registering a name twice is an
error unless ``replace=True``, so two plugins cannot silently shadow each other.

    from engine import ATTENTION_BACKENDS
    from engine.attention import TorchAttnBackend
    ATTENTION_BACKENDS.register("mine", lambda kv, table, heads, device: MyBackend(kv, table, heads))
    Engine(EngineConfig(model, attention_backend="mine"))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from .errors import ConfigError

F = TypeVar("F")

REFERENCE = "torch"


@dataclass(frozen=True)
class Where:
    """What an implementation is asked to serve: the device, the engine dtype and the model's head_dim."""

    device: torch.device
    dtype: torch.dtype
    head_dim: int


Unusable = Callable[[Where], "str | None"]


@dataclass(frozen=True)
class Entry(Generic[F]):
    factory: F
    unusable: Unusable | None = None

    def reason(self, where: Where) -> str | None:
        return None if self.unusable is None else self.unusable(where)


class Registry(Generic[F]):
    def __init__(self, option: str, preferred: Sequence[str] = ()) -> None:
        """option: the EngineConfig field that names an entry; preferred: what "auto" tries before the reference."""
        self.option = option
        self.preferred = tuple(preferred)
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, factory: F, unusable: Unusable | None = None, replace: bool = False) -> None:
        """Add `name`; unusable(where) returns why it cannot serve there, or None."""
        if not isinstance(name, str) or not name or name == "auto":
            raise ConfigError(f"{self.option}: {name!r} cannot be registered; use a non-empty name other than 'auto'")
        if name in self._entries and not replace:
            raise ConfigError(f"{self.option}={name!r} is already registered; pass replace=True to override it")
        self._entries[name] = Entry(factory, unusable)

    def unregister(self, name: str) -> None:
        if name == REFERENCE:
            raise ConfigError(f"{self.option}: the reference {REFERENCE!r} cannot be removed")
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        """Every name the option accepts, 'auto' included."""
        return sorted(["auto", *self._entries])

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unusable(self, name: str, where: Where) -> str | None:
        """Why `name` cannot serve at `where` (unknown names included), or None."""
        if name not in self._entries:
            return f"{self.option}={name!r} is unknown; known: {', '.join(self.names())}"
        return self._entries[name].reason(where)

    def resolve(self, name: str, where: Where) -> str:
        if not isinstance(name, str):
            raise ConfigError(f"{self.option}={name!r} is invalid: use a string, e.g. 'auto'")
        if name == "auto":
            usable = [n for n in self.preferred if n in self._entries and self._entries[n].reason(where) is None]
            return usable[0] if usable else REFERENCE
        if name not in self._entries:
            raise ConfigError(f"{self.option}={name!r} is unknown; known: {', '.join(self.names())}")
        reason = self._entries[name].reason(where)
        if reason is not None:
            raise ConfigError(f"{self.option}={name!r} cannot be used: {reason}; use '{REFERENCE}' or 'auto'")
        return name

    def factory(self, name: str) -> F:
        if name not in self._entries:
            raise ConfigError(f"{self.option}={name!r} is unknown; known: {', '.join(self.names())}")
        return self._entries[name].factory
