"""``python -m oracle verify --model DIR [--target T] [--plugin MODULE ...] [--quick] [--out DIR] [--json F]
[--report F] [--junit F] [--seed N] [--debug]``, also installed as ``hfparity-verify`` (the same options, without
the word ``verify``). Exit status: see EXIT_STATUS (also in --help).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine import ConfigError, EngineError, ModelLoadError

from . import __version__
from .cli import UsageError, check_distinct, check_writable, int_in
from .plugins import PluginError, load_plugins
from .target import PRESETS, TARGET_ENV, TargetError, from_env

EXIT_STATUS = (
    "exit status: 0 every check passed; 1 a check failed; 2 bad usage or configuration (arguments, a target that "
    "cannot run here, a plugin that does not import, a bad model dir, an output that cannot be written or that "
    "collides with another; checked before the run, nothing written); 3 the model loaded but the engine raised or "
    "produced non-finite logits during the run (e.g. weights holding NaN): the reports are still written, with the "
    "error recorded as a check of status 'error'."
)

_HINTS: list[tuple[type[BaseException], str]] = [
    (
        ModelLoadError,
        "pass a Hugging Face model dir (config.json + *.safetensors) of a supported architecture "
        "(Llama, Qwen2, Qwen3, Qwen3-MoE); `python -m oracle.zoo smollm2` prints the default model's dir",
    ),
    (ConfigError, "the model's config asks for something this engine cannot serve here"),
    (OSError, "check that the model dir exists and is readable, and that the output dir is writable"),
    (EngineError, "see the message above"),
]


def _hint(exc: BaseException) -> str:
    return next(h for kind, h in _HINTS if isinstance(exc, kind))


@dataclass(frozen=True)
class Outputs:
    json: Path
    report: Path
    junit: Path | None

    @property
    def png(self) -> Path:
        return self.report.with_suffix(".png")

    def named(self, args: argparse.Namespace) -> list[tuple[str, Path]]:
        """Each path with what an error calls it: its option, or ``--out DIR`` for a default path."""
        out = f"--out {args.out}"
        report = "--report" if args.report else out
        named = [("--json" if args.json else out, self.json), (report, self.report)]
        named.append((f"the plot of {report}", self.png))
        return named + ([("--junit", self.junit)] if self.junit else [])


def outputs_of(args: argparse.Namespace) -> Outputs:
    stem = f"verify-{Path(args.model).resolve().name}"
    return Outputs(args.json or args.out / f"{stem}.json", args.report or args.out / f"{stem}.md", args.junit)


def check_outputs(args: argparse.Namespace, outputs: Outputs) -> None:
    """Raise UsageError unless every output can be written and no two collide; creates nothing."""
    named = outputs.named(args)
    for option, path in named:
        check_writable(option, path)
    check_distinct(named)


def _verify(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .verify import FULL, QUICK, report, steps_of, verify

    try:
        plugins = load_plugins(args.plugin)
        target = from_env(args.target).require()
        outputs = outputs_of(args)
        check_outputs(args, outputs)
    except (PluginError, TargetError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = Path(args.model)
    plan = QUICK if args.quick else FULL
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"verify {model.name}", total=steps_of(plan))

        def advance(what: str) -> None:
            progress.update(task, advance=1, description=what)

        result = verify(model, args.quick, args.seed, advance, target, plugins, catch_errors=not args.debug)
    out.print(report.console_table(result))
    for detail in report.failure_details(result):
        out.print(detail, style="red", markup=False, highlight=False)
    png = outputs.png if result.figure is not None else None
    if png is not None and result.figure is not None:
        report.plot(result.figure, png)
    report.write_json(result, outputs.json)
    report.write_markdown(result, outputs.report, png)
    written = [outputs.json, outputs.report, *([png] if png else [])]
    if outputs.junit is not None:
        report.write_junit(result, outputs.junit)
        written.append(outputs.junit)
    for line in report.summary_lines(result):
        out.print(line, highlight=False)
    out.print("wrote " + ", ".join(map(str, written)), highlight=False)
    return {"pass": 0, "fail": 1, "error": 3}[result.status]


def _add_verify_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--quick", action="store_true", help="fewer prompts, tokens, grid points and samples")
    p.add_argument(
        "--seed", type=int_in(0, 2**63 - 1), default=0, help="seed of prompts and sampling, in [0, 2**63) (default 0)"
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def _run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 after --help / --version
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    out, err = Console(), Console(stderr=True)
    try:
        return _verify(args, out, err)
    except (EngineError, OSError) as exc:
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"error: {type(exc).__name__}: {message}\nhint: {_hint(exc)} (--debug shows the traceback)", file=sys.stderr
        )
        return 2


def verify_parser(prog: str = "hfparity-verify") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Verify the engine against HF on one model dir.", epilog=EXIT_STATUS
    )
    _add_verify_arguments(parser)
    return parser


def verify_main(argv: list[str] | None = None) -> int:
    """The verify command without its subcommand word (the ``hfparity-verify`` console script)."""
    return _run(verify_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle", description="Verification of the engine against HF.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_verify_arguments(
        sub.add_parser("verify", help="run the verification report on one model dir", epilog=EXIT_STATUS)
    )
    return _run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
