"""Complete-run verdicts: "conforms" only when every applicable suite test ran and passed.

Each way a run can fall short (deselection, a path or node subset, -x / --maxfail, a skips
file, a collection error, Ctrl-C, a crashed xdist worker) must give an ``incomplete`` verdict
and a record with ``complete: false`` and ``conforms: false``; a full run, with or without the
user's own tests beside it, stays complete. A failed test is proof on its own: a run that had
one says "does NOT conform" first, however short it fell, and then how it fell short.

The implementation under test is the reference without the (slow, interpreted) kernel area
(``kv_helpers.make_ref``), so a whole-suite run takes a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inner_runs import NoShrinkProfile
from kv_helpers import make_ref, plain_full_run

import kvcheck.conformance
from kvcheck.plugin.completeness import RUN_DID_NOT_FINISH, Completeness
from kvcheck.plugin.report import verdict
from kvcheck.results.schema import load_records

SUITE = Path(kvcheck.conformance.__file__).parent

def run(pytester: pytest.Pytester, *args: str, no_shrink: bool = False) -> pytest.RunResult:
    """An in-process run at 3 random examples per test; ``no_shrink``: without Hypothesis's
    shrink phase (runs of BROKEN_FREE that go on after failures: every random test fails at
    its first example, and shrinking those failures, minutes on 2 cores, proves nothing a
    verdict depends on), the previous profile restored after the run. Such runs also pass
    ``--tb=no``: formatting their hundreds of tracebacks took three times as long as the run,
    and no verdict reads them."""
    plugins = [NoShrinkProfile()] if no_shrink else []
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args,
                              plugins=plugins)


def record(pytester: pytest.Pytester, name: str = "r.jsonl") -> dict:
    (rec,) = load_records(pytester.path / name)
    return rec


@pytest.fixture
def full_applicable(pytester: pytest.Pytester) -> int:
    """M for the reference without kernels under vllm-0.33, from a complete run."""
    result, rec = plain_full_run(pytester)
    assert result.ret == 0
    assert rec["complete"] is True and rec["conforms"] is True
    return int(rec["completeness"]["applicable"])


def test_full_run_is_complete_and_conforms(pytester: pytest.Pytester) -> None:
    result, rec = plain_full_run(pytester)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["verdict: ref conforms to vllm-0.33*"])
    comp = rec["completeness"]
    assert rec["complete"] is True and rec["conforms"] is True
    assert comp["reasons"] == [] and comp["interrupted"] is False
    # Applicable = every suite test but the kernels area (not declared); tests that skip
    # themselves at run time (two hashing cases) ran.
    assert rec["areas"]["kernels"] == {**dict.fromkeys(rec["areas"]["kernels"], 0),
                                       "skipped": 58}
    # Nor the sizing area (module-level functions this adapter does not declare).
    sizing = rec["areas"]["sizing"]
    assert sizing["skipped"] > 30 and sizing["passed"] == sizing["failed"] == 0
    # Nor the tests of side-effecting lookups (pinning_lookup, not declared): skipped, and
    # counted in the record's coverage as not applicable for that capability.
    pinning = [t for t, outcome in rec["outcomes"].items()
               if t.startswith("test_lookup_styles.py") and outcome == "skipped"]
    assert len(pinning) == 5
    assert rec["coverage"]["undeclared_capabilities"]["pinning_lookup"] == 5
    # And the tests of another profile's rule (hybrid: 0.10.2's free-block count; eagle:
    # 0.10.2's refusal of a per-group EAGLE flag; block_zeroing: 0.10.2's refusal of the
    # zeroing knob; edge_cases: the two hybrid edge goldens recorded from vLLM 0.10.2).
    other_profile_by_area = rec["coverage"]["not_applicable"].get("profile", {})
    assert other_profile_by_area == {"hybrid": 1, "eagle": 1, "block_zeroing": 1,
                                     "edge_cases": 2}, other_profile_by_area
    other_profile = sum(other_profile_by_area.values())
    # Nor the indexer area (a router's index, another kind of implementation).
    indexer = rec["areas"]["indexer"]
    assert indexer["skipped"] > 10 and indexer["passed"] == indexer["failed"] == 0
    # Nor the offload area (an offload tier: make_offloading_manager, not declared here).
    offload = rec["areas"]["offload"]
    assert offload["skipped"] > 20 and offload["passed"] == offload["failed"] == 0
    assert comp["applicable"] == comp["ran"] == (
        len(rec["outcomes"]) - 58 - sizing["skipped"] - len(pinning) - other_profile
        - indexer["skipped"] - offload["skipped"]) > 80


def test_keyword_selection_is_incomplete(pytester: pytest.Pytester, full_applicable: int) -> None:
    result = run(pytester, make_ref(pytester), "-k", "test_allocation", "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    ran = rec["completeness"]["ran"]
    assert 5 < ran < full_applicable
    result.stdout.fnmatch_lines([
        (f"verdict: ref: incomplete: ran {ran} of {full_applicable} applicable tests "
        f"({full_applicable - ran} deselected (-k, -m, --deselect or --lf))")])
    assert "conforms to" not in result.stdout.str()  # nor "does NOT conform": nothing failed
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["verdict"].startswith("ref: incomplete: ran")


def test_marker_selection_is_incomplete(pytester: pytest.Pytester) -> None:
    result = run(pytester, make_ref(pytester), "-m", "kv_generic", "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert any("deselected" in r for r in rec["completeness"]["reasons"])


def test_path_subset_counts_the_whole_suite(pytester: pytest.Pytester,
                                            full_applicable: int) -> None:
    """A file of the suite given as a path: the rest of the suite is counted (by a child
    collection) and reported as not collected."""
    result = run(pytester, make_ref(pytester), str(SUITE / "test_eviction.py"),
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    comp = rec["completeness"]
    assert rec["complete"] is False and rec["conforms"] is False
    assert comp["applicable"] == full_applicable
    assert comp["ran"] == sum(1 for t, o in rec["outcomes"].items() if o != "skipped")
    assert any("not collected" in r for r in comp["reasons"]), comp["reasons"]


def test_node_id_selection_is_incomplete(pytester: pytest.Pytester) -> None:
    result = run(pytester, make_ref(pytester),
                 f"{SUITE / 'test_allocation.py'}::test_first_allocation", "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    assert rec["completeness"]["ran"] == 1
    assert rec["complete"] is False and rec["conforms"] is False


BROKEN_FREE = """
class Manager(_ref.ReferenceManager):
    def free(self, request_id):
        raise RuntimeError("free is broken")
