"""Named baselines for the micro-benchmarks: one per machine, saved once, committed, and compared against by name.

    python -m benchmarks.baseline save cpu-2core                 # run the suite, write baselines/cpu-2core.json
    python -m benchmarks.baseline compare cpu-2core              # run the suite against it, under its gate
    python -m benchmarks.baseline compare h200 --report-only -- -k "decode_step and cuda"
    python -m benchmarks.baseline list

pytest-benchmark does the work. `save` is `--benchmark-save` into a scratch storage, so the file holds the stats of
every case with pytest-benchmark's machine_info (plus torch, CUDA, GPU and threads, from benchmarks/conftest.py) and
commit_info, and is then moved to baselines/<name>.json. `compare` is `--benchmark-compare=<that file>` with
`--benchmark-compare-fail=<the baseline's gate>` and the table grouped by case, so each case shows its baseline row,
its NOW row and their ratio. Arguments after `--` go to pytest. A case that only one side ran is not compared.

The gate of each baseline is GATES below (a machine's noise decides it; benchmarks/README.md has the measurements),
`--gate` overrides it for one run, and a name without an entry only reports. Exit status: pytest's (1 on a regression
beyond the gate), or 2 for an unknown baseline name, a bad gate, a file that is not a baseline, or (`save`, before
the run) an existing file of that name that is not a baseline, unless --force. `save` writes the file atomically.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from oracle.atomic import replacing
from oracle.cli import UsageError, carries, check_output

HERE = Path(__file__).resolve().parent
BASELINES = HERE / "baselines"
REPORT = "report"  # the gate that never fails: print the comparison table only
OWN_MARK = b'"machine_info"'  # pytest-benchmark's first key: a file holding it is a baseline `save` may replace

# Per baseline: "report", or --benchmark-compare-fail expressions separated by spaces.
GATES: dict[str, str] = {
    # The shared 2-core CPU: back to back, the same tree's min moved by up to 11% on a quiet box and 69% with other
    # sessions' tests running (median: 12%, 101%); a gate that would catch a 10% regression fails on noise.
    "cpu-2core": REPORT,
    # A dedicated H200: after warm-up, rounds of the same tree moved decode-step medians by at most 5.4% (RESULTS.md,
    # the issue-#12 cost measurement).
    "h200": "min:10%",
}
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class BaselineError(Exception):
    """A usage error, printed as one line: exit status 2."""


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def saved_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def baseline_path(name: str, directory: Path, must_exist: bool) -> Path:
    if not NAME_RE.fullmatch(name):
        saved = ", ".join(saved_names(directory)) or "none"
        raise BaselineError(f"name a baseline (letters, digits, '.', '_', '-'; got {name!r}); saved: {saved}")
    path = directory / f"{name}.json"
    if must_exist and not path.is_file():
        saved = ", ".join(saved_names(directory)) or "none"
        raise BaselineError(
            f"no baseline named {name!r} in {_shown(directory)} (saved: {saved}); "
            f"make one with `make bench-baseline NAME={name}`"
        )
    return path


def load_baseline(path: Path) -> dict[str, Any]:
    """The baseline's JSON, checked to be a pytest-benchmark run with its machine and commit (else BaselineError:
    pytest-benchmark would only warn and compare nothing)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{_shown(path)} is not a readable JSON file: {exc}") from None
    ok = isinstance(data, dict) and isinstance(data.get("benchmarks"), list) and data["benchmarks"]
    if not ok or not all(isinstance(b, dict) and "fullname" in b and "stats" in b for b in data["benchmarks"]):
        raise BaselineError(f"{_shown(path)} is not a pytest-benchmark run (no benchmarks with stats)")
    for key in ("machine_info", "commit_info"):
        if not isinstance(data.get(key), dict):
            raise BaselineError(f"{_shown(path)} has no {key}: save it again with `make bench-baseline`")
    return data


def gate_checks(gate: str) -> list[str]:
    """The --benchmark-compare-fail expressions of a gate ("report": none); BaselineError if pytest-benchmark would
    reject one."""
    from pytest_benchmark.utils import parse_compare_fail

    if gate.strip() == REPORT:
        return []
    checks = gate.split()
    if not checks:
        raise BaselineError(f"empty gate; use {REPORT!r} or expressions such as min:10%")
    for check in checks:
        try:
            parse_compare_fail(check)
        except argparse.ArgumentTypeError:
            raise BaselineError(f"bad gate {check!r}: expected {REPORT!r} or FIELD:N% / FIELD:SECONDS") from None
    return checks


def gate_of(name: str, override: str | None = None) -> str:
    return override if override is not None else GATES.get(name, REPORT)


