"""python -m benchmarks.compare: runs the command line (cli.main)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
