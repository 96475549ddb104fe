"""Complete-run verdicts: "conforms" only when every applicable suite test ran and passed.

Each way a run can fall short (deselection, a path or node subset, -x / --maxfail, a skips
file, a collection error, Ctrl-C, a crashed xdist worker) must give an ``incomplete`` verdict
and a record with ``complete: false`` and ``conforms: false``; a full run, with or without the
user's own tests beside it, stays complete.

The implementation under test is the reference without the (slow, interpreted) kernel area
(``kv_helpers.make_ref``), so a whole-suite run takes a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kv_helpers import make_ref

import kvcheck.conformance
from kvcheck.results.schema import load_records

SUITE = Path(kvcheck.conformance.__file__).parent

def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args)


def record(pytester: pytest.Pytester, name: str = "r.jsonl") -> dict:
    (rec,) = load_records(pytester.path / name)
    return rec


@pytest.fixture
def full_applicable(pytester: pytest.Pytester) -> int:
    """M for the reference without kernels under vllm-0.33, from a complete run."""
    result = run(pytester, make_ref(pytester), "--kv-report=full.jsonl")
    assert result.ret == 0
    rec = record(pytester, "full.jsonl")
    assert rec["complete"] is True and rec["conforms"] is True
    return rec["completeness"]["applicable"]


def test_full_run_is_complete_and_conforms(pytester: pytest.Pytester) -> None:
    result = run(pytester, make_ref(pytester), "--kv-report=r.jsonl")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["verdict: ref conforms to vllm-0.33*"])
    rec = record(pytester)
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
    assert comp["applicable"] == comp["ran"] == len(rec["outcomes"]) - 58 - sizing["skipped"] > 80


def test_keyword_selection_is_incomplete(pytester: pytest.Pytester, full_applicable: int) -> None:
    result = run(pytester, make_ref(pytester), "-k", "test_allocation", "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    ran = rec["completeness"]["ran"]
    assert 5 < ran < full_applicable
    result.stdout.fnmatch_lines([
        (f"verdict: ref: incomplete: ran {ran} of {full_applicable} applicable tests "
        f"({full_applicable - ran} deselected (-k, -m, --deselect or --lf))")])
    assert "conforms to" not in result.stdout.str()
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


@pytest.mark.parametrize("stop", [["-x"], ["--maxfail=2"]], ids=["x", "maxfail"])
def test_early_stop_is_incomplete(pytester: pytest.Pytester, stop: list[str]) -> None:
    result = run(pytester, make_ref(pytester, body=BROKEN_FREE), *stop, "--kv-report=r.jsonl")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert any(r.startswith("stopped early") for r in rec["completeness"]["reasons"])
    result.stdout.fnmatch_lines([("verdict: ref: incomplete: ran * applicable tests (stopped "
                                 "early*; failing areas: *")])


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
        if _calls[0] == 60:
            raise KeyboardInterrupt
        return super().allocate_slots(*args, **kwargs)
def make_kv_cache_manager(spec):
    return Manager(spec)
"""


def test_ctrl_c_gives_no_verdict_and_an_incomplete_record(pytester: pytest.Pytester) -> None:
    impl = make_ref(pytester, body=CTRL_C)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", impl,
                                "--kv-report=r.jsonl", no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["verdict: ref: interrupted after * tests: no verdict"])
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["interrupted"] is True
    assert 0 < rec["completeness"]["ran"] < rec["completeness"]["applicable"]


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


def test_xdist_run_is_complete_and_a_subset_is_not(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    impl = make_ref(pytester)
    full = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                         impl, "-n", "2", "--kv-report=full.jsonl")
    assert full.ret == 0
    full.stdout.fnmatch_lines(["verdict: ref conforms to vllm-0.33*"])
    assert record(pytester, "full.jsonl")["complete"] is True
    part = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                         impl, "-n", "2", "-k", "eviction",
                                         "--kv-report=part.jsonl")
    assert part.ret == 0
    rec = record(pytester, "part.jsonl")
    assert rec["complete"] is False and rec["conforms"] is False
    assert rec["completeness"]["applicable"] == record(pytester, "full.jsonl")[
        "completeness"]["applicable"]


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
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           impl, "-n", "2", "--kv-report=r.jsonl")
    assert result.ret != 0
    rec = record(pytester)
    assert rec["complete"] is False and rec["conforms"] is False
    assert "an xdist worker crashed" in rec["completeness"]["reasons"]
