"""`kvcheck leaderboard`: rows, per-hardware tables, ratios, escaping, and the committed
results/LEADERBOARD.md staying in sync with results/records/."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main
from kvcheck.plugin.completeness import suite_key
from kvcheck.results.compare import load_files
from kvcheck.results.leaderboard import area_cell, build_boards, render_markdown

ROOT = Path(__file__).resolve().parents[2]
EVIL = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>|*_`'


def board_records(rec: SimpleNamespace) -> list[tuple[str, dict]]:
    """reference (10 us, 200 ops/s) and fast (7.5 us, 250 ops/s) on the CPU, plus one
    GPU-only record; fast fails one eviction test."""
    def metrics(us: float, ops: float) -> list[dict]:
        return [rec.metric("us_per_call", [us], case="alloc"),
                rec.metric("ops", [ops], unit="ops/s", direction="higher_is_better")]

    records = [
        rec.conformance("reference"),
        rec.benchmark("reference", metrics(10.0, 200.0)),
        rec.conformance("fast", {"t/test_eviction.py::test_lru[fast]": "failed",
                                 "t/test_eviction.py::test_fifo[fast]": "passed",
                                 "t/test_hashing.py::test_chain[fast]": "xfailed"}),
        rec.benchmark("fast", metrics(7.5, 250.0)),
        rec.benchmark("gpuonly", metrics(1.0, 900.0), hardware_key=rec.GPU),
    ]
    return [("r.jsonl", r) for r in records]


def test_rows_tables_and_ratios(rec: SimpleNamespace) -> None:
    cpu, gpu = sorted(build_boards(board_records(rec)), key=lambda b: b.hardware_key)
    assert (cpu.hardware_key, gpu.hardware_key) == (rec.CPU, rec.GPU)
    assert [r.name for r in cpu.rows] == ["reference", "fast"]   # conforming first
    assert cpu.areas == ["eviction", "hashing"]
    assert cpu.metric_keys == ["alloc/us_per_call", "ops"]
    ref, fast = cpu.rows
    assert fast.ratios == {"alloc/us_per_call": 0.75, "ops": 1.25}
    assert ref.ratios == {"alloc/us_per_call": 1.0, "ops": 1.0}
    assert fast.area("eviction").text == "✗ 1 failed"
    assert fast.area("hashing").text == "✓ 0 (1 xfail)"
    assert fast.conformance_cell.text == "✗ does NOT conform (1/2)"
    assert gpu.rows[0].ratios == {"alloc/us_per_call": None, "ops": None}  # no reference there


def test_area_cells() -> None:
    assert area_cell({"passed": 3, "skipped": 1}).text == "✓ 3"
    assert area_cell({"skipped": 4}).status == "skip"
    assert area_cell({"passed": 1, "error": 1}).sort == 0.5
    assert area_cell(None).status == "none"


def test_key_metrics(rec: SimpleNamespace) -> None:
    """--metric picks the main table's metric columns; the metrics table keeps them all."""
    boards = build_boards(board_records(rec), metric_patterns=["alloc/*"])
    assert all(b.key_metrics == ["alloc/us_per_call"] for b in boards)
    assert all(b.metric_keys == ["alloc/us_per_call", "ops"] for b in boards)


def test_many_metrics_go_to_the_metrics_table(rec: SimpleNamespace) -> None:
    """Five metrics (more than MAX_KEY_METRICS = 4): none in the main table unless chosen;
    the metrics table has one row per metric and one column per implementation."""
    records = [("r.jsonl", rec.benchmark(name, [rec.metric(f"m{i}", [float(i + k)])
                                                for i in range(5)]))
               for k, name in ((1, "reference"), (2, "other"))]
    (board,) = build_boards(records)
    assert board.key_metrics == [] and len(board.metric_keys) == 5
    text = render_markdown([board])
    assert "5 metrics, listed below; choose key metrics for this table with --metric" in text
    assert "| metric | unit | better | other 1.0 @0123456789 (vllm-0.33) | reference 1.0" in text
    assert "| m0 | us | lower | 2 us (2.00× ref) | 1 us |" in text


