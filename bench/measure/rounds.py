"""The one round type of the benchmarks: ``RoundBench``, pytest-benchmark's pedantic shape
(``setup`` untimed, ``run`` one measured round), with the clock it reports to passed in.

Every benchmark (the scheduler loop, hashing, slot_mapping, recorded corpora, the offload tier,
the event wire, indexers, the process wire, the manager level) is a ``RoundBench``; the same
object is timed by pytest-benchmark, interleaved with the reference's (``paired.PairedBench``)
or measured by a tool (``allocator.measure_rounds``), so every side runs identical code on
identical inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.timing import MeasuredClock

__all__ = ["Bench", "BenchmarkFixture", "RoundBench", "SetupArgs"]

#: What ``setup`` returns: ``run``'s positional and keyword arguments (pytest-benchmark's
#: pedantic ``setup`` shape); each bench's ``run`` declares their types.
SetupArgs = tuple[tuple[object, ...], dict[str, object]]

#: One round's result, as ``run`` appends it to ``results`` and ``metrics`` reads it.
R = TypeVar("R")


class RoundBench(Generic[R]):
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
        self.results: list[R] = []
        self.clock: MeasuredClock | None = None

    def advance(self, seconds: float) -> None:
        """Add one round's measured time to ``clock`` (if any)."""
        if self.clock is not None:
            self.clock.advance(seconds)

    def setup(self) -> SetupArgs:  # pragma: no cover
        raise NotImplementedError

    # Any: each subclass's run takes what its own setup returns (its own parameter types)
    def run(self, *args: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def metrics(self, results: list[R]) -> list[Metric]:  # pragma: no cover
        raise NotImplementedError

    def info(self) -> dict[str, object]:
        """Parameters worth recording (sizes, digests)."""
        return {}

    def timed_results(self, warmup: int) -> list[R]:
        """The rounds after the warm-up ones (all of them when pytest-benchmark was disabled
        and ran a single untimed round)."""
        return self.results[warmup:] if len(self.results) > warmup else self.results


class Bench(Protocol):
    """A ``RoundBench`` of any result type, as the code that runs rounds sees it (the pairs,
    ``measure_rounds``, the session, the counting child)."""

    clock: MeasuredClock | None

    def setup(self) -> SetupArgs: ...

    @property
    def run(self) -> Callable[..., None]:
        """``run(*args, **kwargs)`` with what ``setup`` returned."""
        ...

    def info(self) -> dict[str, object]: ...

    def timed_results(self, warmup: int) -> Sequence[object]: ...

    @property
    def metrics(self) -> Callable[..., list[Metric]]:
        """``metrics(results)`` of the bench's own ``timed_results``."""
        ...


class BenchmarkFixture(Protocol):
    """What kvcheck uses of pytest-benchmark's ``benchmark`` fixture (whose own methods are
    unannotated): ``pedantic`` and the ``extra_info`` it serializes."""

    extra_info: dict[str, object]

    def pedantic(self, target: Callable[..., object], *,
                 setup: Callable[[], SetupArgs] | None = None, rounds: int = 1,
                 warmup_rounds: int = 0) -> object: ...
