"""A first import of the plugins in a child process: a plugin that ends the process on import (``os._exit(0)``)
would otherwise end the command with its status and no report, a pass if it is 0. The child imports them and exits
with PROBE_OK (a plugin that raises included: the import in this process then reports it as a PluginError)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from .plugins import ENTRY_POINT_GROUP, PluginError, plugin_names

PROBE_OK = 86
_SCRIPT = f"""
import os, sys
from oracle.plugins import PluginError, load_plugins
try:
    load_plugins(sys.argv[1:])
except PluginError:
    pass
os._exit({PROBE_OK})
"""


def probe_plugins(options: Sequence[str]) -> None:
    """Raise PluginError if importing the plugins (named ones, $HFPARITY_PLUGINS', the entry points') ends the
    process; a no-op without plugins. The child sees this process's sys.path and environment."""
    if not plugin_names(options) and not entry_points(group=ENTRY_POINT_GROUP):
        return
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *options], env=env, capture_output=True, text=True)
    if proc.returncode != PROBE_OK:
        names = ", ".join(plugin_names(options)) or f"the {ENTRY_POINT_GROUP} entry points"
        raise PluginError(
            f"importing the plugins ({names}) ended the process with exit status {proc.returncode} before they "
            "finished loading (os._exit or a crash in a plugin)"
        )