def make_kv_cache_manager(spec):
    return Manager(spec)
"""


@pytest.mark.parametrize(("stop", "failures"), [(["-x"], 1), (["--maxfail=2"], 2)],
                         ids=["x", "maxfail"])
def test_early_stop_with_a_failure_does_not_conform(pytester: pytest.Pytester,
                                                     full_applicable: int, stop: list[str],
                                                     failures: int) -> None:
    """The failure that stopped the run is proof: "does NOT conform" leads, and the line
    still says the run was incomplete and why."""
    result = run(pytester, make_ref(pytester, body=BROKEN_FREE), *stop, "--kv-report=r.jsonl")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rec = record(pytester)
    comp = rec["completeness"]
    assert rec["complete"] is False and rec["conforms"] is False
    assert comp["reasons"] == [f"stopped early: stopping after {failures} failures"]
    assert comp["applicable"] == full_applicable and comp["ran"] < full_applicable
    line = (f"ref does NOT conform to vllm-0.33: failing areas: * (incomplete run: ran "
            f"{comp['ran']} of {full_applicable} applicable tests; stopped early: stopping "
            f"after {failures} failures)")
    result.stdout.fnmatch_lines([f"verdict: {line}"])
    assert rec["verdict"] == result.stdout.str().split("verdict: ")[1].splitlines()[0]
    assert "incomplete:" not in rec["verdict"]  # not the wording of a run without failures


@pytest.mark.parametrize("select", [["-k", "test_allocation"],
                                    ["-k", "allocation or eviction",
                                     "--deselect", "test_eviction.py"]],
                         ids=["k", "deselect"])
def test_selection_with_a_failure_does_not_conform(pytester: pytest.Pytester,
                                                    full_applicable: int,
                                                    select: list[str]) -> None:
    result = run(pytester, make_ref(pytester, body=BROKEN_FREE), *select, "--kv-report=r.jsonl",
                 "--tb=no", no_shrink=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rec = record(pytester)
    comp = rec["completeness"]
    assert rec["complete"] is False and rec["conforms"] is False
    deselected = full_applicable - comp["ran"]
    assert comp["reasons"] == [f"{deselected} deselected (-k, -m, --deselect or --lf)"]
    assert rec["areas"]["allocation"]["failed"] > 0
    assert rec["verdict"].startswith("ref does NOT conform to vllm-0.33: failing areas: ")
    assert "allocation" in rec["verdict"].partition(" (")[0]
    assert rec["verdict"].endswith(f" (incomplete run: ran {comp['ran']} of {full_applicable} "
                                   f"applicable tests; {comp['reasons'][0]})")
    result.stdout.fnmatch_lines([f"verdict: {rec['verdict']}"])


def test_complete_run_with_a_failure_does_not_conform(pytester: pytest.Pytester) -> None:
    """Unchanged by the wording for partial runs: a complete run says nothing about
    completeness."""
    result = run(pytester, make_ref(pytester, body=BROKEN_FREE), "--kv-report=r.jsonl",
                 "--tb=no", no_shrink=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rec = record(pytester)
    assert rec["complete"] is True and rec["conforms"] is False
    failing = [a for a, c in rec["areas"].items() if c["failed"] or c["error"]]
    assert "allocation" in failing
    assert rec["verdict"] == (f"ref does NOT conform to vllm-0.33: failing areas: "
                              f"{', '.join(failing)}")
    result.stdout.fnmatch_lines([f"verdict: {rec['verdict']}"])


def test_skips_file_makes_the_run_incomplete(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", skips="test_allocation.py::test_first_allocation\n")
    result = run(pytester, make_ref(pytester), "--kv-skips-file=skips.txt",
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["reasons"] == ["1 skipped by --kv-skips-file"]
    assert rec["completeness"]["ran"] == rec["completeness"]["applicable"] - 1


BREAK_EVICTION = """
import pytest

