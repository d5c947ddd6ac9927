"""An op-level verdict in one message: the op, the implementation, the shapes and dtype of the call, how many
elements broke the contract, and the worst of them with both values and its bound.

Contracts: ``bitwise`` (the bytes must equal the reference's, NaN included: the reference is the op's exact
statement at the same dtype) or a bound from :mod:`oracle.tolerance` (elementwise, against a float64 reference).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def describe(tensors: Mapping[str, torch.Tensor], **scalars: object) -> str:
    """``x[37, 1025] bfloat16 (strided), weight[1025] bfloat16, eps=1e-06``."""
    parts = []
    for name, t in tensors.items():
        layout = "" if t.is_contiguous() else " (strided)"
        parts.append(f"{name}[{', '.join(map(str, t.shape))}] {str(t.dtype).removeprefix('torch.')}{layout}")
    parts += [f"{k}={v!r}" for k, v in scalars.items()]
    return ", ".join(parts)


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return tuple(reversed(out))


def assert_bitwise(op: str, call: str, name: str, actual: torch.Tensor, reference: torch.Tensor) -> None:
    """Equal shapes, dtypes and bytes (NaN payloads aside: any NaN equals any NaN)."""
    _same_shape(op, call, name, actual, reference)
    a, r = actual.detach().cpu(), reference.detach().cpu()
    differ = ~((a == r) | (a.isnan() & r.isnan())) if a.is_floating_point() else a != r
    if bool(differ.any()):
        flat = int(differ.flatten().nonzero()[0])
        at = _index(flat, a.shape)
        raise AssertionError(
            f"op {op} at {call}: {int(differ.sum())} of {differ.numel()} elements of {name} differ from the "
            f"reference (contract: bitwise)\n  first at {at}: got {a[at].item()!r}, reference {r[at].item()!r}"
        )


def assert_within(
    op: str, call: str, name: str, actual: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, contract: str
) -> None:
    """|actual - exact| <= bound elementwise (exact in float64; a NaN anywhere fails)."""
    _same_shape(op, call, name, actual, exact)
    a, e = actual.detach().cpu().double(), exact.detach().cpu().double()
    bound = bound.detach().cpu().double().expand_as(e)
    gap = (a - e).abs()
    bad = ~(gap <= bound)  # NaN compares False: it is out of bound
    if bool(bad.any()):
        excess = torch.where(bad, (gap - bound).nan_to_num(nan=float("inf")), float("-inf"))
        flat = int(excess.flatten().argmax())
        at = _index(flat, a.shape)
        raise AssertionError(
            f"op {op} at {call}: {int(bad.sum())} of {bad.numel()} elements of {name} outside the bound "
            f"({contract})\n  worst at {at}: got {a[at].item()!r}, reference {e[at].item()!r} "
            f"(|diff| {gap[at].item():.6g}, bound {bound[at].item():.6g})"
        )


def _same_shape(op: str, call: str, name: str, actual: torch.Tensor, reference: torch.Tensor) -> None:
    if actual.shape != reference.shape:
        raise AssertionError(
            f"op {op} at {call}: {name} has shape {tuple(actual.shape)}, the reference {tuple(reference.shape)}"
        )
