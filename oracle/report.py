"""Renders a :class:`oracle.verify.VerifyResult`: summary lines, a rich table, JSON, markdown and the PNG plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from .verify import Check, Figure, VerifyResult


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    if x == 0 or math.isinf(x):
        return f"{x:g}"
    return f"{x:.3g}"


def _section_note(section: str, checks: list[Check], alpha: float) -> str:
    if section == "sampling":
        p_min = min((c.value for c in checks if c.name.startswith("chi-square") and c.value is not None), default=None)
        return f", α = {alpha:.2g} per test, smallest chi-square p = {_fmt(p_min)}"
    if section == "bf16 norms":
        return f": {checks[0].detail}"
    measured = [c for c in checks if c.value is not None and c.limit]
    if not measured:
        return ""
    worst = max(measured, key=lambda c: (c.value or 0.0) / (c.limit or 1.0))
    return f", worst |Δlogit| {_fmt(worst.value)} (bound {_fmt(worst.limit)})"


def summary_lines(result: VerifyResult) -> list[str]:
    lines = []
    for section in result.sections():
        checks = result.section(section)
        ok = sum(c.passed for c in checks)
        lines.append(f"{section}: {ok}/{len(checks)} passed{_section_note(section, checks, result.alpha)}")
    verdict = "PASS" if result.passed else "FAIL"
    lines.append(f"verdict: {verdict} ({result.plan}, dtype {result.dtype}, {result.seconds:.0f} s)")
    return lines


def console_table(result: VerifyResult) -> Table:
    table = Table(title=f"verify {result.model} ({result.plan})")
    for col in ("section", "check", "result", "value", "limit"):
        table.add_column(col, overflow="fold")
    for check in (c for section in result.sections() for c in result.section(section)):
        mark = "[green]pass[/]" if check.passed else "[bold red]FAIL[/]"
        table.add_row(check.section, check.name, mark, _fmt(check.value), _fmt(check.limit))
    return table


def failure_details(result: VerifyResult) -> list[str]:
    return [f"{c.section} / {c.name}:\n{c.detail}" for c in result.checks if not c.passed]


def write_json(result: VerifyResult, path: Path) -> None:
    data = asdict(result)
    data["passed"] = result.passed
    data["summary"] = summary_lines(result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str))


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def write_markdown(result: VerifyResult, path: Path, png: Path | None) -> None:
    out = [f"# Verification report: `{result.model}`", ""]
    out.append(
        f"**{'PASS' if result.passed else 'FAIL'}**: {sum(c.passed for c in result.checks)}/"
        f"{len(result.checks)} checks passed ({result.plan} plan, engine dtype {result.dtype}, seed "
        f"{result.seed}, {result.seconds:.0f} s)."
    )
    out += ["", *[f"- {line}" for line in summary_lines(result)], ""]
    for section in result.sections():
        out += [f"## {section}", "", "| check | result | value | limit | detail |", "|---|---|---|---|---|"]
        for c in result.section(section):
            detail = _md_cell(c.detail.splitlines()[0] if c.passed and c.detail else c.detail)
            out.append(
                f"| {_md_cell(c.name)} | {'pass' if c.passed else '**FAIL**'} | {_fmt(c.value)} | "
                f"{_fmt(c.limit)} | {detail} |"
            )
        out.append("")
    if png is not None and result.figure is not None:
        out += ["## Sampled row", "", f"![{result.figure.title}]({png.name})", ""]
    out += [
        "## How to read this",
        "",
        "- greedy parity: HF float64 teacher-forced on the engine's tokens; each token must be HF's argmax, or a",
        "  top-2 token at a genuine near-tie (vLLM's rule).",
        "- logit error / decode ≡ prefill: max |Δlogit| against `rel × max(1, max |ref|)` (properties/checks.py).",
        f"- sampling: chi-square and support tests at α = {result.alpha:.3g} each (family budget 1e-3 per run,",
        "  Bonferroni); tokens whose keep/drop decision is within tolerance of a threshold are excluded.",
        f"- reproduce: `python -m oracle verify --model {result.model}{' --quick' if result.plan == 'quick' else ''}"
        f" --seed {result.seed}`",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out))