class Broken(pytest.Module):
    def _getobj(self):
        raise self.CollectError("cannot import this suite module")

def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name == "test_eviction.py":
        return Broken.from_parent(parent, path=module_path)
"""


@pytest.mark.parametrize("keep_going", [False, True], ids=["stop", "continue"])
def test_collection_error_is_incomplete(pytester: pytest.Pytester, keep_going: bool) -> None:
    pytester.makepyfile(break_eviction=BREAK_EVICTION)
    args = ["--continue-on-collection-errors"] if keep_going else []
    result = run(pytester, make_ref(pytester), "-p", "break_eviction", *args,
                 "--kv-report=r.jsonl")
    assert result.ret != 0
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert "collection errors in test_eviction.py" in rec["completeness"]["reasons"]
    assert "interrupted" not in rec["verdict"]


CTRL_C = """
_calls = [0]
class Manager(_ref.ReferenceManager):
    def allocate_slots(self, *args, **kwargs):
        _calls[0] += 1
        if _calls[0] == {fail_at}:
            raise RuntimeError("allocate_slots is broken once")
        if _calls[0] == 60:  # the user's Ctrl-C (a KeyboardInterrupt raised here would be
            import signal   # the implementation's failure): the SIGINT handler called as the
            # interpreter calls it (signal.raise_signal may run it in a weakref callback,
            # where its KeyboardInterrupt is lost)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        return super().allocate_slots(*args, **kwargs)
def make_kv_cache_manager(spec):
    return Manager(spec)
