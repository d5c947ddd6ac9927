"""Where the zoo's model directories live and how one is published: the cache directory (``$ENGINE_CACHE_DIR``, else
``<repo root>/.cache``), the marker file that tells a finished directory from a half-written or foreign one, the
atomic publish (build into a temporary sibling, then rename) and the lock that serializes builders of one directory,
plus the plumbing both builders share: the typed build error, a streamed sha256 and a switch that silences
transformers while it works.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

# oracle/zoo/cache.py -> the repository root, three levels up.
REPO_ROOT: Final = Path(__file__).resolve().parent.parent.parent
CACHE_ENV: Final = "ENGINE_CACHE_DIR"

# Written last, just before the rename: a directory without it was not built by this module.
MARKER: Final = "zoo.json"


class ModelBuildError(RuntimeError):
    """Building a model directory failed; the message names the step and a hint."""

    def __init__(self, step: str, message: str, hint: str) -> None:
        self.step = step
        self.hint = hint
        super().__init__(f"[{step}] {message}\n  hint: {hint}")


def default_cache_dir() -> Path:
    """``$ENGINE_CACHE_DIR`` if set, else ``<repo root>/.cache``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else REPO_ROOT / ".cache"


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished model directory written by this module."""
    return (path / MARKER).is_file() and (path / "config.json").is_file()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed so large files need no memory."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    """Silence transformers' logging and every tqdm bar while ``enabled``."""
    if not enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # The GGUF converter uses a bare tqdm, which only a stderr redirect reaches.
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _publish(build: Callable[[Path], dict[str, Any]], final: Path) -> Path:
    """Run ``build`` into a temp sibling of ``final``, then rename it into place atomically.

    Call with ``_lock(final)`` held: temp siblings found then belong to a killed build.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() and not is_complete(final):
        raise ModelBuildError(
            "publish",
            f"{final} exists but was not written by oracle.zoo (no {MARKER})",
            "delete that directory, or choose another cache dir",
        )
    for stale in final.parent.glob(f".{final.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    # A sibling so the rename stays on one filesystem; the dot keeps it out of the way.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would otherwise make a shared cache private to one user
    try:
        info = build(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for child in tmp.iterdir():
            child.chmod(0o644)  # safetensors files come out 0600; a cache may be shared read-only
        try:
            tmp.rename(final)
        except OSError:
            # Another process published the same directory first; theirs is just as good.
            if not is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Serialize builders of one directory, so concurrent callers don't all redo the work."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        yield
