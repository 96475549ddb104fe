"""Allocator round benchmarks: metric arithmetic on synthetic rounds, warm-up handling, and
the correctness checks that make a wrong adapter fail its benchmark."""

from __future__ import annotations

import pytest

from kvcheck.bench.measure.allocator import (
    HashingBench,
    SchedulerBench,
    SlotMappingBench,
    measure_rounds,
    scheduler_metrics,
)
from kvcheck.bench.replay.scheduler import SchedulerRun
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.loader import load_impl


@pytest.fixture(scope="module")
def reference():
    return load_impl("reference")


def test_scheduler_metrics_hand_computed() -> None:
    """Two rounds: 1000 tokens in 2 ms and 1000 tokens in 4 ms of implementation time (all
    calls summed) -> 500k and 250k tokens/s, median of two = 375k. allocate_slots 1, 2, 3 us
    then 4 us: calls/s 3 / 6 us = 500k and 1 / 4 us = 250k; pooled p50 of [1, 2, 3, 4] =
    2.5 us, p99 = 3.97 us."""
    a = SchedulerRun(allocate_ns=[1000, 2000, 3000], lookup_ns=[1_000_000], free_ns=[994_000],
                     scheduled_tokens=1000, hit_tokens=10, queried_tokens=40, preemptions=1,
                     peak_used_blocks=5, usable_blocks=10)
    b = SchedulerRun(allocate_ns=[4000], lookup_ns=[2_000_000], free_ns=[1_996_000],
                     scheduled_tokens=1000,
                     hit_tokens=10, queried_tokens=40, preemptions=3, peak_used_blocks=5,
                     usable_blocks=10)
    m = {x.name: x for x in scheduler_metrics([a, b])}
    assert m["scheduled_tokens_per_s"].samples == pytest.approx([500_000, 250_000])
    assert m["scheduled_tokens_per_s"].value == pytest.approx(375_000)
    assert m["allocate_slots_calls_per_s"].samples == pytest.approx([500_000, 250_000])
    assert m["allocate_slots_us_p50"].value == pytest.approx(2.5)
    assert m["allocate_slots_us_p99"].value == pytest.approx(3.97)
    assert m["allocate_slots_us_p50"].samples == pytest.approx([2.0, 4.0])
    assert m["prefix_hit_rate"].value == 0.25 and m["peak_usage"].value == 0.5
    assert m["preemptions"].samples == [1.0, 3.0] and m["preemptions"].value == 2.0
    assert {x.direction for x in m.values()} == {"higher_is_better", "lower_is_better"}


def test_measure_rounds_drops_warmup_rounds(reference) -> None:
    """warmup + rounds replays happen; the metrics describe the timed rounds only."""
    bench = SchedulerBench(reference, make_workload("burst_short", scale=0.02))
    metrics = measure_rounds(bench, rounds=2, warmup=1)
    assert len(bench.results) == 3
    assert len(metrics[0].samples) == 2
    assert bench.timed_results(5) == bench.results  # a single untimed run is still reported
    assert bench.info()["num_requests"] == 8  # 384 * 0.02 = 7.68 -> 8


def test_hashing_bench_counts_blocks(reference) -> None:
    """Each round hashes num_requests * 32 full blocks; throughput is positive."""
    bench = HashingBench(reference, "xxhash", scale=0.05)
    (metric,) = measure_rounds(bench, rounds=2, warmup=0)
    assert bench.results[0][0] == 3 * 32  # 64 * 0.05 = 3.2 -> 3 requests
    assert metric.name == "hash_blocks_per_s" and metric.value > 0


def test_hashing_bench_fails_when_hashes_are_missing(reference) -> None:
    """An implementation that reports fewer hashes than full blocks fails the benchmark."""

    class Lazy:
        def __init__(self, spec):
            self.inner = reference.make_manager(spec)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def block_hashes(self, request_id):
            return self.inner.block_hashes(request_id)[:-1]

    impl = type("H", (), {"name": "lazy",
                          "make_manager": staticmethod(lambda spec, guard=True: Lazy(spec))})()
    with pytest.raises(AssertionError, match=r"returned 31 hashes .* expected 32"):
        measure_rounds(HashingBench(impl, "sha256", scale=0.02), rounds=1, warmup=0)


def test_slot_mapping_bench_checks_against_the_vectorized_reference(reference) -> None:
    """Both figures are reported; an off-by-one slot_mapping fails with the first mismatch."""
    bench = SlotMappingBench(reference, scale=0.05, num_tokens=64)
    metrics = measure_rounds(bench, rounds=1, warmup=0)
    assert [m.name for m in metrics] == ["slot_mapping_tokens_per_s",
                                         "vectorized_slot_mapping_tokens_per_s"]

    class OffByOne:
        def __init__(self, spec):
            self.inner = reference.make_manager(spec)

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def slot_mapping(self, request_id, start, end):
            slots = self.inner.slot_mapping(request_id, start, end)
            return slots[:5] + [s + 1 for s in slots[5:]]

    impl = type("S", (), {"name": "offbyone",
                          "make_manager": staticmethod(lambda spec, guard=True: OffByOne(spec))})()
    with pytest.raises(AssertionError, match="first mismatch at token 5 of 'slots-00000'"):
        measure_rounds(SlotMappingBench(impl, scale=0.05, num_tokens=64), rounds=1, warmup=0)
