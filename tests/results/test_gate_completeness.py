"""`kvcheck gate` and complete runs: a test that passed in the baseline and is absent now fails
the gate unless --allow-missing or a waiver names it; an incomplete current record fails
unless --allow-incomplete; a schema-1 record is treated as complete, with a warning."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main

LRU = "conformance/test_eviction.py::test_lru[mine]"
FIFO = "conformance/test_eviction.py::test_fifo[mine]"
CHAIN = "conformance/test_hashing.py::test_chain[mine]"
LATER = "2026-01-02T00:00:00+00:00"


def gate(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = main(["gate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def missing_one(rec: SimpleNamespace) -> tuple[Path, Path]:
    """Baseline: three passing tests. Current: complete record in which test_chain is absent
    (a renamed or deleted test: the run itself claims to be complete)."""
    base = rec.write("base.jsonl", rec.conformance("mine", {LRU: "passed", FIFO: "passed",
                                                            CHAIN: "passed"}))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {LRU: "passed", FIFO: "passed"},
                                                 timestamp=LATER))
    return base, cur


def test_a_missing_test_fails_the_gate(missing_one: tuple[Path, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = missing_one
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert ("1 test of mine that passed in the baseline is missing from the current record: "
            "'test_hashing.py::test_chain[mine]'. Run it, or accept its absence with "
            "--allow-missing or a waiver naming it") in out
    assert "missing from the current record" in out and "absent" in out
    assert "kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, 1 missing test)" in out


def test_allow_missing_accepts_it(missing_one: tuple[Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = missing_one
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--allow-missing")
    assert rc == 0
    assert ("warning: 1 test of mine that passed in the baseline is missing from the current "
            "record (accepted by --allow-missing): 'test_hashing.py::test_chain[mine]'") in out
    assert "missing (allowed)" in out
    assert "kvcheck gate: passed (1 record group(s) compared)" in out


def test_a_waiver_naming_the_missing_test_accepts_it(missing_one: tuple[Path, Path],
                                                     tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = missing_one
    waivers = tmp_path / "waivers.txt"
    waivers.write_text("test_hashing.py::test_chain[mine]  # test removed in #77\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 0
    assert ("Test 'test_hashing.py::test_chain[mine]' of mine passed in the baseline and is "
            "missing from the current record [missing; waived: test removed in #77]") in out
    assert "kvcheck gate: passed (1 record group(s) compared, 1 waived)" in out
    assert "matched no regression" not in out
    # A waiver naming another test does not accept this one.
    waivers.write_text("test_hashing.py::test_other[mine]  # unrelated\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 1 and "waiver 'test_hashing.py::test_other[mine]'" in out


def test_only_tests_that_passed_count_as_missing(rec: SimpleNamespace,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Absent now but skipped, failed or xfailed in the baseline: listed, not failing."""
    base = rec.write("base.jsonl", rec.conformance("mine", {LRU: "passed", FIFO: "skipped",
                                                            CHAIN: "xfailed"}))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {LRU: "passed"}, timestamp=LATER))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0 and "missing from the current record" not in out


def test_many_missing_tests_are_counted_and_the_first_five_named(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    ids = [f"conformance/test_eviction.py::test_{i:02d}[mine]" for i in range(8)]
    base = rec.write("base.jsonl", rec.conformance("mine", dict.fromkeys(ids, "passed")))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {ids[0]: "passed"}, timestamp=LATER))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert ("7 tests of mine that passed in the baseline are missing from the current record: "
            "'test_eviction.py::test_01[mine]', 'test_eviction.py::test_02[mine]', "
            "'test_eviction.py::test_03[mine]', 'test_eviction.py::test_04[mine]', "
            "'test_eviction.py::test_05[mine]' and 2 more. Run them, or accept their absence "
            "with --allow-missing or a waiver naming them") in out
    assert "kvcheck gate: FAILED, 7 regressions (0 conformance, 0 metric, 7 missing tests)" in out


@pytest.fixture
def incomplete_run(rec: SimpleNamespace) -> tuple[Path, Path]:
    """Baseline: two passing tests. Current: a -k run that ran one of them."""
    base = rec.write("base.jsonl", rec.conformance("mine", {LRU: "passed", CHAIN: "passed"}))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {LRU: "passed"}, timestamp=LATER,
                                                 incomplete=(1, 2, "1 deselected (-k)")))
    return base, cur


def test_an_incomplete_record_fails_the_gate(incomplete_run: tuple[Path, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = incomplete_run
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--allow-missing")
    assert rc == 1
    assert ("The current record of mine (conformance, vllm-0.33) is incomplete: ran 1 of 2 "
            "applicable tests (1 deselected (-k)). Run the whole suite") in out
    assert "--allow-incomplete" in out
    assert ("kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, 1 incomplete "
            "record)") in out


def test_allow_incomplete_accepts_it(incomplete_run: tuple[Path, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = incomplete_run
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--allow-incomplete",
                      "--allow-missing")
    assert rc == 0
    assert ("warning: the current record of mine (conformance, vllm-0.33) is incomplete: ran 1 "
            "of 2 applicable tests (1 deselected (-k)); accepted by --allow-incomplete") in out
    # The two options are independent: the deselected test is still missing without the other.
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--allow-incomplete")
    assert rc == 1
    assert "kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, 1 missing test)" in out


def test_an_incomplete_record_fails_even_without_a_baseline(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """The record itself is the problem: no hardware match is needed to see it."""
    base = rec.write("base.jsonl", rec.conformance("mine", hardware_key=rec.GPU))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {LRU: "passed"},
                                                 incomplete=(1, 9, "interrupted (Ctrl-C)")))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1 and "is incomplete: ran 1 of 9 applicable tests (interrupted (Ctrl-C))" in out


def test_legacy_current_record_is_treated_as_complete(rec: SimpleNamespace,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = rec.write("base.jsonl", rec.conformance("mine", legacy=True))
    cur = rec.write("cur.jsonl", rec.conformance("mine", legacy=True, timestamp=LATER))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0
    assert ("warning: mine (conformance, vllm-0.33): legacy record (schema 1), completeness "
            "unknown: treated as complete") in out
    # A v1 baseline against a v2 current record: no legacy warning (it is about the current).
    cur2 = rec.write("cur2.jsonl", rec.conformance("mine", timestamp=LATER))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur2)
    assert rc == 0 and "legacy record" not in out


def test_markdown_report_names_missing_and_incomplete(rec: SimpleNamespace, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    base = rec.write("base.jsonl", rec.conformance("mine", {LRU: "passed", CHAIN: "passed"}))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {LRU: "passed"}, timestamp=LATER,
                                                 incomplete=(1, 2, "-x stopped the run")))
    md = tmp_path / "gate.md"
    rc, _, _ = gate(capsys, "--baseline", base, "--current", cur, "--markdown", md)
    assert rc == 1
    text = md.read_text()
    assert text.startswith("### kvcheck gate: FAILED, 2 regressions (0 conformance, 0 metric, "
                           "1 missing test, 1 incomplete record)")
    assert ("- 1 test of mine that passed in the baseline is missing from the current record: "
            "&#x27;test_hashing.py::test_chain[mine]&#x27;.") in text
    assert ("- The current record of mine (conformance, vllm-0.33) is incomplete: ran 1 of 2 "
            "applicable tests (-x stopped the run).") in text
    assert "| mine | (whole record) |  |  |  |  |  | **REGRESSION** |" in text
