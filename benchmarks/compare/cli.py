"""The command line: options, the order of the sections (roofline bandwidth first, then grid, roofline, offline),
saving the JSON after every section, and the report at the end.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from oracle.target import TargetError

from ..common import benchmark_target, model_for, synchronize
from . import __doc__ as description
from .contenders import ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC
from .grid import run_grid
from .offline import run_offline
from .plan import Plan
from .report import print_report, run_meta, write_json
from .roofline import measure_bandwidth, run_roofline
from .sampling import GREEDY, MODES, modes


def name_set(text: str) -> frozenset[str]:
    """A comma list of contender names ("" for none)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: the target's, else cuda where a GPU is")
    parser.add_argument(
        "--target",
        help="the engine's device, dtype and backends: preset[,key=value...] or FILE.toml (default: cpu-fp32 on CPU, "
        "cuda-bf16 on CUDA; $HFPARITY_TARGET is not read)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes, tokens and rounds (a smoke run)")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument("--model", help="model dir (default: Qwen3-0.6B shape on GPU, SmolLM2-135M on CPU)")
    parser.add_argument("--shape", default="qwen3-0.6b", help="GPU shape under benchmarks/configs/ (dummy weights)")
    parser.add_argument("--batch-sizes", type=lambda s: tuple(int(x) for x in s.split(",")), help="e.g. 1,8")
    parser.add_argument("--repeats", type=int, help="interleaved rounds per batch size")
    parser.add_argument("--sections", default="grid,roofline,offline", help="comma list of grid,roofline,offline")
    parser.add_argument(
        "--isolate",
        metavar="NAMES",
        default=HF_STATIC,
        type=name_set,
        help=f'comma list of HF contenders ("{HF_EAGER}", "{HF_STATIC}") to run in a child process each '
        f'(default "{HF_STATIC}"; "" for none)',
    )
    parser.add_argument(
        "--skip",
        metavar="NAMES",
        default=frozenset(),
        type=name_set,
        help="comma list of contenders to leave out of the grid, e.g. to fit a time limit",
    )
    parser.add_argument(
        "--sampling",
        default=GREEDY,
        help=f"comma list of {', '.join(MODES)}: the engine's grid rows per mode (HF contenders run greedy only); "
        "mixed cycles top-k, top-p, min-p and greedy requests, seeded samples every request with its own seed",
    )
    parser.add_argument(
        "--sampled-batch-sizes",
        type=lambda s: frozenset(int(x) for x in s.split(",")),
        help="the batch sizes of the sampled rows, e.g. 1,64 (default: every batch size)",
    )
    parser.add_argument(
        "--offline-sampling", default=GREEDY, help=f"comma list of {', '.join(MODES)}: one offline run per mode"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="a step profile per B and sampling mode of the engine's graphs contender (eager without graphs): "
        "kernels, device and host time per decode step",
    )
    args = parser.parse_args(argv)
    try:
        grid_modes, offline_modes = modes(args.sampling), modes(args.offline_sampling)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.skip <= {ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC}:
        names = ", ".join(repr(n) for n in (ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC))
        parser.error(f"--skip takes only {names}, not {sorted(args.skip)}")
    if not args.isolate <= {HF_EAGER, HF_STATIC}:
        parser.error(f"--isolate takes only {HF_EAGER!r} and {HF_STATIC!r}, not {sorted(args.isolate)}")
    try:
        target = benchmark_target(args.target, args.device)
    except TargetError as exc:
        parser.error(str(exc))
    device = target.torch_device
    plan = Plan.for_device(device, args.quick)
    if args.batch_sizes:
        plan = replace(plan, batch_sizes=args.batch_sizes)
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    sections = set(args.sections.split(","))
    choice = model_for(target, args.model, args.shape)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result: dict[str, Any] = {"meta": run_meta(target, choice, plan, argv)}

    def save() -> None:  # after every section: a run cut short by a time limit keeps what it finished
        if args.json:
            write_json(args.json, result)

    roofline = device.type == "cuda" and "roofline" in sections
    if roofline:  # first, so that a run cut short by a time limit still has it
        result["bandwidth_bytes_per_s"] = measure_bandwidth(device)
        log(f"bandwidth {result['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s")
        save()
    if "grid" in sections or "roofline" in sections:
        sampled = args.sampled_batch_sizes
        grid = run_grid(target, choice, plan, log, args.isolate, args.skip, grid_modes, args.profile, sampled)
        result["meta"]["skipped"] = sorted(args.skip)
        result["meta"]["isolated"] = grid.pop("isolated")  # the contenders that ran in a child process
        result["grid"] = grid
        save()
    if roofline:
        result["roofline"] = run_roofline(result["grid"], plan, result["bandwidth_bytes_per_s"])
        save()
    if device.type == "cuda" and "offline" in sections and plan.offline_requests:
        result["offline"] = run_offline(target, choice, plan, log, offline_modes)
        save()
    synchronize(device)
    print_report(result)
    return 0
