"""A verdict that says how much it checked (issue 24, item 8): per area the tests that ran and
their block sizes, per law family the passed tests, what was not applicable and why; under
``generic`` fewer than ``MIN_TESTS_PER_FAMILY`` passed tests in a family is "insufficient
coverage" (``conforms: false``), naming the families and what to declare; the gate and the
leaderboard read such a record sensibly; the record's ``coverage`` is validated.

The whole-suite runs are in-process pytester runs with few Hypothesis examples: a manager-only
variant of tests/nano/nano_kv.py, nano_kv as shipped, and the reference (without its slow
kernel and sizing areas) under vllm-0.33 (``kv_helpers.plain_full_run``, shared with the
verdict tests).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from kv_helpers import plain_full_run

from kvcheck.conformance.recorder import DEFAULT_TRACES
from kvcheck.plugin.cli import main
from kvcheck.plugin.completeness import Completeness, suite_dir
from kvcheck.plugin.coverage import (
    FAMILIES,
    LAW_FAMILIES,
    MIN_TESTS_PER_FAMILY,
    NO_LAW_FILES,
    TestFacts,
    function_key,
    measure,
    unclassified,
)
from kvcheck.plugin.report import verdict
from kvcheck.results.leaderboard import build_boards
from kvcheck.results.schema import RecordError, load_records, validate_record

pytest_plugins = ["pytester"]

NANO_DIR = Path(__file__).resolve().parents[1] / "nano"
MANAGER_ONLY = """
from dataclasses import replace
import nano_kv
IMPL_INFO = replace(nano_kv.IMPL_INFO, name="mini", capabilities=frozenset({"manager"}))
make_kv_cache_manager = nano_kv.make_kv_cache_manager
"""
HITS, EVICTION = "hit correctness", "eviction safety"


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, impl: str,
         *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    """A whole-suite run writing ``r.jsonl``: the result and its one record."""
    monkeypatch.syspath_prepend(str(NANO_DIR))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly",
                                "--kv-max-examples=2", f"--kv-impl={impl}",
                                "--kv-report=r.jsonl", *args)
    (record,) = load_records(pytester.path / "r.jsonl")
    return result, record


def _verdict(result: pytest.RunResult) -> str:
    (line,) = [ln for ln in result.outlines if ln.startswith("verdict: ")]
    return line


def _gate(capsys: pytest.CaptureFixture[str], record: Path) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["gate", "--current", str(record), "--allow-empty"])
    out, err = capsys.readouterr()
    return rc, out + err


# ------------------------------------------------------------------ whole-suite runs
def test_a_manager_only_design_has_insufficient_coverage(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """nano_kv declaring only ``manager``: every test that runs passes, yet nothing is cached,
    so no test checks hit correctness or eviction safety: "insufficient coverage", naming
    both families and ``prefix_caching``; the record is complete and does not conform; the
    gate fails it quoting the verdict; the leaderboard says so."""
    pytester.makepyfile(mini_kv=MANAGER_ONLY)
    pytester.syspathinsert()
    result, record = _run(pytester, monkeypatch, "mini_kv", "--kv-profile=generic")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    line = _verdict(result)
    assert line.startswith("verdict: mini: insufficient coverage for generic ("), line
    assert "conforms" not in line, line
    assert (f"hit correctness 0, eviction safety 0): fewer than {MIN_TESTS_PER_FAMILY} passed "
            "tests check hit correctness, eviction safety (fix: declare prefix_caching)") in line
    result.stdout.fnmatch_lines([
        "  ran per area: allocation *, invariants *",
        f"  law families (passed tests; {MIN_TESTS_PER_FAMILY} needed each): conservation *",
        (f"  insufficient coverage: hit correctness: 0 of {MIN_TESTS_PER_FAMILY} "
         "(declare prefix_caching)"),
        "  not applicable, undeclared capabilities: * tests: *",
        ("  not applicable, exact vLLM behaviour, not run under generic: * tests: "
         f"recorded {DEFAULT_TRACES} (whole area)*"),
    ])
    # The undeclared capabilities' entry (wrapped over lines, largest count first) names it.
    undeclared = result.stdout.str().split("  not applicable, undeclared capabilities: ")[1]
    assert "prefix_caching " in undeclared.split("  not applicable, ")[0], undeclared[:800]
    assert record["complete"] is True and record["conforms"] is False
    assert record["verdict"] == line.removeprefix("verdict: ")
    cov = record["coverage"]
    assert cov["minimum"] == MIN_TESTS_PER_FAMILY and cov["short"] == [HITS, EVICTION]
    assert cov["fixes"] == {HITS: ["declare prefix_caching"],
                            EVICTION: ["declare prefix_caching"]}
    assert cov["families"][HITS] == {"passed": 0, "tests": []}
    assert cov["families"]["conservation"]["passed"] >= MIN_TESTS_PER_FAMILY
    assert cov["undeclared_capabilities"]["prefix_caching"] > 0
    assert cov["ran"] == sum(row["ran"] for row in cov["areas"].values()) == sum(
        c["passed"] for c in record["areas"].values())
    rc, out = _gate(capsys, pytester.path / "r.jsonl")
    assert rc == 1, out
    flat = " ".join(out.split())
    assert "its verdict is 'mini: insufficient coverage for generic (" in flat, out
    assert ("No test failed, so there is no test to waive: declare what the verdict names "
            "(capabilities, block sizes) so that enough of the suite checks hit correctness, "
            "eviction safety") in flat, out
    (board,) = build_boards([("r.jsonl", record)])
    (row,) = board.rows
    assert row.conformance_cell.text == "insufficient coverage (hit correctness, eviction safety)"
    assert row.conformance_cell.status == "incomplete"


def test_nano_kv_conforms_to_generic_with_counts_per_family(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """nano_kv as shipped meets the minimum in every family: "conforms to generic", with the
    tests that ran, their block sizes and the count per family in the line and the record."""
    result, record = _run(pytester, monkeypatch, "nano_kv", "--kv-profile=generic")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    line = _verdict(result)
    cov = record["coverage"]
    assert record["conforms"] is True and cov["short"] == [] and cov["fixes"] == {}
    counts = ", ".join(f"{f} {cov['families'][f]['passed']}" for f in FAMILIES)
    assert line.startswith(f"verdict: nano_kv conforms to generic ({cov['ran']} tests ran at "
                           "block sizes "), line
    assert f"; laws: {counts}); " in line, line
    assert all(cov["families"][f]["passed"] >= MIN_TESTS_PER_FAMILY for f in FAMILIES), cov
    assert "test_eviction.py::test_lazy_eviction_freed_block_still_hits" in (
        cov["families"][EVICTION]["tests"])
    # Every size it ran at is one it declares; the record's union is the areas' union.
    assert set(cov["block_sizes"]) <= {2, 4, 8, 16, 32} and cov["block_sizes"]
    assert cov["block_sizes"] == sorted({b for row in cov["areas"].values()
                                         for b in row["block_sizes"]})
    assert cov["not_applicable"]["vllm_only"]["recorded"] == DEFAULT_TRACES


def test_the_reference_conforms_to_vllm_with_counts(pytester: pytest.Pytester) -> None:
    """Under vllm-0.33 no minimum binds, yet the reference clears it in every family; the
    verdict keeps its wording, with the counts added. The run is ``plain_full_run``'s (the
    reference without kernels under vllm-0.33, made once per test session and read by the
    verdict tests too)."""
    result, record = plain_full_run(pytester)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    line = _verdict(result)
    assert line.startswith("verdict: ref conforms to vllm-0.33 ("), line
    cov = record["coverage"]
    assert cov["minimum"] is None and cov["short"] == []
    assert all(cov["families"][f]["passed"] >= MIN_TESTS_PER_FAMILY for f in FAMILIES), cov
    assert "(passed tests; no minimum under this profile)" in result.stdout.str()
    assert 16 in cov["block_sizes"] and 4 in cov["block_sizes"], cov["block_sizes"]


def test_a_failing_run_keeps_its_verdict_and_names_no_shortfall(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure is proof on its own: the line stays "does NOT conform", the summary shows the
    counts but no "insufficient coverage" (the run stopped, so its families are short), and
    the record carries the coverage all the same."""
    result, record = _run(pytester, monkeypatch, "mut_leak_on_free", "--kv-profile=generic",
                          "-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    assert _verdict(result).startswith(
        "verdict: mut_leak_on_free does NOT conform to generic: failing areas: ")
    result.stdout.fnmatch_lines(["  ran per area: *", "  law families (passed tests; 3 needed*"])
    assert "insufficient coverage" not in result.stdout.str()
    assert record["conforms"] is False and record["coverage"]["short"]


