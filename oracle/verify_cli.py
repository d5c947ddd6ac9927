"""The verify command's arguments and the checks of bad usage that need no torch: the target's spelling, the plugins'
presence on sys.path, the model dir and the outputs, all before :mod:`oracle.verify.command` imports torch, the
engine and rich, so that ``--help`` and a usage error answer at once (exit 2, nothing written)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .cli import Owned, UsageError, carries, check_distinct, check_output, int_in, read_inputs
from .plugins import PluginError, check_findable
from .target_spec import PRESETS, TARGET_ENV, TargetError, parse_spec, target_text

EXIT_STATUS = (
    "exit status: 0 every check passed; 1 a check failed; 2 bad usage or configuration (arguments, a target that "
    "cannot run here, a plugin that does not import or ends the process as it does, or whose factory raises as the "
    "first engine is built, a bad model dir, an output that cannot be written, that collides with another, that is "
    "or lies inside an input, or that replaces a file verify did not write and --force is not given; checked before "
    "the run, nothing written); 3 the model loaded but the engine raised or produced non-finite logits during the "
    "run (e.g. weights holding NaN): the reports are still written, with the error recorded as a check of status "
    "'error' and the other sections run."
)
QUICK_HELP = (
    "a shorter run: fewer prompts, fewer new tokens per prompt, fewer sampling grid points and fewer kernel examples "
    "per op (each sampling test draws more samples than in the full plan, being one of fewer tests)"
)

# What marks each report as verify's own, so that a rerun may replace it without --force.
JSON_MARK = b'"schema_version"'
MARKDOWN_HEADING = "# Verification report: "
JUNIT_NAME = "hfparity-verify"
PNG_SOFTWARE = "hfparity-verify"  # the plot's PNG "Software" text chunk


@dataclass(frozen=True)
class Outputs:
    json: Path
    report: Path
    junit: Path | None

    @property
    def png(self) -> Path:
        return self.report.with_suffix(".png")

    def named(self, args: argparse.Namespace) -> list[tuple[str, Path, Owned]]:
        """Each path with what an error calls it (its option, or ``--out DIR`` for a default path) and its mark."""
        out = f"--out {args.out}"
        report = "--report" if args.report else out
        named = [
            ("--json" if args.json else out, self.json, carries(JSON_MARK)),
            (report, self.report, carries(MARKDOWN_HEADING.encode())),
            (f"the plot of {report}", self.png, carries(PNG_SOFTWARE.encode())),
        ]
        junit = carries(f'<testsuites name="{JUNIT_NAME}"'.encode())
        return named + ([("--junit", self.junit, junit)] if self.junit else [])


def outputs_of(args: argparse.Namespace) -> Outputs:
    stem = f"verify-{Path(args.model).resolve().name}"
    return Outputs(args.json or args.out / f"{stem}.json", args.report or args.out / f"{stem}.md", args.junit)


def check_outputs(args: argparse.Namespace, outputs: Outputs) -> None:
    """Raise UsageError unless every output may be written (oracle.cli.check_output) and no two collide; creates
    nothing."""
    named = outputs.named(args)
    inputs = [("--model", Path(args.model)), *read_inputs(args.plugin, args.target)]
    for option, path, owned in named:
        check_output(option, path, inputs, owned, args.force)
    check_distinct([(option, path) for option, path, _ in named])


def check_usage(args: argparse.Namespace) -> Outputs:
    """The outputs, after every check that needs no torch; raises TargetError, PluginError or UsageError."""
    parse_spec(target_text(args.target))
    check_findable(args.plugin)
    if not Path(args.model).is_dir():
        raise UsageError(
            f"--model {args.model}: is not a directory; pass a Hugging Face model dir (config.json + "
            "*.safetensors; `python -m oracle.zoo smollm2` prints the default model's dir)"
        )
    outputs = outputs_of(args)
    check_outputs(args, outputs)
    return outputs


def add_verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face model dir (Llama, Qwen2, Qwen3, Qwen3-MoE)")
    p.add_argument(
        "--target",
        help=f"what to check: a preset ({', '.join(PRESETS)}) with ,key=value overrides, or FILE.toml "
        f"(default ${TARGET_ENV} or cpu-fp32)",
    )
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE first (repeatable)")
    p.add_argument("--json", type=Path, help="JSON output (default: OUT/verify-<model>.json)")
    p.add_argument(
        "--report", type=Path, help="markdown report (default: OUT/verify-<model>.md); the plot goes beside it"
    )
    p.add_argument("--junit", type=Path, help="also write a JUnit XML report here (one testcase per check)")
    p.add_argument("--out", type=Path, default=Path("reports"), help="default output dir (default: reports/)")
    p.add_argument(
        "--force", action="store_true", help="replace existing output files verify did not write (never an input)"
    )
    p.add_argument("--quick", action="store_true", help=QUICK_HELP)
    p.add_argument(
        "--seed", type=int_in(0, 2**63 - 1), default=0, help="seed of prompts and sampling, in [0, 2**63) (default 0)"
    )
    p.add_argument(
        "--record-env",
        action="append",
        default=[],
        metavar="NAME",
        help="also record this environment variable in the reports (NAME* for a prefix; repeatable; "
        "$HFPARITY_ENV_ALLOW takes a comma-separated list too)",
    )
    p.add_argument("--verbose", action="store_true", help="list every check in the final table, not one row a section")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse, check usage, then run verify (importing torch only then); the exit status."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 after --help / --version
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        outputs = check_usage(args)
    except (PluginError, TargetError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .verify.command import execute

    return execute(args, outputs)
