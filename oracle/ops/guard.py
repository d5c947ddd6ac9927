"""Guard regions: every op-level input lives inside a larger buffer whose other elements hold poison, and every
buffer is compared bitwise after the call.

A kernel that reads past a row (a tile tail without its mask, a stride taken for the row length) reads NaN and its
output shows it; a kernel that writes anywhere but its declared outputs changes a byte of some guarded buffer and
the example fails, naming the buffer and the first changed element. Strided views (a gap after each row) are how
the op-level strategies draw non-contiguous inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

PAD = 64
"""Poisoned elements before and after every guarded input."""


def poison_for(dtype: torch.dtype) -> float:
    """NaN for floats (any read of it shows in the output); -1 for integers (never a valid id, slot or row)."""
    return math.nan if dtype.is_floating_point else -1


@dataclass
class Guarded:
    """A view handed to an op and the whole buffer around it, with the buffer's bytes as they were."""

    name: str
    view: torch.Tensor
    buffer: torch.Tensor
    before: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.before = _bytes(self.buffer).clone()

    def changed(self, outside_view: bool = False) -> list[int]:
        """Indices (in buffer elements) of every element whose bytes changed since the snapshot; outside_view: only
        the guard region and the gaps (the view is an output the op may write)."""
        now = _bytes(self.buffer).view(-1, self.buffer.element_size())
        was = self.before.view(-1, self.buffer.element_size())
        moved = (now != was).any(dim=1)
        if outside_view:
            inside = torch.arange(self.buffer.numel(), device=self.buffer.device)
            moved[inside.as_strided(self.view.shape, self.view.stride(), self.view.storage_offset())] = False
        return moved.nonzero().flatten().tolist()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(torch.uint8)


def guarded(name: str, values: torch.Tensor, gap: int = 0) -> Guarded:
    """`values` copied into the middle of a poisoned 1-D buffer, as a view of the same shape whose rows (the first
    dim) are `gap` elements further apart than a contiguous tensor's."""
    rows = values.shape[0] if values.dim() else 1
    inner = values[0].numel() if values.dim() and rows else values.numel()
    pitch = inner + gap
    buffer = torch.full((2 * PAD + rows * pitch,), poison_for(values.dtype), dtype=values.dtype, device=values.device)
    body = buffer[PAD : PAD + rows * pitch].view(rows, pitch)[:, :inner]
    view = body.view(values.shape) if values.dim() else buffer[PAD]
    view.copy_(values)
    return Guarded(name, view, buffer)


def assert_untouched(op: str, buffers: list[Guarded], outputs: tuple[Guarded, ...] = ()) -> None:
    """AssertionError naming the first guarded buffer (an input, or the poison around it) that the op wrote; of
    `outputs` (buffers the op writes in place) only the guard regions and gaps count."""
    for g in [*buffers, *outputs]:
        changed = g.changed(outside_view=g in outputs)
        if changed:
            first = changed[0]
            where = "the input or the gaps between its rows" if _inside(g, first) else "its guard region"
            raise AssertionError(
                f"op {op} wrote {len(changed)} element(s) of {g.name} ({where}): first at buffer element {first}, "
                f"{float(g.before.view(g.buffer.dtype)[first])!r} became {float(g.buffer[first])!r}"
            )


def _inside(g: Guarded, index: int) -> bool:
    """Whether a buffer element lies between the guard pads (the input, or a gap between its rows)."""
    return PAD <= index < g.buffer.numel() - PAD