# ------------------------------------------------------------------ the classification
def _suite_tests() -> set[str]:
    """``file::test`` of every test function of the shipped suite (read, not imported)."""
    found = set()
    for path in suite_dir().glob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found |= {f"{path.name}::{node.name}" for node in tree.body
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.name.startswith("test")}
    return found


def test_every_suite_test_is_classified_and_every_entry_exists() -> None:
    """A new suite test must say which law families it checks (``Checks()`` for none), or
    its passes go uncounted; an entry for a test that no longer exists is stale."""
    suite = _suite_tests()
    assert not unclassified(suite), (
        "add these to kvcheck.plugin.coverage.LAW_FAMILIES: " + ", ".join(unclassified(suite)))
    assert not set(LAW_FAMILIES) - suite, sorted(set(LAW_FAMILIES) - suite)
    assert unclassified({"test_allocation.py::test_new_one", "test_kernels.py::test_x"}) == [
        "test_allocation.py::test_new_one"]
    assert {k.partition("::")[0] for k in suite} >= NO_LAW_FILES
    for checks in LAW_FAMILIES.values():
        assert set(checks.always) | set(checks.caching) <= set(FAMILIES), checks


def test_function_key_drops_the_folder_and_the_parameters() -> None:
    assert function_key("conformance/test_prefix_caching.py::test_hit_cap[nano_kv-47]") == (
        "test_prefix_caching.py::test_hit_cap")
    assert function_key("C:\\x\\test_a.py::test_b[i]") == "test_a.py::test_b"


