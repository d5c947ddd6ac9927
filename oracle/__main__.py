"""python -m oracle verify --model DIR [--json OUT] [--report OUT] [--quick] [--seed N] [--debug]

Exit status: 0 every check passed, 1 a check failed, 2 the run could not start (bad model dir, bad arguments).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine import ConfigError, EngineError, ModelLoadError

_HINTS: list[tuple[type[BaseException], str]] = [
    (
        ModelLoadError,
        "pass a Hugging Face model dir (config.json + *.safetensors) of a supported architecture "
        "(Llama, Qwen2, Qwen3); `python -m oracle.zoo smollm2` prints the default model's dir",
    ),
    (ConfigError, "the model's config asks for something this engine cannot serve here"),
    (OSError, "check that the model dir exists and is readable, and that the output dir is writable"),
    (EngineError, "see the message above"),
]


def _hint(exc: BaseException) -> str:
    return next(h for kind, h in _HINTS if isinstance(exc, kind))


def _verify(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .report import console_table, failure_details, plot, summary_lines, write_json, write_markdown
    from .verify import FULL, QUICK, steps_of, verify

    model = Path(args.model)
    stem = f"verify-{model.resolve().name}"
    json_path = args.json or args.out / f"{stem}.json"
    report_path = args.report or args.out / f"{stem}.md"
    plan = QUICK if args.quick else FULL
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(f"verify {model.name}", total=steps_of(plan))

        def advance(what: str) -> None:
            progress.update(task, advance=1, description=what)

        result = verify(model, quick=args.quick, seed=args.seed, advance=advance)
    out.print(console_table(result))
    for detail in failure_details(result):
        out.print(f"[bold red]FAILED[/] {detail}", highlight=False)
    png = report_path.with_suffix(".png") if result.figure is not None else None
    if png is not None and result.figure is not None:
        plot(result.figure, png)
    write_json(result, json_path)
    write_markdown(result, report_path, png)
    for line in summary_lines(result):
        out.print(line, highlight=False)
    out.print(f"wrote {json_path}, {report_path}" + (f", {png}" if png else ""), highlight=False)
    return 0 if result.passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle", description="Verification of the engine against HF.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("verify", help="run the verification report on one model dir")
    p.add_argument("--model", required=True, help="Hugging Face model dir (Llama, Qwen2 or Qwen3)")
    p.add_argument("--json", type=Path, help="JSON output (default: OUT/verify-<model>.json)")
    p.add_argument("--report", type=Path, help="markdown report; the plot goes next to it as .png")
    p.add_argument("--out", type=Path, default=Path("reports"), help="default output dir (default: reports/)")
    p.add_argument("--quick", action="store_true", help="fewer prompts, tokens, grid points and samples")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts and sampling (default 0)")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
