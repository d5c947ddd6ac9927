"""The JUnit XML report of a verify run: a testsuite per section and a testcase per check (its time: its share of
its section's seconds), with the run's provenance as properties: model, target, commit, device, the UTC start, the
rerun line, each plugin's file, sha256 and version, and the allow-listed environment."""

from __future__ import annotations

import platform
import xml.etree.ElementTree as ET
from pathlib import Path

from ..atomic import replacing
from ..verify_cli import JUNIT_NAME
from .report import fmt
from .result import VerifyResult, count_statuses


def properties(result: VerifyResult) -> list[tuple[str, str]]:
    """(name, value) of every property each testsuite carries."""
    env = result.environment
    props = [
        ("model", result.model),
        ("target", result.target.name),
        ("commit", env.commit),
        ("device", env.device),
        ("started", result.started),
        ("rerun", result.rerun),
    ]
    for p in result.plugin_files:
        props += [(f"plugin.{p.module}.{key}", value or "none") for key, value in
                  (("file", p.file), ("sha256", p.sha256), ("version", p.version))]
    return props + [(f"env.{name}", value) for name, value in result.env.items()]


def write_junit(result: VerifyResult, path: Path) -> None:
    """JUnit XML: a testsuite per section, a testcase per check; fail -> failure, error -> error, not-tested ->
    skipped."""
    counts = result.counts()
    root = ET.Element(
        "testsuites",
        name=JUNIT_NAME,
        tests=str(len(result.checks)),
        failures=str(counts["fail"]),
        errors=str(counts["error"]),
        skipped=str(counts["not-tested"]),
        time=f"{result.seconds:.3f}",
    )
    for section in result.sections():
        checks = result.section(section)
        section_counts = count_statuses(checks)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=section,
            tests=str(len(checks)),
            failures=str(section_counts["fail"]),
            errors=str(section_counts["error"]),
            skipped=str(section_counts["not-tested"]),
            time=f"{result.section_seconds(section):.3f}",
            hostname=platform.node(),
        )
        props = ET.SubElement(suite, "properties")
        for key, value in properties(result):
            ET.SubElement(props, "property", name=key, value=value)
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"verify.{section}", name=c.name, time=f"{c.seconds:.3f}")
            value = "" if c.value is None else f"value {fmt(c.value)} (passes when {c.passes_when} {fmt(c.limit)})"
            tag = {"fail": "failure", "error": "error", "not-tested": "skipped"}.get(c.status)
            if tag is not None:
                first = c.detail.splitlines()[0] if c.detail else c.status
                ET.SubElement(case, tag, message=first).text = "\n".join(filter(None, [value, c.detail]))
            elif value:
                ET.SubElement(case, "system-out").text = f"{value}\n{c.detail}"
    with replacing(path) as tmp:
        ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
