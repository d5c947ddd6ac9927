"""The report: what ran where (machine, commit, versions, command, plan), one rich table of every section, and the
JSON file of the full results.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from oracle.environment import cpu_model, git_commit
from oracle.target import Target

from ..common import ModelChoice, command_line, machine_info
from .plan import Plan


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.get_num_threads()} torch threads"


def print_report(result: dict[str, Any]) -> None:
    """One table: grid rows, then ratios (a / b: tokens/s ratio, ms/step ratio), roofline and offline rows."""
    from rich.console import Console
    from rich.markup import escape  # the sampling mode's brackets in a label are not markup
    from rich.table import Table

    meta = result["meta"]
    title = f"{meta['model']} {meta['dtype']} on {meta['machine']} · commit {meta['commit']} · {meta['date']}"
    table = Table(title=title)
    table.add_column("section")
    table.add_column("B", justify="right")
    table.add_column("what")
    for col in ("tokens/s", "ms/step", "CPU ms/step", "note"):
        table.add_column(col, justify="right")
    grid = result.get("grid")
    on_cpu = meta["device"] == "cpu"  # host CPU time says nothing about GPU work
    if grid:
        for r in grid["rows"]:
            table.add_row(
                "grid", str(r["batch"]), escape(r["method"]), f"{r['tokens_per_s']:.1f}", f"{r['ms_per_step']:.3f}",
                f"{r['cpu_ms_per_step']:.3f}" if on_cpu else "", "",
            )
        for q in grid["ratios"]:
            sampled = q["a"].endswith("]")  # a sampled row over its greedy one
            table.add_row(
                "ratio", str(q["batch"]), escape(f"{q['a']} / {q['b']}"), f"{q['tokens_per_s_ratio']:.2f}x",
                f"{q['step_time_ratio']:.2f}x", f"{q['cpu_step_time_ratio']:.2f}x" if on_cpu else "",
                "sampled / greedy, median of per-round ratios" if sampled else "median of per-round ratios",
            )
        for p in grid["profile"]:
            kernels, device_ms, graph_ms = p["kernels_per_step"], p["device_ms_per_step"], p.get("graph_ms_per_step")
            table.add_row(
                "profile", str(p["batch"]), escape(f"{p['method']}: per decode step"), "",
                "" if device_ms is None else f"{device_ms:.3f}", "",
                ("" if kernels is None else f"{kernels:.0f} kernels, summed kernel time in ms/step; ")
                + ("" if graph_ms is None else f"graph {graph_ms:.3f} ms; ")
                + f"host {p['host_ms_per_step']:.3f} ms",
            )
        for pair, by_b in grid["greedy_agreement"].items():
            for b, frac in by_b.items():
                table.add_row("check", str(b), f"greedy tokens: {pair}", "", "", "", f"{frac:.1%}")
    if "bandwidth_bytes_per_s" in result:
        bw = result["bandwidth_bytes_per_s"] / 1e12
        table.add_row("roofline", "", "D2D copy bandwidth (read + write)", "", "", "", f"{bw:.2f} TB/s")
        for r in result["roofline"]:
            table.add_row(
                "roofline", str(r["batch"]), f"{r['method']}: step / floor", "",
                f"{r['step_ms']:.3f} / {r['floor_ms']:.3f}", "", f"{r['step_over_floor']:.2f}x",
            )
    for off in result.get("offline", []):
        table.add_row(
            "offline", str(off["requests"]), escape(f"output tokens/s (whole run) [{off['sampling']}]"),
            f"{off['output_tokens_per_s']:.0f}", "", "", f"{off['output_tokens']} tokens in {off['seconds']:.1f}s",
        )
    Console(width=200).print(table)


def run_meta(target: Target, choice: ModelChoice, plan: Plan, argv: list[str] | None) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "target": target.describe(),
        "device": target.device,
        "machine": machine(target.torch_device),
        "machine_info": machine_info(),  # node, CPU, Python, torch, CUDA and GPU: where the numbers came from
        "model": choice.label,
        "dtype": str(choice.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "command": command_line("benchmarks.compare", argv),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "plan": asdict(plan),
    }


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
