"""The verify command once its usage is checked (:mod:`oracle.verify_cli`): loads plugins and the target, runs
verify with a progress bar on a terminal or one line per finished section otherwise (a CI log), prints the table
(one row a section, or every check with --verbose), the failures in full, the summary and the rerun line, and
writes the reports. Engine and I/O errors before the run are one error line and a hint (exit 2)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine import ConfigError, EngineError, ModelLoadError

from ..plugin_probe import probe_plugins
from ..plugins import PluginError, load_plugins
from ..target import TargetError, from_env
from ..target_spec import target_text
from ..verify_cli import Outputs
from . import FULL, QUICK, report, steps_of, verify
from .junit import write_junit
from .runner import OnSection, SectionRun

_HINTS: list[tuple[type[BaseException], str]] = [
    (
        ModelLoadError,
        "pass a Hugging Face model dir (config.json + *.safetensors) of a supported architecture "
        "(Llama, Qwen2, Qwen3, Qwen3-MoE); `python -m oracle.zoo smollm2` prints the default model's dir",
    ),
    (ConfigError, "the model's config asks for something this engine cannot serve here"),
    (OSError, "check that the model dir exists and is readable, and that the output dir is writable"),
    (EngineError, "see the message above"),
    (PluginError, "fix the plugin, or leave it out (--plugin, $HFPARITY_PLUGINS, its hfparity.plugins entry point)"),
]


def _hint(exc: BaseException) -> str:
    return next(h for kind, h in _HINTS if isinstance(exc, kind))


@contextmanager
def feedback(err: Console, title: str, total: int) -> Iterator[tuple[Callable[[str], None], OnSection]]:
    """(advance, on_section): a transient progress bar on a terminal; else one stderr line per finished section."""
    if not err.is_terminal:

        def line(run: SectionRun) -> None:
            print(report.section_line(run), file=sys.stderr, flush=True)

        yield (lambda _: None), line
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(title, total=total)
        yield (lambda what: progress.update(task, advance=1, description=what)), (lambda _: None)


def _run(args: argparse.Namespace, outputs: Outputs, out: Console, err: Console) -> int:
    try:
        probe_plugins(args.plugin)
        plugins = load_plugins(args.plugin)
        target = from_env(args.target).require()
    except (PluginError, TargetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = Path(args.model)
    with feedback(err, f"verify {model.name}", steps_of(QUICK if args.quick else FULL)) as (advance, on_section):
        result = verify(
            model, args.quick, args.seed, advance, target, plugins, catch_errors=not args.debug,
            on_section=on_section, target_text=target_text(args.target), record_env=args.record_env,
        )
    out.print(report.console_table(result) if args.verbose else report.section_table(result))
    for detail in report.failure_details(result):
        out.print(detail, style="red", markup=False, highlight=False, soft_wrap=True)  # one line each, for grep
    png = outputs.png if result.figure is not None else None
    if png is not None and result.figure is not None:
        report.plot(result.figure, png)
    report.write_json(result, outputs.json)
    report.write_markdown(result, outputs.report, png)
    written = [outputs.json, outputs.report, *([png] if png else [])]
    if outputs.junit is not None:
        write_junit(result, outputs.junit)
        written.append(outputs.junit)
    for line in report.summary_lines(result):
        out.print(line, highlight=False, soft_wrap=True)
    out.print("wrote " + ", ".join(map(str, written)), highlight=False, soft_wrap=True)
    out.print(f"rerun: {result.rerun}", highlight=False, markup=False, soft_wrap=True)
    return {"pass": 0, "fail": 1, "error": 3}[result.status]


def execute(args: argparse.Namespace, outputs: Outputs) -> int:
    """Run verify for parsed, checked arguments; the exit status (see oracle.verify_cli.EXIT_STATUS)."""
    try:
        return _run(args, outputs, Console(), Console(stderr=True))
    except (EngineError, OSError, PluginError) as exc:  # PluginError: a plugin's factory raised as the engine built it
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"error: {type(exc).__name__}: {message}\nhint: {_hint(exc)} (--debug shows the traceback)", file=sys.stderr
        )
        return 2
