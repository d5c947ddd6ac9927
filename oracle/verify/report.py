"""Renders a :class:`VerifyResult`: summary lines, the console tables (one row per section, or per check), a finished
section's log line, JSON (docs/verify.md), markdown with the rerun line and provenance, and the PNG plot of the sampled
row; JUnit XML is :mod:`.junit`'s."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from ..atomic import replacing
from ..tolerance import YARDSTICK_RATIO
from ..verify_cli import MARKDOWN_HEADING, PNG_SOFTWARE
from .kernels import SECTION as KERNELS
from .kernels import ran_line
from .result import Check, Figure, Status, VerifyResult, count_statuses
from .runner import SectionRun

SCHEMA_VERSION = 1
_WORDS: dict[Status, str] = {"pass": "passed", "fail": "failed", "not-tested": "not tested", "error": "errors"}
_MARKS: dict[Status, str] = {
    "pass": "[green]pass[/]",
    "fail": "[bold red]FAIL[/]",
    "not-tested": "[yellow]not tested[/]",
    "error": "[bold red]ERROR[/]",
}


def fmt(x: float | None) -> str:
    if x is None:
        return ""
    if x == 0 or math.isinf(x):
        return f"{x:g}"
    return f"{x:.3g}"


def tally(checks: list[Check]) -> str:
    """'17 passed, 1 not tested': the passed count, then every other status that occurs."""
    counts = count_statuses(checks)
    others = [f"{counts[s]} {_WORDS[s]}" for s in _WORDS if s != "pass" and counts[s]]
    return ", ".join([f"{counts['pass']} passed", *others])


def _section_note(section: str, checks: list[Check], alpha: float) -> str:
    if section == "sampling":
        chi = [c.value for c in checks if c.name.startswith("chi-square") and c.value is not None]
        return f", α = {alpha:.2g} per test, smallest chi-square p = {fmt(min(chi, default=None))}"
    if section == KERNELS:
        return f", {sum(c.value or 0.0 for c in checks):.0f} examples; the implementation that ran, per op:"
    if section in ("bf16 norms", "run"):
        return f": {checks[0].detail.splitlines()[0]}"
    measured = [c for c in checks if c.value is not None and c.limit and c.passes_when == "<="]
    if not measured:
        return ""
    worst = max(measured, key=lambda c: (c.value or 0.0) / (c.limit or 1.0))
    return f", worst |Δlogit| {fmt(worst.value)} (bound {fmt(worst.limit)})"


def verdict(result: VerifyResult) -> str:
    return {"pass": "PASS", "fail": "FAIL", "error": "ERROR"}[result.status]


def summary_lines(result: VerifyResult) -> list[str]:
    lines = []
    for section in result.sections():
        checks = result.section(section)
        lines.append(f"{section}: {tally(checks)}{_section_note(section, checks, result.alpha)}")
        if section == KERNELS:
            lines += [f"  {c.name}: {ran_line(c)}{'' if c.passed else f' ({c.status})'}" for c in checks]
    lines.append(
        f"verdict: {verdict(result)}: {tally(result.checks)} ({result.plan}, target {result.target.name}, dtype "
        f"{result.dtype}, {result.seconds:.0f} s)"
    )
    return lines


def console_table(result: VerifyResult) -> Table:
    table = Table(title=f"verify {result.model} ({result.plan}, target {result.target.name})")
    for col in ("section", "check", "result", "value", "limit"):
        table.add_column(col, overflow="fold")
    for check in (c for section in result.sections() for c in result.section(section)):
        limit = f"{check.passes_when} {fmt(check.limit)}" if check.passes_when and check.limit is not None else ""
        table.add_row(Text(check.section), Text(check.name), _MARKS[check.status], fmt(check.value), limit)
    return table


def worst_status(checks: list[Check]) -> Status:
    """The status a section shows: error, else fail, else not-tested, else pass."""
    return next(s for s in ("error", "fail", "not-tested", "pass") if any(c.status == s for c in checks))


def section_table(result: VerifyResult) -> Table:
    """One row per section: its worst status, its tally and its seconds (failure_details lists what did not pass)."""
    table = Table(title=f"verify {result.model} ({result.plan}, target {result.target.name})")
    for col in ("section", "result", "checks", "seconds"):
        table.add_column(col, overflow="fold")
    for section in result.sections():
        checks = result.section(section)
        seconds = f"{result.section_seconds(section):.1f}"
        table.add_row(Text(section), _MARKS[worst_status(checks)], Text(tally(checks)), seconds)
    return table


def section_line(run: SectionRun) -> str:
    """A finished section in one line, for a log: its name, its counts (or 'done' without checks) and its seconds."""
    counts = count_statuses(run.checks)
    words = [f"{counts[s]} {_WORDS[s]}" for s in ("pass", "fail", "error")]
    words += [f"{counts['not-tested']} {_WORDS['not-tested']}"] if counts["not-tested"] else []
    return f"{run.name}: {', '.join(words) if run.checks else 'done'} ({run.seconds:.1f} s)"


def failure_details(result: VerifyResult) -> list[str]:
    """'FAILED section / name:' (ERROR for an error) and the detail on the next lines, for every check that did."""
    return [
        f"{'ERROR' if c.status == 'error' else 'FAILED'} {c.section} / {c.name}:\n{c.detail}"
        for c in result.checks
        if c.status in ("fail", "error")
    ]


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None  # strict JSON has no inf / NaN


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The report as plain data (schema_version 1; docs/verify.md describes the fields)."""
    checks = [
        {
            "name": c.name,
            "section": c.section,
            "value": _finite(c.value),
            "limit": _finite(c.limit),
            "passes_when": c.passes_when,
            "status": c.status,
            "detail": c.detail,
            "seconds": c.seconds,
        }
        for c in result.checks
    ]
    env = result.environment
    return {
        "schema_version": SCHEMA_VERSION,
        "status": result.status,
        "passed": result.passed,
        "counts": result.counts(),
        "summary": summary_lines(result),
        "model": result.model,
        "plan": result.plan,
        "target": result.target.describe(),
        "dtype": result.dtype,
        "seed": result.seed,
        "alpha": result.alpha,
        "commit": env.commit,
        "versions": env.versions,
        "device": env.device,
        "plugins": result.plugins,
        "plugin_files": [asdict(p) for p in result.plugin_files],
        "env": result.env,
        "started": result.started,
        "rerun": result.rerun,
        "seconds": result.seconds,
        "checks": checks,
        "figure": asdict(result.figure) if result.figure is not None else None,
        "prompts": result.prompts,
    }


