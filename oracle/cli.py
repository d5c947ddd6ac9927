"""What the command lines (``verify``, ``oracle.zoo``, ``oracle.mutants``) share: bad usage found after parsing
(:class:`UsageError`, one line naming the option and the value, exit 2), argparse types for bounded numbers, and the
checks that an output can be written, run before any work so that a bad path costs no run and creates nothing."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path


class UsageError(Exception):
    """Bad usage found after parsing; the message names the option, its value and why."""


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
