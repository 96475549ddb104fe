"""Outcome bookkeeping, the per-area terminal summary and the ``--kv-report`` record."""

from __future__ import annotations

import io
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcheck.conformance import SUITE_VERSION
from kvcheck.plugin.completeness import Completeness
from kvcheck.plugin.loader import ImplHandle
from kvcheck.results.environment import collect_environment
from kvcheck.results.io import OutputPathError, check_output_path, write_records
from kvcheck.results.schema import OUTCOMES, make_conformance_record

__all__ = ["SessionOutcomes", "area_of", "check_report_path", "conformance_record",
           "render_summary", "verdict", "write_report"]

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
        self.skip_reason: dict[str, str] = {}  # node id -> why it was skipped

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
            if outcome == "skipped":
                self.skip_reason[nodeid] = _skip_reason(report)

    def skipped_groups(self, impl: str) -> list[tuple[str, dict[str, int]]]:
        """``(reason, {area: count})`` for the skipped tests of ``impl``, commonest first."""
        groups: dict[str, Counter[str]] = defaultdict(Counter)
        for nodeid, outcome in self.by_impl.get(impl, {}).items():
            if outcome == "skipped":
                reason = self.skip_reason.get(nodeid, "(no reason given)")
                groups[reason][self.area.get(nodeid, "other")] += 1
        ordered = sorted(groups.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        return [(reason, dict(areas.most_common())) for reason, areas in ordered]

    def reported(self, impl: str) -> set[str]:
        """Test ids of ``impl`` that reported an outcome."""
        return set(self.by_impl.get(impl, ()))

    def counts(self, impl: str) -> dict[str, dict[str, int]]:
        """area -> outcome -> count, every outcome present (zeros included)."""
        table: dict[str, dict[str, int]] = {}
        for nodeid, outcome in self.by_impl.get(impl, {}).items():
            row = table.setdefault(self.area.get(nodeid, "other"), dict.fromkeys(OUTCOMES, 0))
            row[outcome] += 1
        return dict(sorted(table.items()))


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason pytest recorded for a skip (``(path, line, "Skipped: why")``)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


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


def verdict(impl: str, profile: str, counts: dict[str, dict[str, int]],
            completeness: Completeness) -> tuple[bool, str]:
    """(conforms, one line) for the summary and the record.

    "conforms" needs a complete run: every applicable suite test ran, and none failed.
    """
    failing = [a for a, c in counts.items() if c["failed"] or c["error"]]
    ran = sum(sum(c.values()) for c in counts.values())
    if completeness.interrupted:
        return False, f"{impl}: interrupted after {ran} test{'s' * (ran != 1)}: no verdict"
    if not completeness.complete:
        total = "?" if completeness.applicable is None else str(completeness.applicable)
        line = (f"{impl}: incomplete: ran {completeness.ran} of {total} applicable tests "
                f"({'; '.join(completeness.reasons)})")
        if failing:
            line += f"; failing areas: {', '.join(failing)}"
        return False, line
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
        line += f"; {skipped} test{'s' * (skipped != 1)} skipped (see below)"
    return True, line


def render_summary(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
                   completeness: Completeness) -> list[str]:
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
    _, line = verdict(impl.name, profile, counts, completeness)
    skipped = [f"  skipped {sum(areas.values())} "
               f"({', '.join(f'{a} {n}' for a, n in areas.items())}): {reason}"
               for reason, areas in outcomes.skipped_groups(impl.name)]
    return buf.getvalue().rstrip("\n").splitlines() + [f"verdict: {line}", *skipped]


def conformance_record(impl: ImplHandle, profile: str, outcomes: SessionOutcomes,
                       completeness: Completeness, seed: int | None,
                       environment: dict[str, Any]) -> dict[str, Any]:
    """A validated conformance record for one implementation."""
    counts = outcomes.counts(impl.name)
    conforms, line = verdict(impl.name, profile, counts, completeness)
    return make_conformance_record(
        implementation=impl, profile=profile, seed=seed,
        outcomes=dict(sorted(outcomes.by_impl.get(impl.name, {}).items())), areas=counts,
        verdict=line, conforms=conforms and completeness.complete,
        complete=completeness.complete, completeness=completeness.as_record(),
        environment=environment, suite_version=SUITE_VERSION)


def write_report(path: str, impls: list[ImplHandle], profile_for: Callable[[ImplHandle], str],
                 outcomes: SessionOutcomes, completeness: dict[str, Completeness],
                 seed: int | None) -> Path:
    """Write one record per implementation to ``path`` atomically (JSON Lines); an existing
    file is replaced, as ``--junitxml`` does."""
    environment = collect_environment()
    records = [conformance_record(i, profile_for(i), outcomes, completeness[i.name], seed,
                                  environment) for i in impls]
    return write_records(path, records)


def check_report_path(path: str, option: str) -> None:
    """Fail before the run if ``path`` cannot take a record (empty, a folder, under a file,
    an unwritable folder): the same checks as every kvcheck output.

    Raises:
        pytest.UsageError: naming the problem and the fix.
    """
    try:
        check_output_path(path, option, example="kvcheck.jsonl")
    except OutputPathError as exc:
        problem, _, fix = str(exc).partition("; ")
        raise pytest.UsageError(f"kvcheck: {problem}\n  Fix: {fix}") from None
