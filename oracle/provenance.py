"""What a report records of where its code and settings came from, without torch: each plugin module loaded (its
name, file, the file's sha256 and its version), the environment variables the harness and plugins read (an
allow-list of names and prefixes that ``$HFPARITY_ENV_ALLOW`` or an option extends; nothing else is recorded, so no
secret leaks into a report) and the run's UTC timestamp. Shared by ``verify`` and the pytest plugin."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

ENV_ALLOW_ENV = "HFPARITY_ENV_ALLOW"
# Entries ending in * are prefixes. What the harness, the engine, torch's threads and devices, and plugins read.
ENV_ALLOW = (
    "HFPARITY_*",
    "ENGINE_*",
    "EXAMPLE_*",
    "FLASHINFER_*",
    "TRITON_*",
    "PYTORCH_*",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "HYPOTHESIS_PROFILE",
)


@dataclass(frozen=True)
class PluginFile:
    """A loaded plugin module: its name, its file and the file's sha256 (None for a namespace or built-in module),
    and its version (``__version__``, else its distribution's, else None)."""

    module: str
    file: str | None
    sha256: str | None
    version: str | None


def env_allow(extra: Iterable[str] = ()) -> list[str]:
    """The allow-list: ENV_ALLOW, then $HFPARITY_ENV_ALLOW's comma-separated entries, then `extra`, each once."""
    from_env = [entry.strip() for entry in os.environ.get(ENV_ALLOW_ENV, "").split(",")]
    return list(dict.fromkeys(e for e in [*ENV_ALLOW, *from_env, *extra] if e))


def allowed(name: str, allow: Sequence[str]) -> bool:
    return any(name.startswith(e[:-1]) if e.endswith("*") else name == e for e in allow)


def recorded_env(extra: Iterable[str] = (), environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The set variables the allow-list (plus `extra`) names, sorted by name."""
    allow = env_allow(extra)
    return {name: environ[name] for name in sorted(environ) if allowed(name, allow)}


def _version(module: str) -> str | None:
    declared = getattr(sys.modules[module], "__version__", None)
    if isinstance(declared, str):
        return declared
    for dist in packages_distributions().get(module.partition(".")[0], []):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def plugin_files(loaded: Iterable[str]) -> list[PluginFile]:
    """The provenance of each loaded plugin (a module name, or an entry point's ``module:attr``), imported already."""
    out = []
    for name in loaded:
        module = name.partition(":")[0]
        file = getattr(sys.modules[module], "__file__", None)
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else None
        out.append(PluginFile(module, file, digest, _version(module)))
    return out


def utc_timestamp() -> str:
    """Now, in UTC, as ISO 8601 to the second (e.g. 2026-01-31T12:00:00+00:00)."""
    return datetime.now(UTC).isoformat(timespec="seconds")
