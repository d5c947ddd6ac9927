"""python -m oracle.mutants [--fast] [--only NAME ...] [--list] [--target T] [--plugin M]: run the mutant catalogue,
print the kill table (also installed as ``hfparity-mutants``).

Each pytest run checks the chosen target (``$HFPARITY_TARGET``) with the chosen plugins (``$HFPARITY_PLUGINS``):
both travel to the child processes through the environment. Exits 0 only if the baseline passes and every mutant
is killed, 2 on bad usage (checked before any run: no checkout's mutants.toml to read, an output dir that cannot be
written, an output that is or lies inside an input, a mutants.json this tool did not write without --force) or a
target that cannot run here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import __version__
from ..cli import UsageError, carries, check_dir, check_not_input, check_output, int_in, positive_seconds, read_inputs
from ..plugin_probe import probe_plugins
from ..plugins import PLUGINS_ENV, PluginError, load_plugins, plugin_names
from ..target import TARGET_ENV, TargetError, from_env
from . import MUTANTS, mutants_for
from .killers import KillersError, killers
from .runner import BASELINE, REPO_ROOT, REPORT_MARK, RunResult, job_of, run_table, write_json

_STYLE = {"killed": "green", "passed": "green", "survived": "bold red", "failed": "bold red"}


def _catalogue_table(fast: bool) -> Table:
    table = Table(title=f"mutant catalogue ({'fast' if fast else 'full'} targets)")
    for col in ("mutant", "bug", "seen in", "targets"):
        table.add_column(col, overflow="fold")
    for name, m in MUTANTS.items():
        job = job_of(name, fast)
        profile = f" [{job.profile} profile]" if job.profile else ""
        table.add_row(name, m.bug, m.seen, "\n".join(job.targets) + profile)
    return table


def _kill_table(results: list[RunResult], title: str) -> Table:
    table = Table(title=title)
    table.add_column("mutant")
    table.add_column("result")
    table.add_column("killed by (first failing test)", overflow="fold")
    table.add_column("failing", justify="right")
    table.add_column("time", justify="right")
    for r in results:
        style = _STYLE.get(r.status, "bold yellow")
        killer = r.killer or ("—" if r.ok else f"see {r.log}")
        failing = str(len(r.failed)) if r.mutant != BASELINE else f"{len(r.failed)} ({r.passed} passed)"
        table.add_row(r.mutant, f"[{style}]{r.status}[/]", killer, failing, f"{r.seconds:.1f} s")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="CI configuration: targeted tests, -x, dev profile")
    parser.add_argument("--only", action="append", choices=list(MUTANTS), metavar="NAME", help="run only these")
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the targets without a mutant")
    parser.add_argument("-j", "--jobs", type=int_in(1), default=1, help="mutants run in parallel (default 1)")
    parser.add_argument("--timeout", type=positive_seconds, default=None, help="seconds per pytest run (default: none)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports", help="where mutants.json and logs go")
    parser.add_argument("--target", help=f"what the runs check (default ${TARGET_ENV} or cpu-fp32)")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE in every run")
    parser.add_argument(
        "--force", action="store_true", help="replace a mutants.json this tool did not write (never an input)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)
    report = args.out / ("mutants-fast.json" if args.fast else "mutants.json")
    try:
        probe_plugins(args.plugin)
        load_plugins(args.plugin)
        target = from_env(args.target).require()
        killers()
        if not args.list:  # --list writes nothing
            inputs = read_inputs(args.plugin, args.target)
            check_not_input("--out", args.out / "mutants", inputs)
            check_dir("--out", args.out / "mutants")
            check_output("--out", report, inputs, carries(REPORT_MARK), args.force)
    except (TargetError, PluginError, UsageError, KillersError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.target:  # the text as given: a TOML target's name is its file's stem, which the children cannot parse
        os.environ[TARGET_ENV] = args.target
    os.environ[PLUGINS_ENV] = ",".join(plugin_names(args.plugin))

    console = Console()
    console.print(f"target: {target.name}", highlight=False)
    if args.list:
        console.print(_catalogue_table(args.fast))
        return 0
    names = args.only or mutants_for(target.torch_device.type, target)
    elsewhere = sorted(set(MUTANTS) - set(names)) if not args.only else []
    if elsewhere:
        console.print("not run on this target (their bug lives on a path it does not take: another device, "
                      "backend, or graphs off): " + ", ".join(elsewhere), highlight=False)
    total = len(names) + (0 if args.no_baseline else 1)
    count = 0

    def progress(result: RunResult) -> None:
        nonlocal count
        count += 1
        style = _STYLE.get(result.status, "bold yellow")
        console.print(f"[{count}/{total}] {result.mutant}: [{style}]{result.status}[/] ({result.seconds:.1f} s)")

    start = time.perf_counter()
    results = run_table(
        names,
        args.fast,
        args.out / "mutants",
        baseline=not args.no_baseline,
        jobs=args.jobs,
        timeout=args.timeout,
        on_result=progress,
    )
    wall = time.perf_counter() - start
    mode = "fast" if args.fast else "full"
    console.print(_kill_table(results, f"kill table ({mode}, {wall:.0f} s wall)"))
    write_json(results, report, args.fast, target.name)
    bad = [r for r in results if not r.ok]
    if bad:
        console.print(
            f"[bold red]{len(bad)} run(s) not as required:[/] " + ", ".join(f"{r.mutant} ({r.status})" for r in bad)
        )
        return 1
    console.print(f"[green]all {len(names)} mutants killed[/] ({mode}, {wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
