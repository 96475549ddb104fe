"""Leaderboards and untrusted text: incomplete records are shown as incomplete, never with the
✓, in the terminal table, Markdown and HTML alike; legacy records say their completeness is
unknown; control and bidi characters in record strings are shown as escapes, never obeyed."""

from __future__ import annotations

import html
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main
from kvcheck.results.leaderboard import build_boards, render_markdown, render_table
from kvcheck.results.text import visible

LRU = "conformance/test_eviction.py::test_lru[{}]"
CHAIN = "conformance/test_hashing.py::test_chain[{}]"


def _records(rec: SimpleNamespace) -> list[tuple[str, dict]]:
    """full: both tests pass, complete; part: one of two ran (-k), it passed."""
    return [
        ("r.jsonl", rec.conformance("full")),
        ("r.jsonl", rec.conformance("part", {LRU.format("part"): "passed"},
                                    incomplete=(1, 2, "1 deselected (-k)"))),
    ]


def _line(text: str, name: str) -> str:
    (line,) = [x for x in text.splitlines() if (f"{name} 1.0" in x and "|" in x) or
               (f"{name} 1.0" in x and "│" in x)]
    return line


def test_incomplete_row_in_the_terminal_table(rec: SimpleNamespace) -> None:
    text = render_table(build_boards(_records(rec)))
    part = _line(text, "part")
    assert "incomplete (ran 1 of 2)" in part and "✓" not in part
    assert "1/2 areas without failures (incomplete run)" in part  # hashing did not run
    full = _line(text, "full")
    assert "✓ conforms (2/2)" in full and "✓ 2/2 areas pass" in full


def test_incomplete_row_in_markdown(rec: SimpleNamespace) -> None:
    text = render_markdown(build_boards(_records(rec)))
    assert "| full 1.0 | vllm-0.33 | ✓ conforms (2/2) | ✓ 1 | ✓ 1 |" in text
    assert "| part 1.0 | vllm-0.33 | incomplete (ran 1 of 2) | 1 passed |  |" in text
    assert ("- part 1.0 (vllm-0.33): incomplete: ran 1 of 2 applicable tests (1 deselected "
            "(-k))") in text


def test_incomplete_row_in_html(rec: SimpleNamespace) -> None:
    from kvcheck.results.html import render_html

    page = render_html(build_boards(_records(rec)))
    (row,) = [x for x in page.splitlines() if 'data-impl="part"' in x]
    assert '<td class="incomplete"' in row and ">incomplete (ran 1 of 2)</td>" in row
    assert ">1 passed</td>" in row and "✓" not in row
    (full,) = [x for x in page.splitlines() if 'data-impl="full"' in x]
    assert ">✓ conforms (2/2)</td>" in full


def test_incomplete_with_failures_stays_a_failure(rec: SimpleNamespace) -> None:
    records = [("r.jsonl", rec.conformance("part", {LRU.format("part"): "failed"},
                                           incomplete=(1, 2, "-x stopped the run")))]
    text = render_markdown(build_boards(records))
    assert "| part 1.0 | vllm-0.33 | ✗ does NOT conform (0/1), incomplete (ran 1 of 2) |" in text


def test_rows_sort_conforming_then_incomplete_then_failing(rec: SimpleNamespace) -> None:
    records = [*_records(rec),
               ("r.jsonl", rec.conformance("bad", {LRU.format("bad"): "failed"}))]
    (board,) = build_boards(records)
    assert [r.name for r in board.rows] == ["full", "part", "bad"]


