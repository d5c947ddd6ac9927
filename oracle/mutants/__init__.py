"""Negative controls: a catalogue of bugs real engines shipped, and the harness must catch every one.

Each :class:`Mutant` of the table (:mod:`oracle.mutants.table`) is a reversible monkeypatch of one engine function
(its patch is in :mod:`oracle.mutants.catalogue`); which tests must kill it is the suites' business, in
``mutants.toml`` beside them (:mod:`oracle.mutants.killers`). ``python -m oracle.mutants`` runs each mutant's killers
in a fresh pytest process with the mutant active (via the :mod:`oracle.mutants.plugin` plugin and ``$ENGINE_MUTANT``)
and prints a kill table; ``with activate("top_p_off_by_one"): ...`` applies one in-process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..target import Target
from .catalogue.base import Mutant
from .table import MUTANTS


def mutants_for(device: str, target: Target | None = None) -> list[str]:
    """The mutants a kill table on a target of this device type runs (and, given the target, whose needs it
    meets)."""
    return [
        name for name, m in MUTANTS.items()
        if m.device == device and (target is None or all(target.resolved(f) == v for f, v in m.needs))
    ]


@contextlib.contextmanager
def activate(name: str) -> Iterator[None]:
    """Apply the mutant ``name`` for the duration of the block; the engine is restored exactly afterwards."""
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(MUTANTS)}")
    with MUTANTS[name].patch():
        yield


__all__ = ["MUTANTS", "Mutant", "activate", "mutants_for"]
