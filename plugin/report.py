"""Outcome bookkeeping, the per-area terminal summary and the ``--kv-report`` record."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from kvcheck import __version__
from kvcheck.conformance import SUITE_VERSION
from kvcheck.plugin.loader import ImplHandle
from kvcheck.results.environment import collect_environment
from kvcheck.results.io import write_records
from kvcheck.results.schema import OUTCOMES, SCHEMA_VERSION

__all__ = ["SessionOutcomes", "area_of", "render_summary", "verdict", "write_report"]

_AREA_RE = re.compile(r"test_([A-Za-z0-9_]+)\.py")


def area_of(nodeid: str) -> str:
    """``conformance/test_eviction.py::test_x[ref]`` -> ``eviction``."""
    match = _AREA_RE.search(nodeid.split("::", 1)[0])
    return match.group(1) if match else "other"


class SessionOutcomes:
    """One final outcome per (implementation, test id), merged over the test's phases."""

    def __init__(self) -> None:
        self.by_impl: dict[str, dict[str, str]] = defaultdict(dict)
        self.area: dict[str, str] = {}

    def add(self, report: pytest.TestReport, props: dict[str, Any]) -> None:
        impl, nodeid = props["kv_impl"], report.nodeid
        self.area[nodeid] = props.get("kv_area", area_of(nodeid))
        current = self.by_impl[impl].get(nodeid)
        outcome = _phase_outcome(report)
        if outcome is None:
            return
        # An error in teardown overrides a pass; otherwise the first decisive phase wins.
        if current is None or current == "passed" and outcome in ("error", "failed"):
            self.by_impl[impl][nodeid] = outcome

    def counts(self, impl: str) -> dict[str, dict[str, int]]:
        """area -> outcome -> count, every outcome present (zeros included)."""
        table: dict[str, dict[str, int]] = {}
        for nodeid, outcome in self.by_impl.get(impl, {}).items():
            row = table.setdefault(self.area.get(nodeid, "other"), dict.fromkeys(OUTCOMES, 0))
            row[outcome] += 1
        return dict(sorted(table.items()))


def _phase_outcome(report: pytest.TestReport) -> str | None:
    wasxfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpassed" if wasxfail else "passed"
        if report.skipped:
            return "xfailed" if wasxfail else "skipped"
        return "failed"
    if report.failed:
        return "error"
    if report.skipped:  # skipped at setup (capability, profile, skips file)
        return "xfailed" if wasxfail else "skipped"
    return None


def verdict(impl: str, profile: str, counts: dict[str, dict[str, int]]) -> tuple[bool, str]:
    """(conforms, one line) for the summary and the record."""
    failing = [a for a, c in counts.items() if c["failed"] or c["error"]]
    checked = sum(c["passed"] + c["xfailed"] + c["xpassed"] for c in counts.values())
    known = sum(c["xfailed"] for c in counts.values())
    if failing:
        return False, f"{impl} does NOT conform to {profile}: failing areas: {', '.join(failing)}"
    if checked == 0:
        return False, f"{impl}: nothing was checked (every test skipped)"
    line = f"{impl} conforms to {profile}"
    if known:
        line += f" except {known} known deviation{'s' * (known != 1)} (xfailed)"
    skipped = sum(c["skipped"] for c in counts.values())
    if skipped:
        line += f"; {skipped} test{'s' * (skipped != 1)} skipped (capabilities / profile)"
    return True, line


def render_summary(impl: ImplHandle, profile: str, outcomes: SessionOutcomes) -> list[str]:
    """The rich per-area table and the verdict line, as plain text lines."""
    from rich.console import Console
    from rich.table import Table

    counts = outcomes.counts(impl.name)
    table = Table(title=f"kvcheck conformance: {impl.name} {impl.info.version} ({profile})")
    table.add_column("area")
    for outcome in OUTCOMES:
        table.add_column(outcome, justify="right")
    for area, row in counts.items():
        table.add_row(area, *(str(row[o]) for o in OUTCOMES))
    buf = io.StringIO()
    Console(file=buf, width=100, force_terminal=False, color_system=None).print(table)
    _, line = verdict(impl.name, profile, counts)
    return buf.getvalue().rstrip("\n").splitlines() + [f"verdict: {line}"]


def conformance_record(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
                       seed: int | None, environment: dict[str, Any]) -> dict[str, Any]:
    """A schema-valid conformance record for one implementation."""
    counts = outcomes.counts(impl.name)
    conforms, line = verdict(impl.name, profile, counts)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "conformance",
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "suite_version": SUITE_VERSION,
        "kvcheck_version": __version__,
        "implementation": {
            "name": impl.name,
            "version": impl.info.version,
            "target": impl.target,
            "module": impl.module.__name__,
            "commit": impl.info.commit,
            "capabilities": sorted(impl.info.capabilities),
        },
        "profile": profile,
        "seed": seed,
        "outcomes": dict(sorted(outcomes.by_impl.get(impl.name, {}).items())),
        "areas": counts,
        "verdict": line,
        "conforms": conforms,
        "metrics": [],
        "environment": environment,
    }


def write_report(path: str, impls: list[ImplHandle], profile_for: Callable[[ImplHandle], str],
                 outcomes: SessionOutcomes, seed: int | None) -> Path:
    """Write one record per implementation to ``path`` atomically (JSON Lines)."""
    environment = collect_environment()
    records = [conformance_record(i, profile_for(i), outcomes, seed, environment) for i in impls]
    return write_records(path, records)
