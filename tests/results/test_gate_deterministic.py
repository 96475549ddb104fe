"""`kvcheck gate` on deterministic counts (instructions counted by callgrind): no significance
test, a 1% default threshold, a failure line naming the case and how far its count moved, and
wall time beside counts under a method's hardware key shown but never gated. The committed
counted baseline loads and holds what CI counts (CI gates a fresh count against it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.plugin.cli import main
from kvcheck.results.schema import RecordError, load_records, make_metric, validate_record

CALLGRIND = "callgrind:x86_64"
CASE = "scheduler/burst_short"
BASELINE = Path(__file__).resolve().parents[2] / "results/records/reference-counted.jsonl"
# 11 completely separated samples: a significant 11.4% slowdown (as in test_gate.py).
BASE_US = [10.0 + 0.1 * i for i in range(11)]
SLOWER_US = [11.2 + 0.1 * i for i in range(11)]


def count(value: int, case: str = CASE) -> dict[str, Any]:
    return {"name": "instructions", "unit": "instructions", "direction": "lower_is_better",
            "value": value, "samples": [value], "case": case, "deterministic": True}


def gate(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str], base: list[dict[str, Any]],
         cur: list[dict[str, Any]], *args: str,
         hardware_key: str = CALLGRIND) -> tuple[int, str]:
    b = rec.write("base.jsonl", rec.benchmark("reference", base, hardware_key=hardware_key))
    c = rec.write("cur.jsonl", rec.benchmark("reference", cur, hardware_key=hardware_key,
                                             timestamp="2026-01-02T00:00:00+00:00"))
    rc = main(["gate", "--baseline", str(b), "--current", str(c), *args])
    out, _ = capsys.readouterr()
    return rc, out


def test_count_beyond_one_percent_fails_naming_the_case(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """+1.5% on one sample each: no test could call that significant; a count needs none."""
    rc, out = gate(rec, capsys, [count(2_000_000)], [count(2_030_000)])
    assert rc == 1
    assert ("Count 'scheduler/burst_short/instructions' of reference has failed "
            "DeterministicRegressionCheck: it moved +1.50% (2,000,000 -> 2,030,000 "
            "instructions, +30,000), beyond the 1% threshold") in out
    assert "kvcheck gate: FAILED, 1 regression (0 conformance, 1 metric)" in out


def test_count_within_one_percent_passes(rec: SimpleNamespace,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = gate(rec, capsys, [count(2_000_000)], [count(2_019_000)], "--verbose")
    assert rc == 0
    assert "+0.95%" in out and "count" in out
    assert "kvcheck gate: passed (1 record group(s) compared)" in out


def test_fewer_instructions_is_an_improvement(rec: SimpleNamespace,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = gate(rec, capsys, [count(2_000_000)], [count(1_900_000)])
    assert rc == 0
    assert "improved" in out and "-5.00%" in out


def test_unselected_threshold_is_for_timings_a_selected_one_for_counts(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = [count(2_000_000)], [count(2_030_000)]
    rc, _ = gate(rec, capsys, base, cur, "--threshold", "5%")
    assert rc == 1  # "5%" loosens timings, not counts
    rc, out = gate(rec, capsys, base, cur, "--threshold", "instructions:2%")
    assert rc == 0, out
    rc, out = gate(rec, capsys, base, cur, "--threshold", "instructions:0.5%",
                   "--threshold", "5%")
    assert rc == 1 and "beyond the 0.5% threshold" in out


def test_wall_time_beside_counts_is_not_gated(rec: SimpleNamespace,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Under a method's hardware key the machines may differ: an 11% significant wall-time
    slowdown is shown, not failed; the same records under a machine's key fail."""
    base = [count(2_000_000), rec.metric("us_per_call", BASE_US, case=CASE)]
    cur = [count(2_000_000), rec.metric("us_per_call", SLOWER_US, case=CASE)]
    rc, out = gate(rec, capsys, base, cur, "--verbose")
    assert rc == 0, out
    assert "1 wall-time metric(s) beside the callgrind counts were not gated" in out
    assert "not gated" in out
    rc, out = gate(rec, capsys, base, cur, hardware_key=rec.CPU)
    assert rc == 1 and "PercentageRegressionCheck" in out


def test_count_against_a_sampled_figure_is_not_compared(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    sampled = {**count(1_000_000), "deterministic": False}
    rc, out = gate(rec, capsys, [sampled], [count(3_000_000)])
    assert rc == 0
    assert "not comparable" in out


def test_schema_validates_the_deterministic_field() -> None:
    metric = make_metric("instructions", "instructions", "lower", [5.0], 5.0,
                         deterministic=True)
    assert metric["deterministic"] is True
    record = {"schema_version": 2, "kind": "benchmark", "timestamp": "2026-01-01T00:00:00Z",
              "suite_version": "0.1.0", "kvcheck_version": "0.1.0", "profile": "vllm-0.33",
              "implementation": {"name": "x", "version": "1"},
              "environment": {"hardware_key": CALLGRIND},
              "metrics": [{**metric, "deterministic": "yes"}]}
    with pytest.raises(RecordError, match="field 'deterministic' must be bool"):
        validate_record(record)


def test_committed_baseline_is_a_counted_record() -> None:
    (record,) = load_records(BASELINE)
    assert record["environment"]["hardware_key"] == CALLGRIND
    counts = {m["case"] for m in record["metrics"] if m.get("deterministic")}
    assert counts == {f"scheduler/{s}" for s in (
        "shared_system_prompt", "multi_turn_chat", "uniform_random", "long_context",
        "eviction_pressure", "burst_short")}  # what CI counts: --bench scheduler
    assert any(not m.get("deterministic") for m in record["metrics"])  # wall time beside