# ------------------------------------------------------------------ measure, in-process
def _facts(outcome: str = "passed", area: str = "prefix_caching", sizes: tuple[int, ...] = (4,),
           needs: tuple[str, ...] = (), generic: bool = True, reason: str = "") -> TestFacts:
    props: list[tuple[str, Any]] = [
        ("kv_gating", {"needs": list(needs), "generic": generic, "profiles": None})]
    if sizes:
        props.append(("kv_block_sizes", list(sizes)))
    return TestFacts.from_properties(outcome, area, props, reason)


def _nodes(*names: str) -> list[str]:
    return [f"conformance/{name}[x]" for name in names]


HIT_TESTS = _nodes("test_prefix_caching.py::test_partial_block_never_hits",
                   "test_prefix_caching.py::test_decode_blocks_become_hits",
                   "test_prefix_caching.py::test_hit_cap_is_num_tokens_minus_one")


def test_a_family_short_by_declined_specs_names_the_block_sizes() -> None:
    """Hit-correctness tests that declined their spec: the fix names the block sizes they
    asked for; parametrized cases of one test count once."""
    caps = frozenset({"manager", "prefix_caching"})
    facts = {HIT_TESTS[0]: _facts(),
             HIT_TESTS[0].replace("[x]", "[y]"): _facts(),
             HIT_TESTS[1]: _facts("skipped", sizes=(16,),
                                  reason="the implementation declines this spec: 16"),
             HIT_TESTS[2]: _facts("skipped", sizes=(16,),
                                  reason="the implementation declines this spec: 16")}
    cov = measure(facts, caps, "generic")
    assert cov.families[HITS] == ("test_prefix_caching.py::test_partial_block_never_hits",)
    assert HITS in cov.short
    assert cov.fixes[HITS] == ["support block size 16 (2 of its tests declined them)"]
    assert cov.not_applicable == {"unsupported_spec": {"prefix_caching": 2}}
    assert cov.areas == {"prefix_caching": (2, (4,))}


