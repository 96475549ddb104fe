"""``BenchSession.run_allocator`` interleaves the reference with a non-reference
implementation, and the record carries both sample sets and the paired ratio's interval."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.bench.measure.allocator import SchedulerBench, measure_rounds, per_round
from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.rounds import RoundBench
from kvcheck.bench.measure.timing import allocator_time
from kvcheck.bench.session import BenchOptions, BenchSession
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.loader import load_impl
from kvcheck.results.schema import validate_record


class _Benchmark:
    """pytest-benchmark's ``benchmark`` fixture, reduced to ``pedantic`` and ``extra_info``."""

    def __init__(self) -> None:
        self.extra_info: dict[str, Any] = {}
        self.calls = 0

    def pedantic(self, target: Any, setup: Any, rounds: int, warmup_rounds: int) -> None:
        for _ in range(rounds + warmup_rounds):
            args, kwargs = setup()
            target(*args, **kwargs)
            self.calls += 1


def _setting() -> tuple[Any, Any, BenchSession, Any]:
    """The reference, the reference under another module (the session must treat it as "not
    the reference"), a session of 3 rounds after 1 warm-up, and a test's ``request``."""
    reference = load_impl("reference")
    impl = SimpleNamespace(module=object(), name="copy", info=reference.info,
                           make_manager=reference.make_manager)
    session = BenchSession(BenchOptions(enabled=True, rounds=3, warmup=1))
    return reference, impl, session, SimpleNamespace(node=SimpleNamespace(nodeid="bench::x"))


def test_run_allocator_pairs_with_the_reference() -> None:
    reference, impl, session, request = _setting()
    benchmark = _Benchmark()
    workload = make_workload("burst_short", scale=0.05)
    result = session.run_allocator(benchmark, request, impl, reference,
                                   lambda i: SchedulerBench(i, workload), "scheduler",
                                   "burst_short")
    assert benchmark.calls == 4  # one pytest-benchmark round = one pair
    tokens = result.metric("scheduled_tokens_per_s")
    assert tokens is not None and tokens.paired is not None
    assert len(tokens.samples) == 3 and tokens.reference_samples is not None
    assert len(tokens.reference_samples) == 3
    assert tokens.ratio_to_reference == tokens.paired.ratio
    assert "interleaved" in result.baseline
    (record,) = session.records("vllm-0.33", {"hardware_key": "cpu:test x2"}, {})
    validate_record(record)
    metric = next(m for m in record["metrics"] if m["name"] == "scheduled_tokens_per_s")
    assert len(metric["extra"]["reference_samples"]) == 3
    low, high = metric["extra"]["ratio_ci"]
    assert low <= metric["extra"]["ratio_to_reference"] <= high


class _Fixed(RoundBench):
    """A round that measures a fixed ``seconds`` (as if spent inside the implementation)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def setup(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), {}

    def run(self) -> None:
        self.results.append(self.seconds)
        self.advance(self.seconds)

    def metrics(self, results: list[Any]) -> list[Metric]:
        return [per_round("round_s", "s", "lower_is_better", list(results))]


class _TimedBenchmark(_Benchmark):
    """Reads pytest-benchmark's timer (``allocator_time``) around each round, as the plugin
    configures it (``timer=allocator_time``)."""

    def __init__(self) -> None:
        super().__init__()
        self.timed: list[float] = []

    def pedantic(self, target: Any, setup: Any, rounds: int, warmup_rounds: int) -> None:
        for _ in range(rounds + warmup_rounds):
            args, kwargs = setup()
            start = allocator_time()
            target(*args, **kwargs)
            self.timed.append(allocator_time() - start)


def test_the_timer_reads_the_implementations_rounds_only() -> None:
    """``run_allocator`` gives the implementation's bench ``ALLOCATOR_CLOCK``: each timed
    pair reads exactly its round (2 s), never the reference's (5 s); a bench measured by a tool
    (no clock: the default) leaves the timer where it was."""
    reference, impl, session, request = _setting()
    benchmark = _TimedBenchmark()
    session.run_allocator(benchmark, request, impl, reference,
                          lambda side: _Fixed(2.0 if side is impl else 5.0), "scheduler", "x")
    assert benchmark.timed == pytest.approx([2.0] * 4)
    before = allocator_time()
    tool_bench = _Fixed(7.0)
    assert tool_bench.clock is None
    measure_rounds(tool_bench, rounds=2, warmup=1)
    measure_rounds(SchedulerBench(reference, make_workload("burst_short", scale=0.05)), 1, 0)
    assert allocator_time() == before
