"""The verdict where CI dashboards look: pytest-html's report, JUnit XML test-suite
properties; and kvcheck's terminal lines on lines of their own beside progress plugins."""

from __future__ import annotations

import html
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from kv_helpers import make_ref, plain_full_html_page, plain_full_run

from kvcheck.results.schema import OUTCOMES, load_records

ALLOCATION = ("-k", "test_allocation or test_slot_mapping")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", "--kv-max-examples=3", *args)


def record(pytester: pytest.Pytester) -> dict[str, Any]:
    (rec,) = load_records(pytester.path / "r.jsonl")
    return rec


def test_the_verdict_and_area_table_are_in_the_html_report(pytester: pytest.Pytester) -> None:
    """The page of ``plain_full_run``'s complete run (made once per test session with
    ``--html --self-contained-html`` beside its ``--kv-report``)."""
    pytest.importorskip("pytest_html")
    result, rec = plain_full_run(pytester)
    assert result.ret == 0
    assert rec["conforms"] is True
    page = plain_full_html_page(pytester)
    assert f"<strong>verdict:</strong> {html.escape(rec['verdict'])}</p>" in page
    assert "kvcheck conformance: ref 0.1.0 (vllm-0.33)" in page
    for area, counts in rec["areas"].items():
        cells = "".join(f"<td>{counts[o]}</td>" for o in OUTCOMES)
        assert f"<tr><td>{area}</td>{cells}</tr>" in page, area


def test_junit_xml_carries_verdict_conforms_and_complete(pytester: pytest.Pytester) -> None:
    result = run(pytester, make_ref(pytester), *ALLOCATION, "--junitxml=junit.xml",
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    rec = record(pytester)
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["kvcheck.ref.verdict"] == rec["verdict"]
    assert rec["verdict"].startswith("ref: incomplete")  # a -k subset
    assert props["kvcheck.ref.conforms"] == "false"
    assert props["kvcheck.ref.complete"] == "false"


@pytest.mark.parametrize("reader", ["nothing", "junit"])
def test_a_verdict_nothing_reads_is_not_computed(pytester: pytest.Pytester,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 reader: str) -> None:
    """A run of part of the suite's files counts what it left out by collecting the whole
    suite in a child pytest (the verdict's "applicable" count). A session that prints no
    summary (no terminal reporter), writes no record and no JUnit file does not pay for it
    (kvcheck's own in-process mutant runs are such sessions); with ``--junitxml`` alone the
    verdict is computed and lands in the file."""
    import kvcheck.plugin.state
    from kvcheck.plugin.completeness import suite_dir

    children: list[str] = []
    real = kvcheck.plugin.state.inventory_subprocess

    def counted(*args: Any, **kwargs: Any) -> Any:
        children.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(kvcheck.plugin.state, "inventory_subprocess", counted)
    junit = ("--junitxml=junit.xml",) if reader == "junit" else ()
    rec = pytester.inline_run(make_ref(pytester), "-p", "no:cacheprovider", "-p", "no:terminal",
                              "--kv-max-examples=3", str(suite_dir() / "test_allocation.py"),
                              *junit)
    passed, _, failed = rec.listoutcomes()
    assert passed and not failed
    if reader == "nothing":
        assert children == []
        return
    assert len(children) == 1
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["kvcheck.ref.verdict"].startswith("ref: incomplete: ran ")


PROGRESS_PLUGIN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    # A progress bar redrawn with a carriage return and never ended.
    terminalreporter.write("\\r[progress] 100% ##########")
"""


def assert_own_lines(out: str) -> None:
    lines = out.replace("\r\n", "\n").split("\n")
    starts = ("verdict: ", "kvcheck: result record written to ")
    for prefix in starts:
        hits = [line for line in lines if prefix in line]
        assert hits, f"no {prefix!r} line"
        assert all(line.startswith(prefix) for line in hits), hits
    title = [line for line in lines if "kvcheck conformance: " in line]
    assert title and all(line.strip().startswith("kvcheck conformance: ") for line in title)


@pytest.mark.parametrize("verbosity", ["-q", "-v"])
def test_lines_stand_alone_after_a_progress_bar(pytester: pytest.Pytester,
                                                verbosity: str) -> None:
    pytester.makepyfile(progress_bar=PROGRESS_PLUGIN)
    result = run(pytester, "-p", "progress_bar", verbosity, make_ref(pytester), *ALLOCATION,
                 "--kv-report=r.jsonl")
    assert result.ret == 0
    assert "[progress] 100%" in result.stdout.str()
    assert_own_lines(result.stdout.str())


def test_lines_stand_alone_with_pytest_sugar(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_sugar")
    # A subprocess: sugar, once enabled, stays enabled in the process that loaded it.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kv-max-examples=3",
                                           "--force-sugar", make_ref(pytester), *ALLOCATION,
                                           "--kv-report=r.jsonl")
    assert result.ret == 0
    assert "Results (" in result.stdout.str(), "sugar's own summary"
    assert_own_lines(result.stdout.str())
