"""oracle.provenance: the environment a report records is the allow-list's (extended by $HFPARITY_ENV_ALLOW and
by the caller, prefixes ending in *), nothing else; a plugin is recorded with its file, the file's sha256 and its
version; the timestamp is UTC."""

from __future__ import annotations

import hashlib
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from oracle.provenance import ENV_ALLOW_ENV, plugin_files, recorded_env, utc_timestamp

ENVIRON = {
    "HFPARITY_TARGET": "cpu-bf16",
    "ENGINE_CACHE_DIR": "/c",
    "OMP_NUM_THREADS": "1",
    "EXAMPLE_ATTENTION_BUG": "1e-3",
    "OMP_NUM_THREADS_X": "not an exact match",
    "HF_TOKEN": "secret",
    "MY_KNOB": "3",
    "MY_PREFIX_A": "a",
}


def test_only_allow_listed_variables_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ALLOW_ENV, raising=False)
    assert recorded_env(environ=ENVIRON) == {
        "ENGINE_CACHE_DIR": "/c", "EXAMPLE_ATTENTION_BUG": "1e-3", "HFPARITY_TARGET": "cpu-bf16", "OMP_NUM_THREADS": "1"
    }
    monkeypatch.setenv(ENV_ALLOW_ENV, " MY_KNOB, ")
    recorded = recorded_env(["MY_PREFIX_*"], environ=ENVIRON)
    assert {"MY_KNOB": "3", "MY_PREFIX_A": "a"}.items() <= recorded.items() and "HF_TOKEN" not in recorded


def test_a_plugin_is_recorded_with_its_file_hash_and_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "versioned_plugin.py").write_text("__version__ = '1.2'\n")
    (tmp_path / "plain_plugin.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("versioned_plugin", "plain_plugin"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        __import__(name)
    versioned, plain = plugin_files(["versioned_plugin", "plain_plugin:X"])  # a module, an entry point's value
    assert (versioned.module, versioned.version, plain.module, plain.version) == (
        "versioned_plugin", "1.2", "plain_plugin", None
    )
    path = tmp_path / "plain_plugin.py"
    assert plain.file == str(path) and plain.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    (pytest_file,) = plugin_files(["pytest"])  # a distribution's version where the module declares none
    assert pytest_file.version == pytest.__version__


def test_the_timestamp_is_utc() -> None:
    assert datetime.fromisoformat(utc_timestamp()).utcoffset() == timedelta(0)
