"""Sessions that end badly give an incomplete record and no verdict about conformance: a test
pytest-timeout stopped (its ``signal`` method), a process pytest-timeout ended (its
``thread`` method: the record written at session start stays), and an INTERNALERROR.

(A crashed xdist worker and Ctrl-C are covered by ``test_verdicts.py``.)
"""

from __future__ import annotations

from typing import Any

import pytest
from kv_helpers import make_ref, plain_full_record_text

from kvcheck.results.schema import load_records

# The factory's fifth call (inside a test of the allocation area) hangs.
HANGS_ONCE = """
import time
_calls = [0]
def make_kv_cache_manager(spec):
    _calls[0] += 1
    if _calls[0] == 5:
        time.sleep(60)
    return _ref.make_kv_cache_manager(spec)
"""

# A plugin that breaks pytest itself after the 20th test.
BREAKS_PYTEST = """
_seen = [0]
def pytest_runtest_logfinish(nodeid, location):
    _seen[0] += 1
    if _seen[0] == 20:
        raise RuntimeError("a plugin bug")
"""


def record(pytester: pytest.Pytester) -> dict[str, Any]:
    (rec,) = load_records(pytester.path / "r.jsonl")
    return rec


def test_a_test_stopped_by_pytest_timeout_makes_the_run_incomplete(
        pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_timeout")
    impl = make_ref(pytester, body=HANGS_ONCE)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", impl,
                                "-k", "test_allocation", "--timeout=3",
                                "--timeout-method=signal", "--kv-report=r.jsonl")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes()["failed"] == 1
    rec = record(pytester)
    (stopped,) = [t for t, o in rec["outcomes"].items() if o != "passed"]
    assert rec["outcomes"][stopped] == "failed", "as pytest reports it"
    assert rec["complete"] is False and rec["conforms"] is False
    assert "1 timed out (pytest-timeout)" in rec["completeness"]["reasons"]
    assert rec["completeness"]["ran"] == len(rec["outcomes"]) - 1
    assert rec["verdict"].startswith("ref: incomplete: ")
    result.stdout.fnmatch_lines(["verdict: ref: incomplete: *1 timed out (pytest-timeout)*"])


def test_a_process_ended_by_pytest_timeout_leaves_a_did_not_finish_record(
        pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_timeout")
    impl = make_ref(pytester, body=HANGS_ONCE)
    # An earlier complete record at the same path (a plain complete run's, made once for the
    # session): it must not survive as the answer.
    (pytester.path / "r.jsonl").write_text(plain_full_record_text(pytester), encoding="utf-8")
    assert record(pytester)["conforms"] is True and record(pytester)["complete"] is True
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           impl, "-k", "test_allocation", "--timeout=3",
                                           "--timeout-method=thread", "--kv-report=r.jsonl")
    assert result.ret != 0  # os._exit(1) in the middle of a test: no summary, no verdict
    assert "+ Timeout +" in result.stdout.str() + result.stderr.str()
    assert "verdict:" not in result.stdout.str()
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["interrupted"] is True
    assert rec["completeness"]["applicable"] is None and rec["outcomes"] == {}
    assert rec["verdict"].startswith("ref: no verdict: the run did not finish")


def test_an_internal_error_gives_no_verdict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(breaks_pytest=BREAKS_PYTEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", "-p",
                                "breaks_pytest", make_ref(pytester), "--kv-report=r.jsonl")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["interrupted"] is True
    assert "pytest aborted with an internal error" in rec["completeness"]["reasons"]
    assert len(rec["outcomes"]) == 20  # in whatever order they ran (pytest-randomly)
    assert rec["verdict"] == ("ref: aborted after 20 tests (pytest aborted with an internal "
                              "error): no verdict")
    # pytest prints no summary after an INTERNALERROR, so the verdict is in the record only.
    assert "conforms" not in result.stdout.str()
