"""Session bookkeeping: defaults, kernel ratios against the torch reference, records, tables."""

from __future__ import annotations

import pytest

from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.session import BenchOptions, BenchResult, BenchSession
from kvcheck.bench.table import fmt_number, render_tables
from kvcheck.results.schema import metric_key, validate_record

ENV = {"hardware_key": "cpu:test x2"}


def _kernel(subject: str, time_us: float, gbps: float) -> BenchResult:
    return BenchResult(
        "kernels", "paged_attention_decode/b2", subject, "1.0", f"n::{subject}", "cuda",
        [Metric("time_us", "us", "lower_is_better", time_us, [time_us]),
         Metric("gbps", "GB/s", "higher_is_better", gbps, [gbps])],
        info={"provider_label": f"{subject} 1.0"})


def test_rounds_defaults_and_overrides() -> None:
    """5 + 1 allocator rounds, 30 + 5 CUDA kernel rounds, 3 + 1 on the CPU; options win."""
    assert BenchOptions().rounds_for("allocator") == (5, 1)
    assert BenchOptions().rounds_for("kernels-cuda") == (30, 5)
    assert BenchOptions().rounds_for("kernels-cpu") == (3, 1)
    assert BenchOptions(rounds=2, warmup=0).rounds_for("kernels-cuda") == (2, 0)


def test_kernel_figures_are_compared_with_the_torch_reference() -> None:
    """torch_ref 100 us, kvcheck_triton 10 us, vllm 5 us: triton's time ratio is 0.1 (a 10x
    speedup), vllm runs 2x as fast as kvcheck_triton; pytest-benchmark's extra_info follows."""
    session = BenchSession(BenchOptions())
    results = [_kernel("torch_ref", 100.0, 1.0), _kernel("kvcheck_triton", 10.0, 10.0),
               _kernel("vllm", 5.0, 20.0)]
    extras = [{}, {}, {}]
    for result, extra in zip(results, extras, strict=True):
        session.add(result, type("B", (), {"extra_info": extra})())
    session.finalize()
    _, triton, vllm = results
    assert triton.metric("time_us").ratio_to_reference == pytest.approx(0.1)
    assert vllm.metric("gbps").ratio_to_reference == pytest.approx(20.0)
    assert vllm.info["speedup_vs_kvcheck_triton"] == pytest.approx(2.0)
    assert "speedup_vs_kvcheck_triton" not in triton.info
    assert extras[1]["time_us_ratio_to_reference"] == pytest.approx(0.1)
    assert extras[2]["speedup_vs_kvcheck_triton"] == pytest.approx(2.0)
    session.finalize()  # idempotent
    assert triton.metric("time_us").reference_value == 100.0


def test_records_one_per_subject_with_unique_metric_keys() -> None:
    """Each measured subject gets a valid benchmark record; metrics are keyed by case."""
    session = BenchSession(BenchOptions(seed=3))
    session.add(_kernel("torch_ref", 100.0, 1.0))
    session.add(_kernel("kvcheck_triton", 10.0, 10.0))
    records = session.records("vllm-0.33", ENV, {"note": "x"})
    assert [r["implementation"]["name"] for r in records] == ["torch_ref", "kvcheck_triton"]
    for record in records:
        validate_record(record)
        assert record["seed"] == 3 and record["extra"]["note"] == "x"
        keys = [metric_key(m) for m in record["metrics"]]
        assert keys == ["kernels/paged_attention_decode/b2/time_us",
                        "kernels/paged_attention_decode/b2/gbps"]
    triton_time = records[1]["metrics"][0]
    assert triton_time["extra"]["ratio_to_reference"] == pytest.approx(0.1)


def test_comparators_are_measured_once_per_session() -> None:
    session = BenchSession(BenchOptions())
    assert session.claim_comparator("vllm", "op/case", "impl-a") is None
    assert session.claim_comparator("vllm", "op/case", "impl-a") is None
    assert "see the rows under impl-a" in session.claim_comparator("vllm", "op/case", "impl-b")


def test_fmt_number_hand_values() -> None:
    assert fmt_number(1_234_567) == "1.23M"
    assert fmt_number(45_600) == "45.6k"
    assert fmt_number(0.8123) == "0.812"
    assert fmt_number(250.4) == "250"
    assert fmt_number(None) == "-"


def test_kernel_table_shows_speedups() -> None:
    """The speedup column is reference time / time: 100 us / 10 us = 10.00x."""
    session = BenchSession(BenchOptions())
    for r in (_kernel("torch_ref", 100.0, 1.0), _kernel("kvcheck_triton", 10.0, 10.0)):
        session.add(r)
    session.finalize()
    text = "\n".join(render_tables(session.results, {"device": "cuda", "name": "GPU",
                                                      "theoretical_gbps": 100.0,
                                                      "copy_gbps": 80.0}))
    assert "kernels (CUDA events, compulsory-bytes model)" in text
    assert "10.00x" in text and "providers: kvcheck_triton = kvcheck_triton 1.0" in text
    assert "theoretical peak 100 GB/s" in text
