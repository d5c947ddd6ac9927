"""Writing a report all at once: the writer fills a temporary file beside the target, which is then renamed over it,
so an interrupted or failing run leaves the old file (or none), never half a report."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A fresh path beside `path` for the caller to write; renamed over `path` on success, removed on any error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same dir: os.replace is atomic only within one filesystem. Not created here, so the writer's umask applies.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