def test_legacy_record_notes_unknown_completeness(rec: SimpleNamespace,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = rec.write("old.jsonl", rec.conformance("old", legacy=True))
    assert main(["leaderboard", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| old 1.0 | vllm-0.33 | ✓ conforms (2/2) |" in out
    assert ("- old 1.0 (vllm-0.33): old conforms to vllm-0.33 (legacy record: completeness "
            "unknown)") in out


# ------------------------------------------------------------------ untrusted text
RLO = "\u202e"
# Displayed by a bidi-aware viewer, the part after U+202E runs right to left: this name would
# make the row read "mine conforms" ... reversed into whatever the attacker wrote.
SPOOF = f"mine{RLO}mrofnoc TON seod"


def test_visible_escapes_hidden_characters() -> None:
    assert visible(SPOOF) == "mine\\u202emrofnoc TON seod"
    assert visible("a\nb\tc\rd\x1b[31m") == "a\\nb\\tc\\rd\\u001b[31m"
    assert visible("zero\u200bwidth\u2066iso\u2069") == "zero\\u200bwidth\\u2066iso\\u2069"
    assert visible("line\u2028sep") == "line\\u2028sep"
    assert visible("\U000e0041tag") == "\\U000e0041tag"
    assert visible("naïve ✓ × ↓ 東京") == "naïve ✓ × ↓ 東京"  # printable text is kept
    assert visible("plain") == "plain"


def _spoofed(rec: SimpleNamespace) -> list[tuple[str, dict]]:
    record = rec.conformance(SPOOF, {LRU.format("x"): "passed"})
    record["verdict"] = f"verdict{RLO} text\n## forged heading"
    return [(f"dir{RLO}/r.jsonl", record),
            ("r.jsonl", rec.benchmark(SPOOF, [rec.metric(f"m{RLO}", [1.0])]))]


def test_rtl_override_is_neutralised_in_every_format(rec: SimpleNamespace) -> None:
    from kvcheck.results.html import render_html

    boards = build_boards(_spoofed(rec))
    for name, text in (("table", render_table(boards)), ("markdown", render_markdown(boards)),
                       ("html", render_html(boards))):
        assert RLO not in text, name
        assert "\n## forged heading" not in text, name
        assert "mine\\u202emrofnoc TON seod" in html.unescape(text).replace("\\\\", "\\"), name
        if name != "table":  # the terminal table has no verdict lines
            assert "verdict\\u202e text\\n## forged heading" in html.unescape(text).replace(
                "\\\\", "\\").replace("\\#", "#"), name


def test_rtl_override_is_neutralised_in_gate_reports(rec: SimpleNamespace, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    test_id = f"conformance/test_eviction.py::test_lru{RLO}[x]"
    base = rec.write("base.jsonl", rec.conformance(SPOOF, {test_id: "passed"}))
    cur = rec.write("cur.jsonl", rec.conformance(SPOOF, {test_id: "failed"},
                                                 timestamp="2026-01-02T00:00:00+00:00"))
    md = tmp_path / "gate.md"
    assert main(["gate", "--baseline", str(base), "--current", str(cur),
                 "--markdown", str(md)]) == 1
    out = capsys.readouterr().out
    assert RLO not in out and RLO not in md.read_text()
    assert ("Test 'test_eviction.py::test_lru\\u202e[x]' of mine\\u202emrofnoc TON seod has "
            "failed ConformanceCheck: passed -> failed") in out
    assert "mine\\u202emrofnoc TON seod" in md.read_text()
    assert main(["compare", str(base), str(cur)]) == 0
    assert RLO not in capsys.readouterr().out


def test_unknown_applicable_count_is_shown_as_a_question_mark(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    record = rec.conformance("mine", {})
    record["completeness"] = {"applicable": None, "ran": 0, "interrupted": True,
                              "reasons": ["the test collection never completed"]}
    record.update(complete=False, conforms=False)
    path = rec.write("r.jsonl", record)
    assert main(["leaderboard", str(path), "--format", "markdown"]) == 0
    assert "| mine 1.0 | vllm-0.33 | incomplete (ran 0 of ?) |" in capsys.readouterr().out
    assert main(["gate", "--baseline", str(path), "--current", str(path)]) == 1
    assert ("is incomplete: ran 0 of ? applicable tests (the test collection never "
            "completed)") in capsys.readouterr().out
