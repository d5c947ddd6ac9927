"""``python -m oracle verify --model DIR [--target T] [--plugin MODULE ...] [--quick] [--out DIR] [--json F]
[--report F] [--junit F] [--seed N] [--record-env NAME ...] [--verbose] [--debug]``, also installed as
``hfparity-verify`` (the same options, without the word ``verify``). Exit status: see EXIT_STATUS (also in --help).
Only argument parsing is imported here: torch and the engine load once the usage checks pass (:mod:`.verify_cli`).
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .verify_cli import EXIT_STATUS, add_verify_arguments, run


def verify_parser(prog: str = "hfparity-verify") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Verify the engine against HF on one model dir.", epilog=EXIT_STATUS
    )
    add_verify_arguments(parser)
    return parser


def verify_main(argv: list[str] | None = None) -> int:
    """The verify command without its subcommand word (the ``hfparity-verify`` console script)."""
    return run(verify_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle", description="Verification of the engine against HF.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_verify_arguments(
        sub.add_parser("verify", help="run the verification report on one model dir", epilog=EXIT_STATUS)
    )
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
