"""The harness's own cost, measured: a null adapter's floor and an adapter's protocol layer.

Three layers sit inside every timed call of the scheduler loop (``scheduler.py``):

1. the **harness floor**: the driver's clock reads and one Python call into an adapter;
2. the **protocol layer**: the adapter turning ``RequestView`` snapshots and block ids into the
   engine's objects and back (request sync, id lists);
3. the **allocator**: the engine's own manager calls.

``NullManager`` replays the answers a real adapter gave on the same workload (recorded by
``RecordingManager``) and does nothing else, so a run on it times layer 1 alone: that is the
floor under any adapter, and ``floor / implementation time`` is the harness's share of a
scenario. ``measure_layers`` times layer 3 by wrapping an adapter's engine manager (the
``manager`` attribute the reference and vLLM adapters have) in a timing proxy, together with
the engine's own request work (building a request, which hashes it, and appending tokens);
layer 2 is what remains of the adapter's time once layers 1 and 3 are taken out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ParamSpec, TypeVar

from kvcheck.bench.measure.timing import collector_off
from kvcheck.bench.replay.scheduler import SchedulerManager, SchedulerRun, run_workload
from kvcheck.bench.workload.scenarios import Workload
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.errors import KVCheckInputError

__all__ = [
    "LayerTimes",
    "NullManager",
    "RecordingManager",
    "TimedEngineManager",
    "measure_layers",
    "record_answers",
]

T = TypeVar("T")
P = ParamSpec("P")


class RecordingManager:
    """Forwards the scheduler's calls to ``inner`` and records every answer, in call order."""

    def __init__(self, inner: SchedulerManager) -> None:
        self.inner = inner
        self.answers: list[object] = []

    def _keep(self, answer: T) -> T:
        self.answers.append(answer)
        return answer

    def get_computed_blocks(self, request: RequestView) -> tuple[object, int]:
        return self._keep(self.inner.get_computed_blocks(request))

    def allocate_slots(self, request: RequestView, *args: object) -> object:
        return self._keep(self.inner.allocate_slots(request, *args))

    def free(self, request_id: str) -> None:
        self._keep(self.inner.free(request_id))

    def num_free_blocks(self) -> int:
        return int(self._keep(self.inner.num_free_blocks()))


class NullManager:
    """The null adapter: returns recorded answers in order and computes nothing.

    Replaying on the workload it was recorded on gives the same call sequence (the loop is
    deterministic given the answers), so the loop runs exactly as it did on the real adapter.

    Raises:
        KVCheckInputError: more calls than recorded answers (a different workload).
    """

    def __init__(self, answers: list[object]) -> None:
        # Any: each call returns the answer its own call gave when recorded (see
        # RecordingManager), of that method's type; one log holds them all, in call order.
        self._next: Callable[[], Any] = iter(answers).__next__

    def _answer(self) -> Any:  # Any: as _next
        try:
            return self._next()
        except StopIteration:
            raise KVCheckInputError("NullManager: more calls than recorded answers; replay it "
                                    "on the workload it was recorded on") from None

    # Any: the answer recorded for this call (a (hits, count) tuple when replayed on its own
    # workload), returned as it is: the floor's calls do nothing more.
    def get_computed_blocks(self, request: RequestView) -> Any:
        return self._answer()

    def allocate_slots(self, request: RequestView, *args: object) -> object:
        return self._answer()

    def free(self, request_id: str) -> None:
        self._answer()

    def num_free_blocks(self) -> int:
        return int(self._answer())


def record_answers(make_manager: Callable[[KVCacheSpec], SchedulerManager], spec: KVCacheSpec,
                   workload: Workload) -> list[object]:
    """The answers of a fresh ``make_manager(spec)`` replaying ``workload``."""
    recorder = RecordingManager(make_manager(spec))
    run_workload(recorder, workload)
    return recorder.answers


