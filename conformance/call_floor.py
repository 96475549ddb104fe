"""The floor under ``--kv-timeout``: a per-call limit below what a call of kvcheck's own
reference takes on this machine would fail correct implementations (the reference included),
so a limit only ever means a hung implementation.

``floor()`` is ``max(MIN_CALL_TIMEOUT, FLOOR_FACTOR * slowest)``, where ``slowest`` is the
slowest call of the reference on the suite's largest recorded-corpus workload (trace
``t03``: 97 blocks of 1 token, events, lookahead; every observation), timed in this process:
the workload runs ``_RUNS`` times and each call's time is the least of its runs, so a
scheduling hiccup on a shared machine does not count, a call that is inherently slow does.
It is measured once per process (about 0.1 s), and only when a limit below
``DEFAULT_CALL_TIMEOUT`` is asked for (``apply_floor``).

A smaller limit is raised to the floor, saying so (``apply_floor``'s note): refusing it would
make one command line valid on a fast machine and invalid on a slow one.

The oracle (``--kv-oracle``, the reference by default, and the ``kv_reference`` fixture) is
not the implementation under test: it runs under ``oracle_timeout(limit)``, at least
``DEFAULT_CALL_TIMEOUT``, so a tight ``--kv-timeout`` never fails a test because the oracle
was slow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kvcheck.conformance.call_limit import DEFAULT_CALL_TIMEOUT, CallLimit

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    _Args = TypeVarTuple("_Args")

__all__ = ["FLOOR_FACTOR", "MIN_CALL_TIMEOUT", "apply_floor", "floor", "oracle_timeout"]

#: The least per-call limit, in seconds, whatever the calibration says: far above any call of
#: the reference (tens of microseconds to a few milliseconds), and above the garbage-collector
#: pauses and scheduling delays of a loaded machine.
MIN_CALL_TIMEOUT = 0.25
#: How many times the slowest reference call the floor is at least.
FLOOR_FACTOR = 10.0
_RUNS = 3
_TRACE = 3  # recorder.trace_plan(3): the largest pool of the recorded corpora
_STEPS = 120

_T = TypeVar("_T")
_MEASURED: list[float] = []  # the measurement, once made


class _Timing(CallLimit):
    """No limit; records how long each call took, in call order."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        super().__init__(None, "reference")
        self.times: list[float] = []

    def call(self, method: str, fn: Callable[[Unpack[_Args]], _T], *args: Unpack[_Args]) -> _T:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.times.append(time.perf_counter() - start)


def slowest_reference_call() -> float:
    """Seconds the reference's slowest call takes here (see the module doc; measured once)."""
    if not _MEASURED:
        from kvcheck.conformance.loader import load_impl
        from kvcheck.conformance.recorder import record_trace

        reference = load_impl("reference", call_timeout=None)
        timing = _Timing()
        object.__setattr__(reference, "limit", timing)  # a frozen handle: this one only
        runs: list[list[float]] = []
        for _ in range(_RUNS):
            timing.times = []
            record_trace(reference, "vllm-0.33", _TRACE, 0, steps=_STEPS)
            runs.append(timing.times)
        # The same deterministic workload each run: the calls line up.
        _MEASURED.append(max(min(call) for call in zip(*runs, strict=False)))
    return _MEASURED[0]


def floor() -> float:
    """The least ``--kv-timeout`` kvcheck accepts on this machine (seconds)."""
    return max(MIN_CALL_TIMEOUT, FLOOR_FACTOR * slowest_reference_call())


def apply_floor(timeout: float, option: str = "--kv-timeout") -> tuple[float, str | None]:
    """``(the limit to use, a note saying it was raised or None)`` for a requested limit
    (``0``: none, kept)."""
    if not timeout or timeout >= DEFAULT_CALL_TIMEOUT:
        return timeout, None
    slowest = slowest_reference_call()
    least = max(MIN_CALL_TIMEOUT, FLOOR_FACTOR * slowest)
    if timeout >= least:
        return timeout, None
    return least, (
        f"{option}={timeout:g} is below the floor of this machine, {least:.3g} s "
        f"({FLOOR_FACTOR:g} x the slowest call of kvcheck's reference, {slowest * 1e3:.3g} ms "
        f"here, and at least {MIN_CALL_TIMEOUT:g} s): using {option}={least:.3g}, so that a "
        "timeout only ever means a hung implementation (0 = no limit)")


def oracle_timeout(timeout: float | None) -> float:
    """The per-call limit of the oracle for the implementation's limit ``timeout``: none when
    there is none, else at least ``DEFAULT_CALL_TIMEOUT``."""
    if not timeout:
        return 0.0
    return max(float(timeout), DEFAULT_CALL_TIMEOUT)
