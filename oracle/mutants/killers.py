"""Which tests kill each mutant: ``mutants.toml`` at the root of the checkout, beside the suites it names (tests/,
properties/), so the library names no test file. The kill table reads it from the checkout it runs; run where there
is none (an installed oracle without its suites), it stops with an error saying so.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import MUTANTS

REPO_ROOT = Path(__file__).resolve().parents[2]
KILLERS_FILE = REPO_ROOT / "mutants.toml"
_KEYS = ("targets", "fast", "fast_profile")


class KillersError(ValueError):
    """mutants.toml is missing, or does not describe the catalogue; the message says where."""


@dataclass(frozen=True)
class Killers:
    """pytest arguments: `targets`, the full run (every property module and test that should kill the mutant);
    `fast`, the CI configuration (the cheapest killer, run with -x under `fast_profile`)."""

    targets: tuple[str, ...]
    fast: tuple[str, ...]
    fast_profile: str = "dev"


def _node_ids(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise KillersError(f"{where}: use a non-empty list of pytest node ids")
    return tuple(value)


def parse_killers(text: str, source: str = "mutants.toml") -> dict[str, Killers]:
    """mutant name -> its Killers, from the TOML text of `source`: one table per mutant of the catalogue."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KillersError(f"{source}: {exc}") from None
    missing, unknown = [n for n in MUTANTS if n not in data], sorted(set(data) - set(MUTANTS))
    if missing or unknown:
        raise KillersError(f"{source}: no table for mutant(s) {missing}, tables for unknown mutant(s) {unknown}")
    out = {}
    for name in MUTANTS:
        table = data[name]
        extra = sorted(set(table) - set(_KEYS)) if isinstance(table, dict) else []
        if not isinstance(table, dict) or extra:
            raise KillersError(f"{source} [{name}]: use the keys {', '.join(_KEYS)} (got {extra or table!r})")
        profile = table.get("fast_profile", "dev")
        if not isinstance(profile, str) or not profile:
            raise KillersError(f"{source} [{name}] fast_profile: use a Hypothesis profile's name")
        where = f"{source} [{name}]"
        out[name] = Killers(_node_ids(f"{where} targets", table.get("targets")),
                            _node_ids(f"{where} fast", table.get("fast")), profile)
    return out


@cache
def killers(path: Path = KILLERS_FILE) -> dict[str, Killers]:
    """The killers of every mutant, read once from `path` (the checkout's mutants.toml)."""
    if not path.is_file():
        raise KillersError(
            f"{path} not found: the kill table runs the suites of a checkout (tests/, properties/ and mutants.toml "
            "beside them); run python -m oracle.mutants from one, or with one on PYTHONPATH"
        )
    return parse_killers(path.read_text(encoding="utf-8"), str(path))