"""


def run_until_ctrl_c(pytester: pytest.Pytester,
                     fail_at: int | None) -> tuple[pytest.RunResult, dict]:
    """A run that Ctrl-C stops at the 60th ``allocate_slots`` call (after a failing one at
    call ``fail_at``, if given); returns its result and record, checked to be interrupted."""
    impl = make_ref(pytester, body=CTRL_C.format(fail_at=fail_at))
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", impl,
                                "--kv-report=r.jsonl", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["interrupted"] is True
    return result, rec


def test_ctrl_c_gives_no_verdict_and_an_incomplete_record(pytester: pytest.Pytester) -> None:
    result, rec = run_until_ctrl_c(pytester, fail_at=None)
    result.stdout.fnmatch_lines(["verdict: ref: interrupted after * tests: no verdict"])
    assert 0 < rec["completeness"]["ran"] < rec["completeness"]["applicable"]


def test_ctrl_c_after_a_failure_does_not_conform(pytester: pytest.Pytester) -> None:
    """A failure seen before Ctrl-C is proof; the test Ctrl-C stopped is not counted as one."""
    result, rec = run_until_ctrl_c(pytester, fail_at=5)
    assert list(rec["outcomes"].values()).count("failed") == 1  # only the RuntimeError
    (area,) = (a for a, c in rec["areas"].items() if c["failed"])
    assert rec["verdict"] == (f"ref does NOT conform to vllm-0.33: failing areas: {area} "
                              f"(interrupted after {len(rec['outcomes'])} tests)")
    result.stdout.fnmatch_lines([f"verdict: {rec['verdict']}"])


def test_users_own_tests_beside_the_suite_keep_it_complete(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="""
        def test_my_engine_detail(kv_impl, kv_spec):
            assert kv_impl.make_manager(kv_spec).num_free_blocks() > 0
    """)
    result = run(pytester, make_ref(pytester), str(SUITE), "test_mine.py", "--kv-report=r.jsonl",
                 "-rA")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*PASSED*::test_my_engine_detail[[]ref[]]"])
    rec = record(pytester)
    assert rec["complete"] is True and rec["conforms"] is True
    assert not any("test_mine" in t for t in rec["outcomes"]), "only suite tests are recorded"


def test_unsupported_spec_skips_with_reason(pytester: pytest.Pytester) -> None:
    body = """
    from kvcheck.conformance.protocol import UnsupportedSpec
    def make_kv_cache_manager(spec):
        if spec.block_size == 16:
            raise UnsupportedSpec("block_size 16 is not supported")
        return _ref.make_kv_cache_manager(spec)
    """
    result = run(pytester, make_ref(pytester, body=body), "-rs", "-k", "hit_cap")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["*declines this spec: block_size 16 is not supported*"])


def test_record_written_line_stands_on_its_own_line_with_q(pytester: pytest.Pytester) -> None:
    result = run(pytester, make_ref(pytester), "-q", "-k", "test_first_allocation",
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    assert any(line.startswith("kvcheck: result record written to ")
               for line in result.stdout.lines)


def test_an_xdist_subset_is_incomplete(pytester: pytest.Pytester,
                                      full_applicable: int) -> None:
    """A ``-k`` subset on two xdist workers is incomplete, counted against the whole suite.
    (That a whole run on xdist workers is complete and conforms, with every worker's tests
    in its record, is tests/plugin/test_plugin.py's
    ``test_report_record_is_valid_complete_and_whole_under_xdist``.)"""
    pytest.importorskip("xdist")
    part = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                         make_ref(pytester), "-n", "2", "-k", "eviction",
                                         "--kv-report=part.jsonl")
    assert part.ret == 0
    rec = record(pytester, "part.jsonl")
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["applicable"] == full_applicable
    assert 0 < rec["completeness"]["ran"] < full_applicable


CRASH = """
import os
class Manager(_ref.ReferenceManager):
    def reset_prefix_cache(self):
        os._exit(3)
def make_kv_cache_manager(spec):
    return Manager(spec)
