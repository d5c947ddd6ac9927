"""Loading the user's own kernels: a plugin is a module that registers implementations in the engine's registries
(``engine.ATTENTION_BACKENDS``, ``LAYER_KERNELS``, ``STEP_KERNELS``, ``MOE_BACKENDS``, ``SAMPLERS``) when imported;
step kernels registered under a layer kernels' name go with them (Target.step_kernels).

Plugins come from ``--plugin MODULE`` (pytest, ``verify`` and the mutant table), from ``$HFPARITY_PLUGINS``
(comma-separated, for tox) and from every installed distribution's ``hfparity.plugins`` entry points. A target then
names what they registered, e.g. ``--target cpu-fp32,attention=mine``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

PLUGINS_ENV = "HFPARITY_PLUGINS"
ENTRY_POINT_GROUP = "hfparity.plugins"


# A plugin's sys.exit() or KeyboardInterrupt on import must not end the run as a pass or a bare traceback.
IMPORT_FAILURES = (Exception, SystemExit, KeyboardInterrupt)


class PluginError(ImportError):
    """A plugin module that does not import, or whose factory raised; the message names it and the cause."""


def plugin_names(options: Iterable[str] = ()) -> list[str]:
    """The modules named by options and $HFPARITY_PLUGINS, in that order, each once."""
    from_env = [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",")]
    return list(dict.fromkeys(name for name in [*options, *from_env] if name))


def import_error(name: str, exc: BaseException) -> PluginError:
    """The error for plugin `name` that did not import; where the module itself (or a parent) is missing, where
    Python looks for it and from where it ran."""
    message = f"plugin {name!r} could not be imported: {type(exc).__name__}: {exc}"
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is not None and (name == missing or name.startswith(missing + ".")):  # not a module it imports
        message += (
            "; MODULE must be importable: on sys.path, e.g. run from the directory holding it or add that "
            f"directory to PYTHONPATH (current directory: {os.getcwd()})"
        )
    return PluginError(message)


def check_findable(options: Iterable[str] = ()) -> None:
    """Raise PluginError for a named plugin that is not on sys.path, without importing it (its parents are)."""
    for name in plugin_names(options):
        try:
            found = importlib.util.find_spec(name)
        except IMPORT_FAILURES as exc:  # a parent package that is missing or raises on import
            raise import_error(name, exc) from exc
        if found is None:
            raise import_error(name, ModuleNotFoundError(f"No module named {name!r}", name=name))


def plugin_sources(options: Iterable[str] = ()) -> list[tuple[str, Path]]:
    """Each findable named plugin's source (a package's dir, else its file), as (``--plugin NAME``, path): inputs that
    no output may overwrite."""
    sources = []
    for name in plugin_names(options):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            sources += [(f"--plugin {name}", Path(p)) for p in spec.submodule_search_locations]
        elif spec is not None and spec.origin and Path(spec.origin).is_file():
            sources.append((f"--plugin {name}", Path(spec.origin)))
    return sources


def load_plugins(options: Iterable[str] = ()) -> list[str]:
    """Import every plugin (named ones, then entry points); returns the names loaded. Importing twice is a no-op.
    What each registers has its factory guarded (oracle.plugin_guard): its exceptions name the plugin."""
    from .plugin_guard import blaming  # imports the engine: check_findable stays torch-free

    loaded = []
    for name in plugin_names(options):
        try:
            with blaming(name):
                importlib.import_module(name)
        except IMPORT_FAILURES as exc:
            raise import_error(name, exc) from exc
        loaded.append(name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            with blaming(ep.name):
                ep.load()
        except IMPORT_FAILURES as exc:
            raise PluginError(f"plugin entry point {ep.name!r} ({ep.value}): {type(exc).__name__}: {exc}") from exc
        loaded.append(ep.value)
    return loaded