def test_markdown_escapes_untrusted_names(rec: SimpleNamespace) -> None:
    records = [("r.jsonl", rec.conformance(EVIL)),
               ("r.jsonl", rec.benchmark(EVIL, [rec.metric("t", [1.0])]))]
    text = render_markdown(build_boards(records))
    assert "<script>" not in text and "<img" not in text
    assert "&lt;script&gt;" in text and "\\|\\*\\_\\`" in text
    # Every table line still has its header's number of cells (pipes were escaped).
    for table in text.split("\n\n"):
        rows = [line for line in table.splitlines() if line.startswith("|")]
        assert len({line.replace("\\|", "").count("|") for line in rows}) <= 1, table


def test_conformance_only_records(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    path = rec.write("c.jsonl", rec.conformance("reference"), rec.conformance("other"))
    assert main(["leaderboard", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "No benchmark metrics recorded on this hardware yet." in out
    assert "| reference 1.0 | vllm-0.33 | ✓ conforms (2/2) | ✓ 1 | ✓ 1 |" in out


def test_cli_table_and_html_output(rec: SimpleNamespace, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = rec.write("r.jsonl", *(r for _, r in board_records(rec)))
    assert main(["leaderboard", str(path)]) == 0
    out = capsys.readouterr().out
    assert "kvcheck leaderboard: cpu:Test CPU x4" in out and "eviction (1)" in out
    assert "7.5 us (0.75× ref)" in out
    page = tmp_path / "site" / "board.html"
    assert main(["leaderboard", str(path), "--format", "html", "-o", str(page)]) == 0
    assert "2 table(s) written to" in capsys.readouterr().out
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert oct(page.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_html_escapes_every_record_string(rec: SimpleNamespace) -> None:
    from kvcheck.results.html import render_html

    records = [("<b>file</b>.jsonl", rec.conformance(EVIL)),
               ("x", rec.benchmark(EVIL, [rec.metric("t<i>", [1.0], unit="u<s>",
                                                     case="c\"'><script>")]))]
    page = render_html(build_boards(records))
    assert page.count("<script>") == 1  # only the page's own
    assert "<img" not in page and "<b>" not in page and "<i>" not in page
    assert "&lt;script&gt;document.title=&quot;pwned&quot;" in page


def test_bad_input_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.jsonl").write_text("{\n")
    assert main(["leaderboard", str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "kvcheck leaderboard: " in err and "bad.jsonl:1: not valid JSON" in err


def test_committed_leaderboard_is_up_to_date(monkeypatch: pytest.MonkeyPatch) -> None:
    """results/LEADERBOARD.md is exactly what the committed records render to."""
    monkeypatch.chdir(ROOT)  # the page lists its sources relative to the repository root
    files = sorted(Path("results/records").glob("*.jsonl"))
    assert files, "results/records/ holds no records"
    expected = render_markdown(build_boards(load_files(files)))
    committed = Path("results/LEADERBOARD.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "results/LEADERBOARD.md is stale; regenerate it from the repository root with\n"
        "  kvcheck leaderboard results/records/*.jsonl --format markdown "
        "-o results/LEADERBOARD.md")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_committed_reference_records_list_the_suite_of_today(pytester: pytest.Pytester,
                                                              profile: str) -> None:
    """results/records/reference-PROFILE.jsonl holds an outcome for every test the shipped
    suite collects on the reference under PROFILE today, and for no other: a record from an
    older suite (the leaderboard then shows counts the suite no longer has) fails here."""
    # The records were made with the kernels extra, whose cases the kernel area collects.
    for module in ("torch", "triton"):
        pytest.importorskip(module, reason="the records list the kernel cases: pip install -e "
                            "'.[kernels]'")
    record_path = ROOT / "results" / "records" / f"reference-{profile}.jsonl"
    (record,) = [r for _, r in load_files([record_path])]
    # The record names tests from the folder it ran in (the repository root), the collection
    # below from pytester's: compared from the suite file's name on.
    recorded = {suite_key(test) for test in record["outcomes"]}
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                f"--kv-profile={profile}", "--collect-only", "-q")
    assert result.ret == 0, "\n".join(result.outlines[-20:])
    collected = {suite_key(line) for line in result.outlines if "::" in line}
    assert len(collected) > 500
    assert recorded == collected, (
        f"{record_path.name} is stale: {len(collected - recorded)} tests of today's suite "
        f"are not in it (e.g. {sorted(collected - recorded)[:3]}), {len(recorded - collected)} "
        f"of its tests no longer exist (e.g. {sorted(recorded - collected)[:3]}); regenerate "
        "the records and the leaderboard as docs/ci.md (\"kvcheck's own records\") says")