"""


def test_crashed_xdist_worker_is_incomplete(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    impl = make_ref(pytester, body=CRASH)
    # The prefix-caching area (its reset tests crash a worker): the crash is named among the
    # reasons whatever else made the run incomplete, so the rest of the suite would only
    # cost time.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           impl, "-n", "2", "-k", "test_prefix_caching",
                                           "--kv-report=r.jsonl")
    assert result.ret != 0
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert "an xdist worker crashed" in rec["completeness"]["reasons"]


# ------------------------------------------------------------------ the verdict line, case by case
def counts(failed: int = 0) -> dict[str, dict[str, int]]:
    zero = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}
    return {"allocation": {**zero, "passed": 3, "failed": failed},
            "eviction": {**zero, "passed": 2}}


TIMED_OUT = Completeness(9, 5, ("1 timed out (pytest-timeout)",),
                         timed_out=frozenset({"test_allocation.py::test_first_allocation[ref]"}))
PATHS_UNCOUNTED = ("a subset of the suite's paths was given (the full suite could not be "
                   "counted)")


@pytest.mark.parametrize(("completeness", "failed", "expected"), [
    (Completeness(5, 5, ()), 1,
     "ref does NOT conform to P: failing areas: allocation"),
    (Completeness(9, 5, ("4 deselected (-k, -m, --deselect or --lf)",)), 1,
     ("ref does NOT conform to P: failing areas: allocation (incomplete run: ran 5 of 9 "
      "applicable tests; 4 deselected (-k, -m, --deselect or --lf))")),
    (Completeness(None, 5, (PATHS_UNCOUNTED,)), 1,
     ("ref does NOT conform to P: failing areas: allocation (incomplete run: ran 5 of ? "
      f"applicable tests; {PATHS_UNCOUNTED})")),
    (Completeness(9, 5, ("interrupted",), interrupted=True), 1,
     "ref does NOT conform to P: failing areas: allocation (interrupted after 6 tests)"),
    (Completeness(9, 5, ("pytest aborted with an internal error",), interrupted=True), 2,
     ("ref does NOT conform to P: failing areas: allocation (aborted after 7 tests: pytest "
      "aborted with an internal error)")),
    (Completeness(5, 5, ()), 0, "ref conforms to P"),
    (Completeness(9, 5, ("4 deselected (-k, -m, --deselect or --lf)",)), 0,
     "ref: incomplete: ran 5 of 9 applicable tests (4 deselected (-k, -m, --deselect or --lf))"),
    (Completeness(9, 5, ("interrupted",), interrupted=True), 0,
     "ref: interrupted after 5 tests: no verdict"),
    (Completeness(9, 5, ("pytest aborted with an internal error",), interrupted=True), 0,
     "ref: aborted after 5 tests (pytest aborted with an internal error): no verdict"),
    (Completeness(None, 0, (RUN_DID_NOT_FINISH,), interrupted=True), 0,
     f"ref: no verdict: {RUN_DID_NOT_FINISH}"),
    # A test pytest-timeout stopped is reported as failed but did not finish: no proof.
    (TIMED_OUT, 1, "ref: incomplete: ran 5 of 9 applicable tests (1 timed out (pytest-timeout))"),
    (TIMED_OUT, 2,
     ("ref does NOT conform to P: failing areas: allocation (incomplete run: ran 5 of 9 "
      "applicable tests; 1 timed out (pytest-timeout))")),
], ids=["complete-failed", "deselected-failed", "unknown-total-failed", "ctrl-c-failed",
        "aborted-failed", "complete-passed", "deselected-passed", "ctrl-c-passed",
        "aborted-passed", "did-not-finish", "timed-out-only", "timed-out-and-failed"])
def test_verdict_line(completeness: Completeness, failed: int, expected: str) -> None:
    """A failure leads with "does NOT conform" whatever the run's completeness, which follows
    in parentheses; without one, a run that fell short is never "conforms"."""
    assert verdict("ref", "P", counts(failed), completeness) == (
        expected == "ref conforms to P", expected)
