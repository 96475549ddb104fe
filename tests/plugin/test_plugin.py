"""The --kv-impl plugin seen from the command line (pytester): options, errors, gating,
skip / xfail files, the summary, the report record and xdist aggregation."""

from __future__ import annotations

import json
import textwrap

import pytest
from inner_runs import NoShrinkProfile
from kv_helpers import make_ref, plain_full_run

from kvcheck.results.schema import load_records

# conftest.py imports what the suite needs before pytester's in-process runs.

GOOD = """
from kvcheck.adapters.reference import IMPL_INFO as _REF, make_kv_cache_manager
from kvcheck.conformance.protocol import ImplInfo
IMPL_INFO = ImplInfo(name="good", version="1.2", capabilities=frozenset([{caps}]),
                     profile="vllm-0.33")
"""
MINIMAL_CAPS = '"manager", "prefix_caching"'


def make_impl(pytester: pytest.Pytester, name: str, body: str) -> None:
    pytester.makepyfile(**{name: textwrap.dedent(body)})
    pytester.syspathinsert()


def run(pytester: pytest.Pytester, *args: str, kernels: bool = False,
        no_shrink: bool = False) -> pytest.RunResult:
    """An in-process suite run; the (slow, interpreted) kernel area only when asked. Without
    it a run of the reference is incomplete (deselected tests): tests that need a complete
    verdict run ``make_ref``'s reference-without-kernels with ``kernels=True``.
    ``no_shrink``: without Hypothesis's shrink phase and without tracebacks, for runs whose
    random tests fail by design and that read only outcomes (shrinking and formatting each
    failure took most of such a run's time, and changes no outcome)."""
    extra = () if kernels or "-k" in args else ("-k", "not test_kernel_matches_reference")
    quiet = ("--tb=no",) if no_shrink else ()
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=5", *extra, *quiet,
                              *args, plugins=[NoShrinkProfile()] if no_shrink else [])


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*kvcheck paged KV-cache conformance*",
        "*--kv-impl=MODULE*",
        "*--kv-profile=*",
        "*--kv-max-examples=N*",
        "*--kv-seed=N*",
        "*--kv-report=PATH*",
        "*--kv-xfails-file=PATH*",
        "*--kv-skips-file=PATH*",
    ])


@pytest.mark.parametrize(
    ("module_body", "target", "expected"),
    [
        (None, "no_such_module_xyz", ["*cannot import 'no_such_module_xyz'*ModuleNotFoundError*",
                                      "*Fix: check the dotted module path*"]),
        ("x = 1\n", "m_noinfo", ["*has no IMPL_INFO*", "*Fix: define IMPL_INFO*"]),
        (("from kvcheck.conformance.protocol import ImplInfo\n"
          "IMPL_INFO = ImplInfo('a', '1', frozenset({'manager'}))\n"),
         "m_nofactory", ["*has no factory 'make_kv_cache_manager'*", "*Fix: define def*"]),
        (("from kvcheck.conformance.protocol import ImplInfo\n"
          "IMPL_INFO = ImplInfo('a', '1', frozenset({'manager'}))\n"
          "def make_kv_cache_manager(spec, other): pass\n"),
         "m_badsig", ["*cannot be called as make_kv_cache_manager(spec)*",
                      "*Fix: make it take exactly one argument*"]),
        (("from kvcheck.conformance.protocol import ImplInfo\n"
          "IMPL_INFO = ImplInfo('a', '1', frozenset({'manager', 'teleport'}))\n"),
         "m_badcap", ["*unknown capabilities [[]'teleport'[]]*", "*Fix: use names from*"]),
        (("from kvcheck.conformance.protocol import ImplInfo\n"
          "IMPL_INFO = ImplInfo('a', '1', frozenset({'manager'}), profile='vllm-9')\n"),
         "m_badprofile", ["*claims unknown profile 'vllm-9'*"]),
        (("from kvcheck.conformance.protocol import ImplInfo\n"
          "from kvcheck.adapters.reference import make_kv_cache_manager as _m\n"
          "IMPL_INFO = ImplInfo('a', '1', frozenset({'manager', 'teleport_free'}"
          " - {'teleport_free'} | {'events'}))\n"
          "class M:\n"
          "    def __init__(self, spec): self._m = _m(spec)\n"
          "    def __getattr__(self, n):\n"
          "        if n == 'take_events': raise AttributeError(n)\n"
          "        return getattr(self._m, n)\n"
          "def make_kv_cache_manager(spec): return M(spec)\n"),
         "m_missing_method", [("*capability 'events' is declared but the manager (M) lacks "
                               "take_events*"), "*Fix: implement take_events or remove 'events'*"]),
    ],
    ids=["unknown-module", "no-impl-info", "no-factory", "bad-signature", "unknown-capability",
         "unknown-profile", "missing-method"],
)
def test_bad_impl_is_a_usage_error_without_traceback(
    pytester: pytest.Pytester, module_body: str | None, target: str, expected: list[str]
) -> None:
    if module_body is not None:
        make_impl(pytester, target, module_body)
    result = run(pytester, f"--kv-impl={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert result.stderr.str().startswith(f"ERROR: kvcheck: --kv-impl={target}: ")
    result.stderr.fnmatch_lines(expected)
    assert "Traceback" not in result.stderr.str()


def test_unknown_profile_option_is_rejected(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-profile=vllm-0.99")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-profile*invalid choice*vllm-0.99*"])


