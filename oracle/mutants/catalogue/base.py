"""What a mutant is: a :class:`Mutant` names a bug, the public fixes of its class and the :data:`Patch` that
carries it; every patch applies through :func:`swap`, one attribute replaced for a block and restored exactly."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Patch = Callable[[], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str  # what the patched engine does wrong
    seen: str  # public fixes of this bug class in real engines, so the catalogue is not made up
    patch: Patch
    # The device whose code path carries the bug: a kill table runs the mutants of its target's device only
    # (a FlashInfer or CUDA-graph mutant is invisible on CPU, a torch-backend one on the GPU path).
    device: str = "cpu"
    # Target fields the buggy path needs, as (field, value) (e.g. ("attention", "triton")): a target that picks
    # another backend, or runs without graphs, never takes it.
    needs: tuple[tuple[str, object], ...] = ()


@contextlib.contextmanager
def swap(owner: object, attr: str, replacement: object) -> Iterator[None]:
    """Set ``owner.attr = replacement`` for the duration of the block; restore the exact original after."""
    original = vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, original)
