"""A step's outputs (ForwardOutput) and its undo (StepRecord, handed the parts of the engine it touches rather than the
engine), which puts the step back before its error is raised."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core import Batch
from ..device import Device, Event, upload
from ..sample import BatchSamplingArgs
from ..validate import Limits
from .slots import slot_error

RaiseForRows = Callable[[list[int], BatchSamplingArgs, torch.Tensor], None]


@dataclass
class ForwardOutput:
    """One step's tokens: on the device at once (the caller's stream is ordered after the step), on the host behind
    copy_done_event; result() raises the step's errors after undoing it."""

    next_tokens_gpu: torch.Tensor  # int32 [bs]; -1 on a row with nothing to sample
    copy_done_event: Event
    logits: torch.Tensor  # float32 [bs, vocab]
    # int32 [2 n + 1] (n: batch or padded size): tokens, slot verdict, the rows' last tokens before the step
    host: torch.Tensor
    step: StepRecord

    def wait(self) -> None:
        self.copy_done_event.synchronize()

    @property
    def failed(self) -> bool:
        self.wait()
        return self.step.failed(self.host)

    def undo(self) -> None:
        """Put the requests' lengths, live rows, random streams and rows' last tokens back (once); undo a later step
        first."""
        self.wait()
        self.step.undo(self.host)

    def result(self) -> torch.Tensor:
        """The host tokens, int32 [bs]; a failed step is undone, then raises InvalidRequestError (slots) or
        NonFiniteLogitsError."""
        if self.failed:
            self.undo()
            self.step.raise_error(self.host)
        return self.host[: self.step.size]

    @property
    def next_tokens_cpu(self) -> torch.Tensor:
        return self.result()


@dataclass
class StepRecord:
    batch: Batch
    args: BatchSamplingArgs
    logits: torch.Tensor
    undo_draws: Callable[[], None]
    live_before: list[tuple[int, tuple[int, int] | None]]
    live_rows: dict[int, tuple[int, int]]  # the engine's, changed in place
    last_tokens: torch.Tensor
    device: Device
    raise_for_rows: RaiseForRows
    page_table: torch.Tensor
    limits: Limits
    undone: bool = False

    @property
    def size(self) -> int:
        return self.batch.size

    def refused(self, host: torch.Tensor) -> bool:
        return bool(host[(host.numel() - 1) // 2])

    def failed(self, host: torch.Tensor) -> bool:
        values = host[: self.size].tolist()  # one conversion: a host tensor's own ops cost µs each, twice a step
        return (bool(values) and min(values) < 0) or self.refused(host)

    def undo(self, host: torch.Tensor) -> None:
        if self.undone:
            return
        self.undone = True
        batch, live_rows = self.batch, self.live_rows
        for req, (cached_len, device_len) in zip(batch.reqs, batch.spans):
            req.cached_len, req.device_len = cached_len, device_len
        for (row, live), req, end in zip(self.live_before, batch.reqs, batch.ends):
            if live_rows.get(row) != (end, req.uid):
                continue  # released or taken over since
            if live is None:
                live_rows.pop(row, None)
            else:
                live_rows[row] = live
        start = (host.numel() + 1) // 2
        before = torch.tensor(host[start : start + self.size].tolist(), dtype=torch.int32)
        rows = torch.tensor([req.table_idx for req in batch.reqs])
        device = self.device.torch_device
        with self.device.stream_context():
            self.last_tokens.index_copy_(0, upload(rows, device), upload(before, device))
        self.undo_draws()

    def raise_error(self, host: torch.Tensor) -> None:
        if self.refused(host):
            raise slot_error(self.batch, self.page_table, self.limits, self.live_rows)
        bad = (host[: self.size] < 0).nonzero().flatten().tolist()
        self.raise_for_rows(bad, self.args, self.logits)

