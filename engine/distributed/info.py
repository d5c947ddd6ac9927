"""Tensor-parallel rank information."""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import is_int
from ..errors import ConfigError


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not is_int(self.size) or self.size < 1:
            raise ConfigError(f"TPInfo size={self.size!r} is invalid: use an int >= 1")
        if not is_int(self.rank) or not 0 <= self.rank < self.size:
            raise ConfigError(f"TPInfo rank={self.rank!r} is invalid: use an int in [0, size={self.size})")
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "rank", int(self.rank))

    @property
    def is_primary(self) -> bool:
        return self.rank == 0
