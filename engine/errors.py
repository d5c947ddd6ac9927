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
    """Some rows of a batch have no token to sample: NaN or +inf logits, every logit -inf, or a temperature so
    small that logits / temperature overflows float32.

    Raised when the step's tokens are read (ForwardOutput.result), once the step is undone: the requests, the live
    rows and the random streams are as before forward_batch. Abort the requests in ``uids`` and run the others
    again; they get exactly the tokens they would have got without the bad rows (StaticDriver does this itself).
    """

    def __init__(self, message: str, rows: list[int], uids: list[int]) -> None:
        super().__init__(message)
        self.rows = rows  # indices into the batch
        self.uids = uids  # the requests' uids