def write_json(result: VerifyResult, path: Path) -> None:
    data = to_json(result)
    with replacing(path) as tmp, tmp.open("w") as fh:
        json.dump(data, fh, indent=1, allow_nan=False)


def plot(figure: Figure, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    labels = [*figure.labels, "rest"]
    expected = [*figure.expected, figure.rest_expected]
    observed = [*figure.observed, figure.rest_observed]
    x = range(len(labels))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(labels)), 4.5))
    ax.bar([i - 0.2 for i in x], expected, width=0.4, label="expected (oracle.sampler)")
    ax.bar([i + 0.2 for i in x], observed, width=0.4, label=f"observed (engine, n={figure.n})")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("frequency")
    ax.set_title(figure.title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png", metadata={"Software": PNG_SOFTWARE})
    plt.close(fig)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


_MD_STATUS: dict[Status, str] = {"pass": "pass", "fail": "**FAIL**", "not-tested": "not tested", "error": "**ERROR**"}


def _kernels_markdown(checks: list[Check]) -> list[str]:
    """The kernels section: per op, the implementation that ran and how many examples, and a failure's message."""
    out = [f"## {KERNELS}", "", "| op | implementation that ran | examples | result | failure |"]
    out.append("|---|---|---|---|---|")
    for c in checks:
        failure = "" if c.passed else _md_cell("\n".join(c.detail.splitlines()[:-1]))
        ran = _md_cell(ran_line(c))
        out.append(f"| {_md_cell(c.name)} | {ran} | {fmt(c.value)} | {_MD_STATUS[c.status]} | {failure} |")
    return [*out, ""]


def _provenance_markdown(result: VerifyResult) -> list[str]:
    """The plugins loaded (file, sha256, version) and the allow-listed environment (oracle.provenance)."""
    out = ["## Provenance", "", f"- started (UTC): {result.started}"]
    for p in result.plugin_files:
        out.append(f"- plugin `{p.module}`: `{p.file}`, sha256 `{p.sha256}`, version {p.version or 'none'}")
    env = ", ".join(f"`{k}={v}`" for k, v in result.env.items()) or "none set"
    return [*out, f"- environment (allow-listed): {env}", ""]


def write_markdown(result: VerifyResult, path: Path, png: Path | None) -> None:
    env = result.environment
    out = [f"{MARKDOWN_HEADING}`{result.model}`", ""]
    out.append(
        f"**{verdict(result)}**: {tally(result.checks)} ({result.plan} plan, target `{result.target.name}`, engine "
        f"dtype {result.dtype}, seed {result.seed}, {result.seconds:.0f} s)."
    )
    versions = ", ".join(f"{k} {v}" for k, v in env.versions.items())
    out += ["", f"Commit `{env.commit}` on {env.device}; {versions}."]
    out += ["", f"Rerun: `{result.rerun}`"]
    out += ["", *[f"- {line}" for line in summary_lines(result)], ""]
    for section in result.sections():
        if section == KERNELS:
            out += _kernels_markdown(result.section(section))
            continue
        out += [f"## {section}", "", "| check | result | value | limit | detail |", "|---|---|---|---|---|"]
        for c in result.section(section):
            detail = _md_cell(c.detail.splitlines()[0] if c.passed and c.detail else c.detail)
            limit = f"{c.passes_when} {fmt(c.limit)}" if c.passes_when and c.limit is not None else ""
            out.append(
                f"| {_md_cell(c.name)} | {_MD_STATUS[c.status]} | {fmt(c.value)} | {_md_cell(limit)} | {detail} |"
            )
        out.append("")
    if png is not None and result.figure is not None:
        out += ["## Sampled row", "", f"![{result.figure.title}]({png.name})", ""]
    out += [
        "## How to read this",
        "",
        "- greedy parity: HF float64 teacher-forced on the engine's tokens; each token must be HF's argmax, or a",
        "  near-tie of it (vLLM's rule, `oracle.checks`).",
        "- logit error / decode ≡ prefill: max |Δlogit| against `rel × max(1, max |ref|)` (`oracle.tolerance`); on a",
        f"  bf16 target widened to {YARDSTICK_RATIO:g} × HF's own bf16 error where that is larger.",
        f"- sampling: chi-square and support tests at α = {result.alpha:.3g} each (family budget 1e-3 per run,",
        "  Bonferroni); tokens whose keep/drop decision is within tolerance of a threshold are excluded. A",
        "  chi-square left with one bucket has nothing to test: it is *not tested*, never a pass.",
        "",
        *_provenance_markdown(result),
    ]
    with replacing(path) as tmp:
        tmp.write_text("\n".join(out))
