"""The engine's error types. Every rejected input raises one of these, before any state changes."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """A request, batch or sampling parameter is invalid. Nothing was written."""


class ConfigError(EngineError, ValueError):
    """An EngineConfig field is invalid or cannot be served on this machine."""


class ModelLoadError(EngineError):
    """A model directory is missing files, or its tensors do not match the architecture."""


class CapacityError(EngineError):
    """KV pages, page-table rows or memory ran out. Requests already running are unaffected."""


class EngineClosedError(EngineError):
    """The engine was used after shutdown()."""


class EngineBusyError(EngineError):
    """The engine or driver is in use by another thread, or by another StaticDriver; nothing was done."""


class NonFiniteLogitsError(EngineError):
    """Some rows have no token to sample (non-finite logits or overflowing temperature); raised by
    ForwardOutput.result once the step is undone: abort ``uids`` and rerun the others, who get the same tokens."""

    def __init__(self, message: str, rows: list[int], uids: list[int]) -> None:
        super().__init__(message)
        self.rows = rows  # indices into the batch
        self.uids = uids
