"""Where a run happened, for verify's report and the benchmarks' results: the checkout's git commit, the library
versions and the device's name (the GPU's on a CUDA target, else the CPU model)."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from . import __version__
from .target import Target

COMMIT_ENV = "HFPARITY_COMMIT"
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Environment:
    """Where the run happened: the harness's commit, library versions and the device's name."""

    commit: str
    versions: dict[str, str]
    device: str


def git_commit() -> str:
    """$HFPARITY_COMMIT, else the checkout's HEAD with "+dirty" when tracked files changed (only if this package sits
    in a git checkout), else "unknown"."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    if not (REPO_ROOT / ".git").exists():  # an installed copy: a parent repo's HEAD would be someone else's
        return "unknown"

    def git(*args: str) -> str:
        cmd = ["git", "-C", str(REPO_ROOT), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()

    try:
        sha, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if sha and dirty else "")


def flashinfer_version() -> str | None:
    if importlib.util.find_spec("flashinfer") is None:
        return None
    for dist in ("flashinfer-python", "flashinfer"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def library_versions() -> dict[str, str]:
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hfparity-engine": __version__,
    }
    flashinfer = flashinfer_version()
    if flashinfer is not None:
        versions["flashinfer"] = flashinfer
    return versions


def device_name(target: Target) -> str:
    """The GPU's name on a CUDA target, else the CPU model."""
    if target.device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(target.torch_device)
    return cpu_model()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def environment(target: Target) -> Environment:
    return Environment(git_commit(), library_versions(), device_name(target))
