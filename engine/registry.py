"""Registry: every choice of implementation by name, and the way to plug in one's own. An entry is a factory and its
``Requires``, which only the registry evaluates; "auto" takes the first usable preferred name, else ``torch``; an
unusable name is a ConfigError naming the EngineConfig field; registering a name twice needs ``replace=True``.

    from engine import ATTENTION_BACKENDS, Requires
    ATTENTION_BACKENDS.register("mine", lambda kv, table, heads, device: MyBackend(kv, table, heads),
                                requires=Requires(devices=("cuda",)))
    Engine(EngineConfig(model, attention_backend="mine"))
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from .errors import ConfigError

F = TypeVar("F")

REFERENCE = "torch"
# How to install each optional package, for the message (others: pip install <name>).
INSTALL_HINTS = {
    "triton": "it comes with CUDA builds of torch",
    "flashinfer": "pip install flashinfer-python; see docs/gpu.md",
}


@dataclass(frozen=True)
class Where:
    device: torch.device
    dtype: torch.dtype
    head_dim: int


@dataclass(frozen=True)
class HeadDim:
    """A power-of-two head_dim in [low, high] (no upper bound where high is None), which `kernel` needs."""

    kernel: str
    low: int = 1
    high: int | None = None

    def reason(self, head_dim: int) -> str | None:
        if self.low <= head_dim and (self.high is None or head_dim <= self.high) and not head_dim & (head_dim - 1):
            return None
        span = f" in [{self.low}, {self.high}]" if self.high is not None else f" of at least {self.low}"
        return f"{self.kernel} needs a power-of-two head_dim{span}, got {head_dim}"


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass(frozen=True)
class Requires:
    """What an implementation needs to serve a Where; None asks nothing. package: importable (never imported to
    find out); extra: any other check, where -> why not or None."""

    devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    head_dim: HeadDim | None = None
    package: str | None = None
    extra: Callable[[Where], str | None] | None = None

    def reason(self, where: Where) -> str | None:
        if self.devices is not None and where.device.type not in self.devices:
            wanted = " or ".join(d.upper() for d in self.devices)
            return f"it needs a {wanted} device, got {where.device}"
        if self.dtypes is not None and where.dtype not in self.dtypes:
            names = [str(d).removeprefix("torch.") for d in self.dtypes]
            return f"it serves {_listed(names)}, got {where.dtype}"
        if self.head_dim is not None and (reason := self.head_dim.reason(where.head_dim)) is not None:
            return reason
        if self.package is not None and importlib.util.find_spec(self.package) is None:
            hint = INSTALL_HINTS.get(self.package, f"pip install {self.package}")
            return f"the {self.package} package is not installed ({hint})"
        return None if self.extra is None else self.extra(where)


ANYWHERE = Requires()


@dataclass(frozen=True)
class Entry(Generic[F]):
    factory: F
    requires: Requires = ANYWHERE


class Registry(Generic[F]):
    def __init__(self, option: str, preferred: Sequence[str] = ()) -> None:
        """option: the EngineConfig field that names an entry; preferred: what "auto" tries before the reference."""
        self.option = option
        self.preferred = tuple(preferred)
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, factory: F, requires: Requires = ANYWHERE, replace: bool = False) -> None:
        """Add `name`, usable wherever `requires` holds; a taken name needs replace=True."""
        if not isinstance(name, str) or not name or name == "auto":
            raise ConfigError(f"{self.option}: {name!r} cannot be registered; use a non-empty name other than 'auto'")
        if name in self._entries and not replace:
            raise ConfigError(f"{self.option}={name!r} is already registered; pass replace=True to override it")
        self._entries[name] = Entry(factory, requires)

    def unregister(self, name: str) -> None:
        if name == REFERENCE:
            raise ConfigError(f"{self.option}: the reference {REFERENCE!r} cannot be removed")
        self._entries.pop(name, None)

    def names(self) -> list[str]:
        return sorted(["auto", *self._entries])

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unusable(self, name: str, where: Where) -> str | None:
        """Why `name` cannot serve at `where` (unknown names included), or None."""
        return self._unknown(name) if name not in self._entries else self._entries[name].requires.reason(where)

    def resolve(self, name: str, where: Where) -> str:
        if not isinstance(name, str):
            raise ConfigError(f"{self.option}={name!r} is invalid: use a string, e.g. 'auto'")
        if name == "auto":
            usable = [n for n in self.preferred if n in self and self.unusable(n, where) is None]
            return usable[0] if usable else REFERENCE
        reason = self._entry(name).requires.reason(where)
        if reason is not None:
            raise ConfigError(f"{self.option}={name!r} cannot be used: {reason}; use '{REFERENCE}' or 'auto'")
        return name

    def factory(self, name: str) -> F:
        return self._entry(name).factory

    def _unknown(self, name: str) -> str:
        return f"{self.option}={name!r} is unknown; known: {', '.join(self.names())}"

    def _entry(self, name: str) -> Entry[F]:
        if name not in self._entries:
            raise ConfigError(self._unknown(name))
        return self._entries[name]
