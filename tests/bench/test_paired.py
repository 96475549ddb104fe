"""Interleaved paired measurement: the A B B A order, the paired ratio and its interval, and
that only the implementation's rounds reach pytest-benchmark's clock."""

from __future__ import annotations

from typing import Any

import pytest

from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.paired import PairedBench, abba_first, median_ci, paired_ratio
from kvcheck.bench.measure.timing import ALLOCATOR_CLOCK, MeasuredClock
from kvcheck.errors import KVCheckInputError


def test_abba_order() -> None:
    assert [abba_first(i) for i in range(4)] == ["impl", "ref", "impl", "ref"]
    with pytest.raises(KVCheckInputError):
        abba_first(-1)


def test_median_ci_order_statistics() -> None:
    """n = 9 at 95 %: P(Binom(9, 1/2) <= 1) = 10/512, so ranks 2 and 8, coverage
    1 - 20/512 = 0.9609; n = 5 is too few: min and max, coverage 1 - 2/32 = 0.9375."""
    low, high, achieved = median_ci([9, 1, 8, 2, 7, 3, 6, 4, 5])
    assert (low, high) == (2, 8)
    assert achieved == pytest.approx(1 - 20 / 512)
    low, high, achieved = median_ci([5, 1, 4, 2, 3])
    assert (low, high) == (1, 5)
    assert achieved == pytest.approx(0.9375)
    with pytest.raises(KVCheckInputError):
        median_ci([])


def test_paired_ratio_pairs_round_by_round() -> None:
    """Ratios 2/1, 3/1, 8/4 -> [2, 3, 2], median 2 (not median(a) / median(b) = 3 / 1)."""
    r = paired_ratio([2.0, 3.0, 8.0], [1.0, 1.0, 4.0])
    assert r is not None
    assert r.ratios == (2.0, 3.0, 2.0) and r.ratio == 2.0 and r.pairs == 3
    assert paired_ratio([0.0, 0.0], [0.0, 0.0]) is None  # no reference to divide by
    with pytest.raises(KVCheckInputError, match="pair up"):
        paired_ratio([1.0], [1.0, 2.0])


class _Fake:
    """A bench whose rounds log their side and advance its clock by a fixed time."""

    def __init__(self, name: str, log: list[str], seconds: float) -> None:
        self.name, self.log, self.seconds = name, log, seconds
        self.results: list[Any] = []
        self.clock: MeasuredClock | None = ALLOCATOR_CLOCK

    def setup(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (len(self.results),), {}

    def run(self, round_index: int) -> None:
        self.log.append(self.name)
        self.results.append(self.seconds)
        if self.clock is not None:
            self.clock.advance(self.seconds)

    def timed_results(self, warmup: int) -> list[Any]:
        return self.results[warmup:]

    def metrics(self, results: list[Any]) -> list[Metric]:
        return [Metric("t", "s", "lower_is_better", sorted(results)[len(results) // 2],
                       list(results))]


def test_paired_bench_interleaves_and_times_the_implementation_only() -> None:
    log: list[str] = []
    impl, ref = _Fake("A", log, 2.0), _Fake("B", log, 1.0)
    ref.clock = None
    before = ALLOCATOR_CLOCK.now()
    pair = PairedBench(impl, ref)
    pair.measure(rounds=3, warmup=1)
    assert log == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert ALLOCATOR_CLOCK.now() - before == pytest.approx(4 * 2.0)
    mine, theirs = pair.metrics(warmup=1)
    assert mine[0].reference_samples == [1.0, 1.0, 1.0]
    assert mine[0].paired is not None and mine[0].ratio_to_reference == 2.0
    assert theirs[0].samples == [1.0, 1.0, 1.0]