def test_undeclared_capability_skips_with_reason(pytester: pytest.Pytester) -> None:
    make_impl(pytester, "minimal_impl", GOOD.format(caps=MINIMAL_CAPS))
    result = run(pytester, "--kv-impl=minimal_impl", "-rs")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "verdict: good conforms to vllm-0.33*skipped*",
        "*does not declare capability 'block_pool'*",
    ])


def test_raising_method_fails_only_its_own_tests(pytester: pytest.Pytester) -> None:
    make_impl(pytester, "raising_impl", GOOD.format(caps=MINIMAL_CAPS + ', "invariants"') + """
from kvcheck.adapters.reference import ReferenceManager
class Broken(ReferenceManager):
    def check_invariants(self):
        raise RuntimeError("boom")
def make_kv_cache_manager(spec):
    return Broken(spec)
""")
    result = run(pytester, "--kv-impl=raising_impl", "--kv-report=r.jsonl", no_shrink=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (record,) = load_records(pytester.path / "r.jsonl")
    failed = {t for t, o in record["outcomes"].items() if o == "failed"}
    passed = {t for t, o in record["outcomes"].items() if o == "passed"}
    assert failed and passed, "some tests must fail (they check invariants) and others pass"
    # The areas whose tests call check_invariants (the drivers' checks after every step).
    checking = ("invariants", "differential", "allocation", "prefix", "eviction",
                "edge_cases", "block_ownership", "extra_key_kinds")
    outside = sorted(t for t in failed if not any(area in t for area in checking))
    assert not outside, outside


def test_skip_and_xfail_files_and_unmatched_warning(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", skips="test_allocation.py::test_first_allocation  # known\n",
                      xfails="# header\ntest_eviction.py::test_lru_refresh_on_hit\n"
                             "test_does_not_exist\n")
    # Only the two tests the files name run (the rest would only cost time): the files are
    # still matched against the whole collection, and the unmatched line still warns.
    result = run(pytester, "--kv-impl=reference", "--kv-skips-file=skips.txt",
                 "--kv-xfails-file=xfails.txt", "--kv-report=r.jsonl",
                 "-k", "test_first_allocation or test_lru_refresh_on_hit")
    result.stdout.fnmatch_lines([("*kvcheck warning: --kv-xfails-file: 'test_does_not_exist' "
                                  "matches no collected test*")])
    (record,) = load_records(pytester.path / "r.jsonl")
    outcomes = record["outcomes"]
    skipped = [t for t in outcomes if "test_first_allocation" in t]
    xpassed = [t for t in outcomes if "test_lru_refresh_on_hit" in t]
    assert skipped and all(outcomes[t] == "skipped" for t in skipped)
    assert xpassed and all(outcomes[t] == "xpassed" for t in xpassed)


def test_missing_skips_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-skips-file=nope.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-skips-file=nope.txt: cannot read it*"])


def test_missing_xfails_file_under_xdist_is_the_same_usage_error(
        pytester: pytest.Pytester) -> None:
    """Under xdist the workers collect: a file they could not read crashed them, and the
    run printed an INTERNALERROR and "no tests ran" instead of the problem."""
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-impl=reference",
                                           "-n", "2", "--kv-xfails-file=nope.txt")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kv-xfails-file=nope.txt: cannot read it*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_report_record_is_valid_complete_and_whole_under_xdist(
        pytester: pytest.Pytester) -> None:
    """The record of a complete single-process run (``plain_full_run``'s, made once per test
    session), then the same suite on two xdist workers: one record holding every worker's
    tests, written atomically where ``--kv-report`` says, with the seed given."""
    _, record = plain_full_run(pytester)
    assert record["kind"] == "conformance" and record["conforms"] is True
    assert record["complete"] is True and record["completeness"]["reasons"] == []
    assert record["profile"] == "vllm-0.33"
    assert record["environment"]["hardware_key"].startswith(("cpu:", "gpu:"))
    assert set(record["areas"]) >= {"allocation", "eviction", "prefix_caching", "invariants"}
    assert set(record["outcomes"].values()) <= {"passed", "skipped"}
    assert list(record["outcomes"].values()).count("passed") > 30
    assert sum(sum(c.values()) for c in record["areas"].values()) == len(record["outcomes"])
    pytest.importorskip("xdist")
    impl = make_ref(pytester, module="refplain")  # the same module and name as that run's
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           impl, "-n", "2", "--kv-seed=7",
                                           "--kv-report=out/two.jsonl")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["verdict: ref conforms to vllm-0.33*",
                                 "kvcheck: result record written to *two.jsonl"])
    path = pytester.path / "out" / "two.jsonl"
    (two,) = load_records(path)
    assert not list(path.parent.glob(".*.tmp")), "no temporary file left behind"
    json.loads(path.read_text().splitlines()[0])
    assert two["seed"] == 7 and two["implementation"] == record["implementation"]
    assert two["outcomes"] == record["outcomes"], "the -n 2 record must hold every test"
    assert two["areas"] == record["areas"]
    assert two["completeness"] == record["completeness"] and two["complete"] is True


