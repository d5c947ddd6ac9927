"""python -m oracle.false_failures [--seeds N] [-j JOBS]: how often the statistical properties fail a correct engine.

Each run is one pytest process over the tests marked ``statistical`` under the ``ci-random`` profile (``ci``'s
example counts, so each check keeps its budgeted α) with ``--hypothesis-seed`` set to the run's seed: a new set of
examples and draws per seed. The suite is designed to fail a correct engine with probability at most
:data:`oracle.budget.PROPERTIES_ALPHA` per run; the count of failing seeds, with its exact (Clopper-Pearson) 95% upper
bound, is what docs/statistics.md records. The target and plugins travel as for the mutants (environment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from scipy import stats as sps

from . import __version__
from .environment import git_commit

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SeedRun:
    seed: int
    exitstatus: int
    seconds: float
    tail: str  # the end of pytest's output


def run_seed(seed: int, paths: list[str], profile: str = "ci-random", marker: str | None = "statistical") -> SeedRun:
    """One pytest process over the `marker` tests of `paths` (all of them for None) under `profile`, seeded."""
    env = {**os.environ, "HYPOTHESIS_PROFILE": profile, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    # The harness plugin by name: a checkout that is not pip-installed has no entry point for it.
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "oracle.pytest_plugin", "-p", "no:cacheprovider"]
    cmd += [*(["-m", marker] if marker else []), f"--hypothesis-seed={seed}", *paths]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    return SeedRun(seed, proc.returncode, time.perf_counter() - start, (proc.stdout + proc.stderr)[-4000:])


def upper_bound(failures: int, runs: int, confidence: float = 0.95) -> float:
    """Exact one-sided Clopper-Pearson upper bound on the failure probability."""
    return 1.0 if failures >= runs else float(sps.beta.ppf(confidence, failures + 1, runs - failures))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.false_failures", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50, help="how many seeds (runs), 1..N (default 50)")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("-j", "--jobs", type=int, default=1, help="runs in parallel (default 1)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports" / "false-failures.json")
    parser.add_argument("paths", nargs="*", default=["properties"], help="what to collect (default properties/)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(lambda s: run_seed(s, args.paths), seeds))
    wall = time.perf_counter() - start
    errors = [r.seed for r in runs if r.exitstatus not in (0, 1)]
    failed = [r.seed for r in runs if r.exitstatus == 1]
    clean = len(runs) - len(errors)
    bound = upper_bound(len(failed), clean) if clean else 1.0
    record = {
        "commit": git_commit(),
        "target": os.environ.get("HFPARITY_TARGET", "cpu-fp32"),
        "runs": clean,
        "failed_seeds": failed,
        "error_seeds": errors,
        "failure_rate_upper_95": bound,
        "wall_seconds": wall,
        "detail": [asdict(r) for r in runs],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"{len(failed)} of {clean} seeds failed (95% upper bound on the rate {bound:.3g}); "
          f"{len(errors)} errored; {wall:.0f} s wall; {args.out}")
    for r in runs:
        if r.exitstatus != 0:
            print(f"--- seed {r.seed} (exit {r.exitstatus}) ---\n{r.tail}")
    return 0 if not failed and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
