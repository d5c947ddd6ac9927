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
    """KV pages or page-table rows ran out. Requests already running are unaffected."""


class EngineClosedError(EngineError):
    """The engine was used after shutdown()."""