class TimedEngineManager:
    """Proxy around an engine's manager that times its ``get_computed_blocks``,
    ``allocate_slots`` and ``free`` (nanoseconds summed in ``engine_ns``); every other
    attribute is the engine manager's own."""

    # Any: an engine's own manager (vLLM's KVCacheManager, the reference's engine), whichever
    # the adapter holds; its methods' types are the engine's, and are passed through.
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.engine_ns = 0
        self.calls = 0

    def _timed(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        self.calls += 1
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.engine_ns += time.perf_counter_ns() - start

    def get_computed_blocks(self, *args: object, **kwargs: object) -> object:
        return self._timed(self._inner.get_computed_blocks, *args, **kwargs)

    def allocate_slots(self, *args: object, **kwargs: object) -> object:
        return self._timed(self._inner.allocate_slots, *args, **kwargs)

    def free(self, *args: object, **kwargs: object) -> object:
        return self._timed(self._inner.free, *args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@dataclass
class LayerTimes:
    """Median nanoseconds per replay of one workload, by layer (see the module docstring).

    Attributes:
        adapter_ns: time inside the adapter's calls (what the benchmarks report).
        engine_ns: time inside the engine manager's calls (None: the adapter exposes no
            ``manager`` attribute).
        floor_ns: the null adapter's time on the same workload.
    """

    adapter_ns: float
    floor_ns: float
    engine_ns: float | None = None
    proxy_ns: float = 0.0  # what the timing proxy itself added to adapter_ns (calibrated)
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def harness_share(self) -> float:
        """Floor over the adapter's time: the part of the figure that is the harness's."""
        return self.floor_ns / self.adapter_ns if self.adapter_ns else 0.0

    @property
    def protocol_ns(self) -> float | None:
        """Adapter time minus engine time, the floor and the proxy's own cost (>= 0)."""
        if self.engine_ns is None:
            return None
        return max(0.0, self.adapter_ns - self.engine_ns - self.floor_ns - self.proxy_ns)

    @property
    def protocol_share(self) -> float | None:
        """Protocol layer over the engine's (allocator's) own time."""
        protocol = self.protocol_ns
        if protocol is None or not self.engine_ns:
            return None
        return protocol / self.engine_ns


def _time_engine_requests(adapter: object, proxy: TimedEngineManager) -> None:
    """Count the engine's own request work as engine time too: building a request (which
    hashes its full blocks) and appending sampled tokens, as the engine's scheduler does.
    Applies when the adapter keeps its requests in a ``RequestViewSync`` (``_requests``)."""
    sync = getattr(adapter, "_requests", None)
    make = getattr(sync, "_make", None)
    if sync is None or make is None:
        return

    def timed_make(view: RequestView) -> object:
        req = proxy._timed(make, view)
        append = req.append_output_token_ids
        req.append_output_token_ids = lambda ids: proxy._timed(append, ids)
        return req

    sync._make = timed_make


class _Noop:
    def allocate_slots(self, *args: object, **kwargs: object) -> None:
        return None


def proxy_overhead_ns(repeats: int = 5, calls: int = 20_000) -> float:
    """Nanoseconds one ``TimedEngineManager`` call adds over a direct call, both with two
    positional and one keyword argument (best of ``repeats`` loops of ``calls``, CPU time):
    subtracted from the protocol layer, which would otherwise be charged for the measurement
    itself."""
    inner = _Noop()
    proxy = TimedEngineManager(inner)
    best_direct = best_proxy = float("inf")
    clock = time.thread_time_ns  # CPU time: another process's time slices do not count
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            inner.allocate_slots(1, 2, num_lookahead_tokens=0)
        best_direct = min(best_direct, clock() - start)
        start = clock()
        for _ in range(calls):
            proxy.allocate_slots(1, 2, num_lookahead_tokens=0)
        best_proxy = min(best_proxy, clock() - start)
    return max(0.0, (best_proxy - best_direct) / calls)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _gc_quiet(fn: Callable[[], SchedulerRun]) -> SchedulerRun:
    with collector_off():
        return fn()


def measure_layers(make_manager: Callable[[KVCacheSpec], SchedulerManager], spec: KVCacheSpec,
                   workload: Workload, rounds: int = 5) -> LayerTimes:
    """Time ``rounds`` replays of ``workload`` through the adapter (engine calls timed when
    it has a ``manager`` attribute), interleaved with replays on the null adapter.

    Raises:
        KVCheckInputError: ``rounds < 1``.
    """
    if rounds < 1:
        raise KVCheckInputError(f"rounds must be >= 1, got {rounds}")
    answers = record_answers(make_manager, spec, workload)
    per_call = proxy_overhead_ns()
    adapter: list[float] = []
    engine: list[float] = []
    floor: list[float] = []
    proxied: list[float] = []
    for _ in range(rounds):
        manager = make_manager(spec)
        proxy = None
        if hasattr(manager, "manager"):
            proxy = TimedEngineManager(manager.manager)
            manager.manager = proxy
            _time_engine_requests(manager, proxy)
        # Every layer is scaled by its replay's on-CPU fraction (see scheduler.py).
        run = _gc_quiet(partial(run_workload, manager, workload))
        adapter.append(run.on_cpu_ns)
        if proxy is not None:
            engine.append(proxy.engine_ns * run.on_cpu_fraction)
            proxied.append(proxy.calls * per_call)
        null = NullManager(answers)
        floor.append(_gc_quiet(partial(run_workload, null, workload)).on_cpu_ns)
    return LayerTimes(_median(adapter), _median(floor), _median(engine) if engine else None,
                      _median(proxied) if proxied else 0.0,
                      {"adapter_ns": adapter, "floor_ns": floor, "engine_ns": engine})


def iter_scenarios(names: list[str] | None) -> Iterator[str]:
    """The scenario names to run (all of ``SCENARIOS`` when ``names`` is None)."""
    from kvcheck.bench.workload.scenarios import SCENARIOS

    for name in names or list(SCENARIOS):
        if name not in SCENARIOS:
            raise KVCheckInputError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
        yield name
