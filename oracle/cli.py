"""What the command lines (``verify``, ``oracle.zoo``, ``oracle.mutants``) share: bad usage found after parsing
(:class:`UsageError`, one line naming the option and the value, exit 2), argparse types for bounded numbers, and the
checks that an output can be written and takes nothing of the user's, run before any work so that a bad path costs no
run and creates nothing."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path

from .plugins import plugin_sources
from .target_spec import target_file, target_text


class UsageError(Exception):
    """Bad usage found after parsing; the message names the option, its value and why."""


Owned = Callable[[Path], bool]  # whether an existing file is one this tool wrote (so a rerun may replace it)


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int in [low, high] (high None: no upper bound)."""
    want = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: use {want}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: use {want}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use a finite number of seconds > 0")
    return value


def _check_ancestor(option: str, path: Path) -> None:
    """Raise UsageError unless the first existing ancestor of `path` is a writable dir (the rest is made later)."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{option}: cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option}: cannot write {path}: {parent} is not writable")


def check_writable(option: str, path: Path) -> None:
    """Raise UsageError unless a file can be written at `path` (which `option` names); creates nothing."""
    if path.is_dir():
        raise UsageError(f"{option}: cannot write {path}: it is a directory")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option}: cannot write {path}: the file is not writable")
        return
    _check_ancestor(option, path)


def check_dir(option: str, path: Path) -> None:
    """Raise UsageError unless `path` is a writable dir or can be made one; creates nothing."""
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{option}: cannot write into {path}: it is not writable")
        return
    if path.exists():
        raise UsageError(f"{option}: cannot write into {path}: it is not a directory")
    _check_ancestor(option, path)


def check_distinct(outputs: Sequence[tuple[str, Path]]) -> None:
    """Raise UsageError if two outputs (option, path) are one file, or one would be a directory of the other."""
    for (a, path_a), (b, path_b) in combinations(outputs, 2):
        real_a, real_b = path_a.resolve(), path_b.resolve()
        if real_a == real_b:
            raise UsageError(f"{a} and {b} both write {path_a}")
        if real_a in real_b.parents:
            raise UsageError(f"{b} writes {path_b} inside {path_a}, which {a} writes as a file")
        if real_b in real_a.parents:
            raise UsageError(f"{a} writes {path_a} inside {path_b}, which {b} writes as a file")


def carries(marker: bytes, head: int = 4096) -> Owned:
    """An Owned test: the file's first `head` bytes hold `marker`, which only this tool's report of that kind has."""

    def owned(path: Path) -> bool:
        try:
            with path.open("rb") as fh:
                return marker in fh.read(head)
        except OSError:
            return False

    return owned


def _within(path: Path, source: Path) -> bool:
    """Whether `path` is `source` (a hard link included) or lies under it."""
    real, base = path.resolve(), source.resolve()
    if real == base or base in real.parents:
        return True
    return path.exists() and source.exists() and os.path.samefile(path, source)


def read_inputs(plugins: Sequence[str], target: str | None) -> list[tuple[str, Path]]:
    """What a run reads besides a model, as (option, path): the plugins' sources and a target TOML file."""
    toml = target_file(target_text(target))
    return [*plugin_sources(plugins), *([("--target", toml)] if toml else [])]


def check_not_input(option: str, path: Path, inputs: Sequence[tuple[str, Path]]) -> None:
    """Raise UsageError if `path` is or lies inside an input (option, path): --force never allows that."""
    for name, source in inputs:
        if _within(path, source):
            raise UsageError(f"{option}: refusing to write {path}: it is or lies inside the input {name} {source}")


def check_output(option: str, path: Path, inputs: Sequence[tuple[str, Path]], owned: Owned, force: bool) -> None:
    """The rule for every output file: raise UsageError if it is or lies inside an input, cannot be written, or is
    an existing file that `owned` does not claim as this tool's and `force` is off."""
    check_not_input(option, path, inputs)
    check_writable(option, path)
    if path.exists() and not force and not owned(path):
        raise UsageError(f"{option}: refusing to replace {path}: this tool did not write it (--force replaces it)")
