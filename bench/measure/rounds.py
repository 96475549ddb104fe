"""The one round type of the benchmarks: ``RoundBench``, pytest-benchmark's pedantic shape
(``setup`` untimed, ``run`` one measured round), with the clock it reports to passed in.

Every benchmark (the scheduler loop, hashing, slot_mapping, recorded corpora, the offload tier,
the event wire, indexers, the process wire, the manager level) is a ``RoundBench``; the same
object is timed by pytest-benchmark, interleaved with the reference's (``paired.PairedBench``)
or measured by a tool (``allocator.measure_rounds``), so every side runs identical code on
identical inputs.
"""

from __future__ import annotations

from typing import Any

from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.timing import MeasuredClock

__all__ = ["RoundBench"]


class RoundBench:
    r"""Base class: ``setup`` / ``run`` / ``metrics``.

    ``setup()`` builds a fresh manager and inputs (untimed) and returns ``run``'s arguments;
    ``run(*args)`` measures one round, appends its result to ``results`` and ``advance``\ s
    by the time it measured; ``metrics(results)`` turns the timed rounds into ``Metric``\ s.

    ``clock``: the clock ``advance`` moves, None (the default) for none. Only a bench timed by
    pytest-benchmark has one: ``BenchSession.run_allocator`` attaches ``ALLOCATOR_CLOCK``, its
    timer, to the implementation's bench, so the timer reads exactly the time measured inside
    the implementation's calls (never the reference's rounds of an interleaved pair, never a
    tool's rounds).
    """

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.clock: MeasuredClock | None = None

    def advance(self, seconds: float) -> None:
        """Add one round's measured time to ``clock`` (if any)."""
        if self.clock is not None:
            self.clock.advance(seconds)

    def setup(self) -> tuple[tuple[Any, ...], dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def run(self, *args: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def metrics(self, results: list[Any]) -> list[Metric]:  # pragma: no cover
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """Parameters worth recording (sizes, digests)."""
        return {}

    def timed_results(self, warmup: int) -> list[Any]:
        """The rounds after the warm-up ones (all of them when pytest-benchmark was disabled
        and ran a single untimed round)."""
        return self.results[warmup:] if len(self.results) > warmup else self.results
