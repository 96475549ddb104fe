"""One final outcome per (implementation, test id), merged from pytest's phase reports.

A test reports up to three phases (setup, call, teardown); under pytest-rerunfailures it
reports them once per *attempt*. The rules, so that the record agrees with pytest's own
summary line:

* Within an attempt, an error in setup or teardown overrides a pass; otherwise the first
  decisive phase wins (a skip at setup, a failed call).
* A report whose outcome is ``"rerun"`` (pytest-rerunfailures: this attempt failed and will be
  repeated) ends its attempt without an outcome: the *last* attempt decides. A test that
  passes after reruns is a pass, and is listed as flaky (``flaky()``, the record's
  ``extra.flaky``); ``reruns()`` counts the repeated attempts of every rerun test.
* Reports carry their attempt number (``report.rerun``, set by pytest-rerunfailures; 0
  without it) and are keyed by node id, so the merge does not depend on the order in which
  tests ran (pytest-randomly) or on which xdist worker sent them.
* A failure raised by pytest-timeout (its ``signal`` method fails the test with
  ``Timeout (>Ns) from pytest-timeout``) is kept as pytest reports it (failed or error), and
  also listed in ``timed_out``: the test did not finish, so the run cannot be complete.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping

import pytest

from kvcheck.plugin.coverage import BLOCK_SIZES_PROPERTY, GATING_PROPERTY, TestFacts
from kvcheck.results.schema import OUTCOMES

__all__ = ["RERUN", "SessionOutcomes", "area_of", "is_timeout_failure"]

#: pytest-rerunfailures' outcome for an attempt that failed and will be repeated.
RERUN = "rerun"
#: pytest-timeout's failure message (``PYTEST_FAILURE_MESSAGE``), for both phases it can fail.
_TIMEOUT_RE = re.compile(r"Timeout \(>[0-9.e+-]+s\) from pytest-timeout")
_AREA_RE = re.compile(r"test_([A-Za-z0-9_]+)\.py")
_COVERAGE_PROPS = frozenset({BLOCK_SIZES_PROPERTY, GATING_PROPERTY})


def area_of(nodeid: str) -> str:
    """``conformance/test_eviction.py::test_x[ref]`` -> ``eviction``."""
    match = _AREA_RE.search(nodeid.split("::", 1)[0])
    return match.group(1) if match else "other"


def is_timeout_failure(report: pytest.TestReport) -> bool:
    """Whether pytest-timeout failed this phase (its ``signal`` method raises inside the
    test; its ``thread`` method ends the process instead and leaves no report)."""
    return bool(report.failed and _TIMEOUT_RE.search(report.longreprtext or ""))


def _attempt(report: pytest.TestReport) -> int:
    """The attempt this report belongs to: 0 for the first run of a test."""
    value = getattr(report, "rerun", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class SessionOutcomes:
    """Outcomes of the suite's tests for each implementation (see the module docstring)."""

    def __init__(self) -> None:
        self.by_impl: dict[str, dict[str, str]] = defaultdict(dict)
        self.area: dict[str, str] = {}
        self.skip_reason: dict[str, str] = {}  # node id -> why it was skipped
        self._attempt: dict[str, int] = {}     # node id -> the attempt being merged
        self._reruns: dict[str, dict[str, int]] = defaultdict(dict)  # impl -> id -> count
        self._timed_out: dict[str, set[str]] = defaultdict(set)     # impl -> ids
        # node id -> the user properties kvcheck.plugin.coverage reads (block sizes, gating
        # markers), of every phase of the attempt being merged.
        self._properties: dict[str, list[tuple[str, object]]] = defaultdict(list)

    def add(self, report: pytest.TestReport, props: Mapping[str, object]) -> None:
        """Merge one phase report of a suite test (``props``: its ``user_properties``)."""
        impl, nodeid = str(props["kv_impl"]), report.nodeid
        self.area[nodeid] = str(props.get("kv_area", area_of(nodeid)))
        attempt = _attempt(report)
        if attempt < self._attempt.get(nodeid, 0):
            return  # a late report of an attempt already superseded
        if attempt > self._attempt.get(nodeid, 0) or report.outcome == RERUN:
            # A new attempt starts from nothing; a "rerun" report ends the current one.
            self._forget(impl, nodeid)
            self._attempt[nodeid] = attempt
        if report.outcome == RERUN:
            reruns = self._reruns[impl]
            reruns[nodeid] = max(reruns.get(nodeid, 0), attempt + 1)
            return
        self._properties[nodeid].extend(
            (name, value) for name, value in report.user_properties if name in _COVERAGE_PROPS)
        outcome = _phase_outcome(report)
        if outcome is None:
            return
        if outcome in ("failed", "error") and is_timeout_failure(report):
            self._timed_out[impl].add(nodeid)
        current = self.by_impl[impl].get(nodeid)
        # An error in teardown overrides a pass; otherwise the first decisive phase wins.
        if current is None or (current == "passed" and outcome in ("error", "failed")):
            self.by_impl[impl][nodeid] = outcome
            if outcome == "skipped":
                self.skip_reason[nodeid] = _skip_reason(report)

    def _forget(self, impl: str, nodeid: str) -> None:
        self.by_impl[impl].pop(nodeid, None)
        self.skip_reason.pop(nodeid, None)
        self._properties.pop(nodeid, None)
        self._timed_out[impl].discard(nodeid)

    def reruns(self, impl: str) -> dict[str, int]:
        """Test id -> how many times it was rerun, for tests of ``impl`` that were rerun and
        then reported a final outcome."""
        done = self.by_impl.get(impl, {})
        return {t: n for t, n in sorted(self._reruns.get(impl, {}).items()) if t in done}

    def flaky(self, impl: str) -> list[str]:
        """Test ids of ``impl`` that passed only after one or more reruns."""
        done = self.by_impl.get(impl, {})
        return [t for t in self.reruns(impl) if done[t] == "passed"]

    def timed_out(self, impl: str) -> set[str]:
        """Test ids of ``impl`` whose final attempt pytest-timeout failed."""
        return set(self._timed_out.get(impl, ()))

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
        """Test ids of ``impl`` that reported a final outcome."""
        return set(self.by_impl.get(impl, ()))

    def facts(self, impl: str) -> dict[str, TestFacts]:
        """Test id -> its ``kvcheck.plugin.coverage.TestFacts`` (outcome, area, the block sizes
        it ran at, its gating markers), for the tests of ``impl`` that reported an outcome."""
        return {nodeid: TestFacts.from_properties(outcome, self.area.get(nodeid, "other"),
                                                  self._properties.get(nodeid, ()),
                                                  self.skip_reason.get(nodeid, ""))
                for nodeid, outcome in self.by_impl.get(impl, {}).items()}

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