def test_vllm_only_tests_are_no_fix_and_capabilities_are_counted() -> None:
    """Declaring a capability is proposed only for tests it would make run under the
    profile: a vLLM-only test needing it is not counted as a gain."""
    caps = frozenset({"manager"})
    vllm_only = "conformance/test_eviction.py::test_lru_refresh_on_hit[x]"
    facts = {vllm_only: _facts("skipped", "eviction", generic=False,
                               reason="checks exact vLLM behaviour"),
             HIT_TESTS[0]: _facts("skipped", needs=("prefix_caching",),
                                  reason="x does not declare capability 'prefix_caching'")}
    cov = measure(facts, caps, "generic")
    assert cov.fixes[HITS] == ["declare prefix_caching"]
    assert cov.fixes[EVICTION] == []
    assert cov.undeclared == {"prefix_caching": 1}
    assert cov.not_applicable == {"vllm_only": {"eviction": 1},
                                  "capability": {"prefix_caching": 1}}
    assert cov.areas_not_run() == {"eviction", "prefix_caching"}


@pytest.mark.parametrize(("reason", "kind", "missing"), [
    ("x does not declare capability 'sliding_window', 'lora' (IMPL_INFO.capabilities)",
     "capability", ("sliding_window", "lora")),
    ("the oracle reference does not declare capability 'kv_cache_groups' (--kv-oracle)",
     "other", ()),
    ("the implementation declines this spec: block size 16", "unsupported_spec", ()),
    ("listed in --kv-skips-file", "skips_file", ()),
    ("no CUDA device and TRITON_INTERPRET is not enabled", "other", ()),
], ids=["own-capability", "oracle-capability", "declined", "skips-file", "other"])
def test_a_skip_by_the_test_itself_is_told_apart(reason: str, kind: str,
                                                 missing: tuple[str, ...]) -> None:
    """A runtime skip naming the implementation's undeclared capabilities counts as one (the
    oracle's does not); a declined spec, the skips file and anything else are their own."""
    facts = _facts("skipped", reason=reason)
    assert facts.not_applicable(frozenset({"manager"}), "generic") == kind
    assert facts.missing(frozenset({"manager"})) == missing


def test_without_recorded_block_sizes_the_line_says_none() -> None:
    """Reports that carry no ``kv_block_sizes`` (a test building no manager, or a plugin that
    does not record them) leave the sizes out rather than inventing them."""
    caps = frozenset({"manager", "prefix_caching"})
    cov = measure({n: _facts(sizes=()) for n in HIT_TESTS}, caps, "generic")
    assert cov.block_sizes == ()
    assert cov.brief().startswith("3 tests ran; laws: conservation 0, ownership 0, "
                                  "hit correctness 3, eviction safety 0")
    assert "ran per area: prefix_caching 3" in cov.summary_lines()[0]


def test_no_minimum_binds_a_design_without_a_manager() -> None:
    """Kernels or sizing alone: the laws do not apply, so no family can be short."""
    node = "conformance/test_kernels.py::test_kernel_matches_reference[x]"
    cov = measure({node: _facts(area="kernels", sizes=())}, frozenset({"kernels"}), "generic")
    assert cov.minimum is None and cov.short == [] and cov.as_record()["families"] == {}
    assert cov.brief() == "1 test ran"
    assert "  law families: not applicable (no 'manager' capability)" in cov.summary_lines()


# ------------------------------------------------------------------ the verdict line
COUNTS = {"prefix_caching": {"passed": 3, "failed": 0, "skipped": 1, "xfailed": 0,
                             "xpassed": 0, "error": 0}}


