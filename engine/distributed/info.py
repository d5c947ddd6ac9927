"""Tensor-parallel rank information."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not (0 <= self.rank < self.size):
            raise ValueError(f"invalid TPInfo(rank={self.rank}, size={self.size})")

    @property
    def is_primary(self) -> bool:
        return self.rank == 0
