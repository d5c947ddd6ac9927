"""The zoo's command line: ``python -m oracle.zoo smollm2 [--quiet] [--cache-dir DIR]`` builds SmolLM2-135M-Instruct
into the cache and ``python -m oracle.zoo tiny ARCH DIR`` creates a tiny random model under DIR; each prints the
model's directory last on stdout (progress goes to stderr). Bad usage exits 2 (a directory that cannot be made, or a
DIR/tiny-ARCH oracle.zoo did not write, included, checked before the build) and a failed build exits 1 with the step
and a hint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import UsageError, check_dir
from . import __doc__ as package_doc
from .cache import CACHE_ENV, MARKER, ModelBuildError, is_complete
from .smollm2 import SMOLLM2_NAME, smollm2_dir
from .tiny import TINY_ARCHS, tiny_model_dir


def main(argv: list[str] | None = None) -> int:
    # The package's summary line, as before the split, rather than this module's.
    parser = argparse.ArgumentParser(prog="python -m oracle.zoo", description=(package_doc or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_smol = sub.add_parser("smollm2", help=f"build {SMOLLM2_NAME}; prints its directory last")
    p_smol.add_argument("--cache-dir", type=Path, default=None, help=f"default: ${CACHE_ENV} or <repo>/.cache")
    p_smol.add_argument("--quiet", action="store_true", help="no progress output")
    p_tiny = sub.add_parser("tiny", help="create a tiny random model; prints its directory")
    p_tiny.add_argument("arch", choices=TINY_ARCHS)
    p_tiny.add_argument("dir", type=Path, help="parent directory; the model goes to DIR/tiny-ARCH")
    args = parser.parse_args(argv)
    option, where = ("--cache-dir", args.cache_dir) if args.command == "smollm2" else ("DIR", args.dir)
    try:
        # An existing dir may already hold the model, which needs no write; a missing one must be creatable.
        if where is not None and not where.is_dir():
            check_dir(option, where)
        model = args.dir / f"tiny-{args.arch}" if args.command == "tiny" else None
        if model is not None and model.exists() and not is_complete(model):  # the zoo never replaces what it lacks
            raise UsageError(f"DIR: refusing to write {model}: it exists and oracle.zoo did not write it (no {MARKER})")
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.command == "smollm2":
            path = smollm2_dir(args.cache_dir, progress=not args.quiet)
        else:
            path = tiny_model_dir(args.arch, args.dir)
    except (ModelBuildError, OSError) as exc:  # OSError: e.g. a read-only dir that does not hold the model yet
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