def test_insufficient_coverage_replaces_conforms_only_in_a_complete_passing_run() -> None:
    caps = frozenset({"manager", "prefix_caching"})
    short = measure({HIT_TESTS[0]: _facts()}, caps, "generic")
    complete = Completeness(4, 4, ())
    conforms, line = verdict("x", "generic", COUNTS, complete, 0, short)
    assert not conforms
    assert line == ("x: insufficient coverage for generic (1 test ran at block size 4; laws: "
                    "conservation 0, ownership 0, hit correctness 1, eviction safety 0): fewer "
                    "than 3 passed tests check conservation, ownership, hit correctness, "
                    "eviction safety; 1 test skipped (see below)")
    failing = {"prefix_caching": {**COUNTS["prefix_caching"], "failed": 1}}
    assert verdict("x", "generic", failing, complete, 0, short) == (
        False, "x does NOT conform to generic: failing areas: prefix_caching")
    partial = Completeness(9, 4, ("5 deselected (-k, -m, --deselect or --lf)",))
    assert verdict("x", "generic", COUNTS, partial, 0, short)[1].startswith("x: incomplete: ")
    enough = measure({n: _facts() for n in HIT_TESTS}, caps, "vllm-0.33")
    assert verdict("x", "vllm-0.33", COUNTS, complete, 0, enough) == (
        True, ("x conforms to vllm-0.33 (3 tests ran at block size 4; laws: conservation 0, "
               "ownership 0, hit correctness 3, eviction safety 0); 1 test skipped (see below)"))


# ------------------------------------------------------------------ the record's field
def _record(tmp_path: Path, **coverage: Any) -> dict[str, Any]:
    """A schema-valid generic record with a coverage object (``coverage`` overrides)."""
    caps = frozenset({"manager", "prefix_caching"})
    cov = measure({n: _facts() for n in HIT_TESTS}, caps, "generic").as_record()
    cov.update(coverage)
    return {"schema_version": 2, "kind": "conformance", "timestamp": "2026-05-01T00:00:00Z",
            "suite_version": "0.1.0", "kvcheck_version": "0.1.0", "profile": "generic",
            "seed": None, "implementation": {"name": "x", "version": "1"},
            "environment": {"hardware_key": "cpu:t"}, "outcomes": {}, "areas": {},
            "verdict": "x: insufficient coverage", "conforms": False, "complete": True,
            "completeness": {"applicable": 0, "ran": 0, "reasons": [], "interrupted": False},
            "coverage": cov}


def test_the_coverage_field_round_trips_and_stays_optional(tmp_path: Path) -> None:
    record = _record(tmp_path)
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    (loaded,) = load_records(path)
    assert loaded["coverage"] == record["coverage"]
    assert loaded["coverage"]["short"] == ["conservation", "ownership", EVICTION]
    del record["coverage"]  # a version-2 record written before the field existed
    assert validate_record(record) is record


@pytest.mark.parametrize(("change", "message"), [
    ({"conforms": True}, "field 'conforms' is true but coverage.short names"),
    ({"coverage": {"short": [HITS]}}, "field 'short' names 'hit correctness', which is not"),
    ({"coverage": {"minimum": None}}, "field 'short' names 'conservation', which is not"),
    ({"coverage": {"block_sizes": [0]}}, "field 'block_sizes' must be a list of ints >= 1"),
    ({"coverage": {"ran": -1}}, "field 'ran' must be >= 0"),
    ({"coverage": {"families": {HITS: {"passed": 2, "tests": ["a"]}}, "short": []}},
     "field 'tests' must list 2 distinct test ids"),
    ({"coverage": {"not_applicable": {"capability": {"a": "1"}}}},
     "not_applicable['capability'] must map names to counts >= 0"),
    ({"coverage": {"fixes": {HITS: "declare"}}}, "field 'fixes' must map families to lists"),
    ({"coverage": []}, "field 'coverage' must be dict"),
], ids=["conforms-while-short", "short-not-short", "short-without-minimum", "size-0",
        "negative-ran", "tests-miscounted", "bad-count", "fix-not-a-list", "not-an-object"])
def test_a_malformed_coverage_is_rejected_naming_the_field(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    record = _record(tmp_path)
    for key, value in change.items():
        if key == "coverage" and isinstance(value, dict):
            record["coverage"].update(value)
        else:
            record[key] = value
    with pytest.raises(RecordError, match=r"coverage|conforms") as info:
        validate_record(record, "r.jsonl:1")
    assert message in str(info.value) and str(info.value).startswith("r.jsonl:1: ")