def test_comma_list_parametrizes_each_impl(pytester: pytest.Pytester) -> None:
    make_impl(pytester, "second_impl", GOOD.format(caps=MINIMAL_CAPS))
    make_ref(pytester, name="reference")
    result = run(pytester, "--kv-impl=refnk,second_impl", "--kv-report=r.jsonl", "-v",
                 kernels=True)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*test_first_allocation[[]reference[]] PASSED*",
                                 "*test_first_allocation[[]good[]] PASSED*",
                                 "verdict: reference conforms*", "verdict: good conforms*"])
    assert [r["implementation"]["name"] for r in load_records(pytester.path / "r.jsonl")] == [
        "reference", "good"]


def test_duplicate_impl_names_rejected(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference,reference")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*share the name(s) [[]'reference'[]]*"])


def test_kv_impl_env_fallback(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_IMPL", "reference")
    result = run(pytester, "-q", "-k", "test_first_allocation")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*1 passed*"])


def test_without_impl_conformance_tests_skip(pytester: pytest.Pytester) -> None:
    from pathlib import Path

    import kvcheck.conformance

    suite = Path(kvcheck.conformance.__file__).parent / "test_allocation.py"
    result = run(pytester, str(suite), "-rs")
    result.stdout.fnmatch_lines(["*pass --kv-impl=MODULE (or set KV_IMPL)*"])
    assert result.ret == 0


def test_generic_profile_runs_only_generic_tests(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--kv-impl=reference", "--kv-profile=generic", "--kv-report=r.jsonl")
    assert result.ret == 0
    (record,) = load_records(pytester.path / "r.jsonl")
    assert record["profile"] == "generic"
    assert record["areas"]["eviction"]["skipped"] > 0
    assert record["areas"]["invariants"]["passed"] > 0


