"""Number and token-list checks of the values callers hand the engine: each names the field it refuses."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import TypeGuard

import torch

from .errors import EngineError, InvalidRequestError


def is_int(x: object) -> TypeGuard[int]:
    """An integer of any kind (Python, NumPy), but not a bool."""
    return type(x) is int or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def is_real(x: object) -> TypeGuard[float]:
    return type(x) in (int, float) or (isinstance(x, numbers.Real) and not isinstance(x, bool))


def checked_int(
    error: type[EngineError], name: str, value: object, ok: Callable[[int], bool], hint: str
) -> int:
    if is_int(value) and ok(int(value)):
        return int(value)
    raise error(f"{name}={value!r} is invalid: {hint}")


def checked_real(
    error: type[EngineError], name: str, value: object, ok: Callable[[float], bool], hint: str
) -> float:
    """value as a Python float if ok() holds (NaN never passes); else error naming the field."""
    if is_real(value):
        try:
            number = float(value)
        except OverflowError:
            number = math.nan
        if not math.isnan(number) and ok(number):
            return number
    raise error(f"{name}={value!r} is invalid: {hint}")


def checked_seed(error: type[EngineError], name: str, value: object) -> int:
    """An int in [0, 2**63), the range every generator takes whole."""
    return checked_int(error, name, value, lambda v: 0 <= v < 2**63, "use an int in [0, 2**63) or None")


def checked_bool(error: type[EngineError], name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise error(f"{name}={value!r} is invalid: use True or False")


def token_list(ids: object, name: str) -> list[int]:
    """A sequence of ints or a 1-D integer tensor/array as a new list of ints (not range-checked)."""
    if not isinstance(ids, torch.Tensor) and hasattr(ids, "__array__") and hasattr(ids, "dtype"):
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, RuntimeError):
            raise InvalidRequestError(
                f"{name} must be a 1-D integer array, got an array of dtype {ids.dtype}"
            ) from None
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise InvalidRequestError(
                f"{name} must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}"
            )
        return ids.detach().to("cpu", torch.int64).tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidRequestError(f"{name} must be a list of ints or a 1-D integer tensor, got {type(ids).__name__}")
    values = list(ids)
    bad = next((i for i, t in enumerate(values) if not is_int(t)), None)  # an index: the value may be None
    if bad is not None:
        raise InvalidRequestError(
            f"{name} must hold ints, got {values[bad]!r} of type {type(values[bad]).__name__} at index {bad}"
        )
    return [int(t) for t in values]
