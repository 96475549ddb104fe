"""pytest-rerunfailures, pytest-randomly and pytest-xdist: the last attempt of a test decides
its outcome, the verdict and the record agree with pytest's own summary, and the record's
outcomes equal a plain serial run's whatever the order, the workers or the reruns.

The implementation is kvcheck's reference without the kernel area (``kv_helpers.make_ref``);
``FLAKY_ONCE`` makes its factory fail exactly once in the whole session (a marker file, so
xdist workers and the hashing tests' child processes see it too).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from kv_helpers import make_ref, plain_full_run

from kvcheck.plugin.outcomes import SessionOutcomes
from kvcheck.results.schema import load_records

FLAKY_ONCE = """
import os
_MARK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "failed-once.mark")
_calls = [0]
def make_kv_cache_manager(spec):
    _calls[0] += 1  # call 1 is the load-time probe; call 3 is inside a test
    if _calls[0] == 3 and not os.path.exists(_MARK):
        open(_MARK, "w").close()
        raise RuntimeError("a transient failure, once")
    return _ref.make_kv_cache_manager(spec)
"""

BROKEN_FREE = """
class Manager(_ref.ReferenceManager):
    def free(self, request_id):
        raise RuntimeError("free is broken")
def make_kv_cache_manager(spec):
    return Manager(spec)
"""


def record(pytester: pytest.Pytester, name: str) -> dict[str, Any]:
    (rec,) = load_records(pytester.path / name)
    return rec


def assert_agrees_with_pytest(result: pytest.RunResult, rec: dict[str, Any]) -> None:
    """The record's outcome counts are pytest's summary line (tests that only error in
    setup or teardown aside: none here)."""
    summary = result.parseoutcomes()
    counts = Counter(rec["outcomes"].values())
    for outcome in ("passed", "failed", "skipped"):
        assert counts[outcome] == summary.get(outcome, 0), (outcome, summary)


def test_a_pass_on_rerun_is_a_pass_marked_flaky(pytester: pytest.Pytester) -> None:
    serial, serial_rec = plain_full_run(pytester)
    assert serial.ret == 0
    flaky = make_ref(pytester, module="refflaky", body=FLAKY_ONCE)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly",
                                "--kv-max-examples=3", flaky, "--reruns=1",
                                "--kv-report=r.jsonl")
    assert result.ret == 0
    assert result.parseoutcomes()["rerun"] == 1
    result.stdout.fnmatch_lines([
        "verdict: ref conforms to vllm-0.33*; 1 test passed only on rerun (flaky*",
        "  flaky (passed on rerun): *"])
    rec = record(pytester, "r.jsonl")
    assert rec["conforms"] is True and rec["complete"] is True
    assert_agrees_with_pytest(result, rec)
    (rerun,) = rec["extra"]["flaky"]
    assert rec["outcomes"][rerun] == "passed"
    assert rec["extra"]["reruns"] == {rerun: 1}
    assert rec["outcomes"] == serial_rec["outcomes"]
    assert rec["areas"] == serial_rec["areas"]


def test_a_failure_on_every_attempt_stays_a_failure(pytester: pytest.Pytester) -> None:
    impl = make_ref(pytester, body=BROKEN_FREE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", impl,
                                "--reruns=2", "-k", "test_allocation", "--kv-report=r.jsonl")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rec = record(pytester, "r.jsonl")
    assert_agrees_with_pytest(result, rec)
    failed = {t for t, o in rec["outcomes"].items() if o == "failed"}
    assert failed, "free() is called by allocation tests"
    assert rec["extra"]["reruns"] == dict.fromkeys(sorted(failed), 2)
    assert rec["extra"]["flaky"] == []
    assert result.parseoutcomes()["rerun"] == 2 * len(failed)
    # A -k subset that failed: "does NOT conform" leads, the shortfall follows.
    assert rec["verdict"].startswith("ref does NOT conform to vllm-0.33: failing areas: "
                                     "allocation (incomplete run: ran ")


def test_xdist_randomly_and_reruns_together_equal_a_serial_run(
        pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytest.importorskip("pytest_randomly")
    pytest.importorskip("pytest_rerunfailures")
    serial, serial_rec = plain_full_run(pytester)
    assert serial.ret == 0
    flaky = make_ref(pytester, module="refflaky", body=FLAKY_ONCE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "randomly", "--randomly-seed=12345",
        "--kv-max-examples=3", flaky, "-n", "2", "--dist", "loadgroup", "--reruns=1",
        "--kv-report=r.jsonl")
    assert result.ret == 0, result.stdout.str()[-3000:]
    rec = record(pytester, "r.jsonl")
    assert rec["outcomes"] == serial_rec["outcomes"]
    assert rec["complete"] is True and rec["conforms"] is True
    assert len(rec["extra"]["flaky"]) == 1
    assert_agrees_with_pytest(result, rec)


# ------------------------------------------------------------------ the merge, report by report
def report(nodeid: str, when: str, outcome: str, attempt: int | None = None,
           longrepr: str | None = None) -> pytest.TestReport:
    extra = {} if attempt is None else {"rerun": attempt}
    return pytest.TestReport(nodeid, ("f.py", 0, nodeid), {}, outcome, longrepr, when, **extra)


PROPS = {"kv_impl": "x", "kv_area": "allocation", "kv_suite": True}
T = "test_allocation.py::test_a[x]"


@pytest.mark.parametrize(("phases", "expected", "reruns"), [
    # attempt 0 fails (reported "rerun"), attempt 1 passes: a pass, rerun once
    ([("setup", "passed", 0), ("call", "rerun", 0), ("teardown", "passed", 0),
      ("setup", "passed", 1), ("call", "passed", 1), ("teardown", "passed", 1)],
     "passed", {T: 1}),
    # a setup error rerun, then a failing call on the last attempt
    ([("setup", "rerun", 0), ("teardown", "passed", 0),
      ("setup", "passed", 1), ("call", "failed", 1), ("teardown", "passed", 1)],
     "failed", {T: 1}),
    # a late report of the superseded attempt does not undo the last attempt's pass
    ([("call", "rerun", 0), ("call", "passed", 1), ("teardown", "failed", 0)],
     "passed", {T: 1}),
    # no rerunfailures (no attempt attribute): a teardown error overrides a pass
    ([("setup", "passed", None), ("call", "passed", None), ("teardown", "failed", None)],
     "error", {}),
], ids=["pass-on-rerun", "fail-on-last", "late-report", "no-reruns"])
def test_the_last_attempt_decides(phases: list[tuple[str, str, int | None]], expected: str,
                                  reruns: dict[str, int]) -> None:
    outcomes = SessionOutcomes()
    for when, outcome, attempt in phases:
        outcomes.add(report(T, when, outcome, attempt), PROPS)
    assert outcomes.by_impl["x"] == {T: expected}
    assert outcomes.reruns("x") == reruns
    assert outcomes.flaky("x") == ([T] if expected == "passed" and reruns else [])


def test_a_pytest_timeout_failure_is_marked_timed_out() -> None:
    outcomes = SessionOutcomes()
    outcomes.add(report(T, "call", "failed",
                        longrepr="Failed: Timeout (>2.0s) from pytest-timeout."), PROPS)
    other = "test_allocation.py::test_b[x]"
    outcomes.add(report(other, "call", "failed", longrepr="AssertionError: 3 != 4"), PROPS)
    assert outcomes.timed_out("x") == {T}
    assert outcomes.by_impl["x"] == {T: "failed", other: "failed"}
