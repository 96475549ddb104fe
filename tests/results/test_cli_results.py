"""One entry point: `kvcheck --help` lists every command, and a real `pytest --kv-report`
record goes through `kvcheck gate` and `kvcheck leaderboard` (the two-command path)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main
from kvcheck.results import gate as _gate
from kvcheck.results import html as _html

# Loaded before the pytester fixture snapshots sys.modules: its teardown drops modules first
# imported during a test, and numpy (used by the gate) cannot be imported twice.
_PRELOADED = (_gate, _html)


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("run", "replay", "compare", "gate", "leaderboard"):
        assert f"    {command}" in out, command
    for command in ("run", "replay", "compare", "gate", "leaderboard"):
        with pytest.raises(SystemExit) as info:
            main([command, "--help"])
        assert info.value.code == 0
        assert f"usage: kvcheck {command}" in capsys.readouterr().out


def test_report_to_gate_and_page(pytester: pytest.Pytester,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "--kv-impl=reference",
                                           "--kv-report=r.jsonl", "-k", "test_first_allocation")
    assert result.ret == 0
    report = pytester.path / "r.jsonl"
    record = json.loads(report.read_text())
    assert record["schema_version"] == 2 and record["complete"] is False
    assert record["conforms"] is False and record["completeness"]["ran"] == 1

    # A -k run is incomplete: the gate fails it unless a partial run is accepted.
    assert main(["gate", "--baseline", str(report), "--current", str(report)]) == 1
    out = capsys.readouterr().out
    assert ("The current record of reference (conformance, vllm-0.33) is incomplete: ran 1 of "
            in out)
    assert ("kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, 1 incomplete record)"
            in out)
    assert main(["gate", "--baseline", str(report), "--current", str(report),
                 "--allow-incomplete"]) == 0
    assert "kvcheck gate: passed" in capsys.readouterr().out
    assert main(["leaderboard", str(report), "--format", "html", "-o", "board.html"]) == 0
    page = (pytester.path / "board.html").read_text()
    assert "reference 0.1.0" in page and "incomplete (ran 1 of " in page
    assert "✓ conforms" not in page

    # The same run, but one test that passed now fails: the gate says so and exits 1.
    test_id = next(t for t, o in record["outcomes"].items() if o == "passed")
    record["outcomes"][test_id] = "failed"
    broken = pytester.path / "broken.jsonl"
    broken.write_text(json.dumps(record) + "\n")
    assert main(["gate", "--baseline", str(report), "--current", str(broken),
                 "--allow-incomplete"]) == 1
    short_id = test_id.rsplit("/", 1)[-1]
    assert (f"Test '{short_id}' of reference has failed ConformanceCheck: passed -> failed"
            in capsys.readouterr().out)


def test_compare_two_implementations(rec: SimpleNamespace,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Files holding one implementation each are compared with each other."""
    a = rec.write("a.jsonl", rec.benchmark("reference", [rec.metric("t", [1.0, 2.0, 3.0])]))
    b = rec.write("b.jsonl", rec.benchmark("mine", [rec.metric("t", [2.0, 3.0, 4.0])]))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "reference (benchmark, vllm-0.33) [cpu:Test CPU x4] -> mine" in out
    assert "+50.0%" in out and "3/3" in out
    (rec.write("bad.jsonl")).write_text("nope\n")
    assert main(["compare", str(a), str(Path(a).parent / "bad.jsonl")]) == 2
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err