def describe(data: dict[str, Any]) -> str:
    commit, machine = data["commit_info"], data["machine_info"]
    sha = str(commit.get("id") or "unknown")[:12] + ("+dirty" if commit.get("dirty") else "")
    where = machine.get("gpu") or (machine.get("cpu") or {}).get("brand_raw") or machine.get("processor") or "?"
    cases = len(data["benchmarks"])
    return f"{cases} cases, commit {sha}, {data.get('datetime', '?')[:16]}, node {machine.get('node', '?')}, {where}"


def run_pytest(args: list[str]) -> int:
    cmd = [sys.executable, "-m", "pytest", *args]
    print("+ " + shlex.join(cmd), flush=True)
    return subprocess.run(cmd, check=False).returncode


def save(name: str, directory: Path, suite: str, pytest_args: list[str], force: bool = False) -> int:
    path = baseline_path(name, directory, must_exist=False)
    check_output(f"save {name}", path, [], carries(OWN_MARK), force)  # before the suite runs: a refusal costs no run
    with tempfile.TemporaryDirectory(prefix="bench-baseline-") as scratch:
        rc = run_pytest([suite, f"--benchmark-storage=file://{scratch}", f"--benchmark-save={name}", *pytest_args])
        runs = sorted(Path(scratch).glob(f"*/*_{name}.json"))
        if rc != 0:
            print(f"error: pytest exited with {rc}; {_shown(path)} left as it was", file=sys.stderr)
            return rc
        if not runs:
            print(f"error: no benchmark ran, so nothing was saved; {_shown(path)} left as it was", file=sys.stderr)
            return 1
        data = load_baseline(runs[-1])
        with replacing(path) as tmp:
            shutil.copyfile(runs[-1], tmp)
    print(f"saved {_shown(path)}: {describe(data)}; gate: {gate_of(name)}")
    if data["commit_info"].get("dirty"):
        print("note: the tree had uncommitted changes; the baseline's commit is not the code that ran")
    return 0


def compare(name: str, directory: Path, suite: str, gate: str, pytest_args: list[str]) -> int:
    path = baseline_path(name, directory, must_exist=True)
    data = load_baseline(path)
    checks = gate_checks(gate)
    print(f"baseline {_shown(path)}: {describe(data)}")
    print(f"gate: {' '.join(checks) if checks else 'report only, timings never fail the run'}", flush=True)
    fail = ["--benchmark-compare-fail", *checks] if checks else []
    # group-by=name: one table per case, its baseline row and its NOW row, so the ratios in parentheses pair them.
    # The path as shown names the baseline's rows in the table.
    args = [suite, "--benchmark-group-by=name", *fail, f"--benchmark-compare={_shown(path)}", *pytest_args]
    rc = run_pytest(args)
    if rc != 0 and checks:
        print(f"pytest exited with {rc}: a test failed, or a case is slower than the gate allows (listed above)")
    return rc


def list_baselines(directory: Path) -> int:
    names = saved_names(directory)
    if not names:
        print(f"no baselines in {_shown(directory)}")
    for name in names:
        try:
            about = describe(load_baseline(directory / f"{name}.json"))
        except BaselineError as exc:
            about = f"unusable: {exc}"
        print(f"{name}: gate {gate_of(name)}; {about}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.baseline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arguments after -- go to pytest, e.g. -- -k 'sampler and cpu'.",
    )
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--dir", type=Path, default=BASELINES, help="default: benchmarks/baselines")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("save", "compare"):
        sub = commands.add_parser(command, parents=[where], help=f"{command} a named baseline")
        sub.add_argument("name", help="the baseline, e.g. cpu-2core or h200")
        sub.add_argument("--suite", default=str(HERE), help="the benchmarks pytest runs (default: benchmarks/)")
        if command == "save":
            sub.add_argument("--force", action="store_true", help="replace a file of that name that is not a baseline")
        if command == "compare":
            sub.add_argument("--gate", help=f"this run's gate instead of the baseline's: {REPORT!r} or e.g. min:20%%")
            sub.add_argument("--report-only", action="store_true", help=f"same as --gate {REPORT}")
    commands.add_parser("list", parents=[where], help="the saved baselines and their gates")
    args = parser.parse_args(ours)
    try:
        if args.command == "save":
            return save(args.name, args.dir, args.suite, pytest_args, args.force)
        if args.command == "compare":
            gate = REPORT if args.report_only else gate_of(args.name, args.gate)
            return compare(args.name, args.dir, args.suite, gate, pytest_args)
        return list_baselines(args.dir)
    except (BaselineError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
