"""Manager-level timing: the scheduler loop replayed on an engine's own objects.

The protocol level (``kvcheck.bench.replay.scheduler``) times every call through the adapter, so an
implementation's figure includes the adapter's marshalling (``RequestView`` snapshots turned
into engine requests, block objects turned into id lists). An adapter module may also expose
an optional, module-level **benchmark hook**::

    def make_native_manager(spec: KVCacheSpec) -> NativeManager

returning an object with the methods of ``NativeManager`` below, which speak the engine's own
request and block objects. ``run_native_workload`` then replays a workload through the very
same loop (``kvcheck.bench.replay.scheduler.run_workload``: same calls, same order, same preemption
rule) with a ``NativeDriver`` in place of the adapter: the driver keeps one engine request per
request id, and times only the engine's work:

* the manager calls ``get_computed_blocks``, ``allocate_slots`` and ``free``;
* the engine's own request work, as vLLM's engine does it: building a request (which hashes its
  full prompt blocks) when the scheduler first sees it, and appending each sampled token
  (which hashes a block it completes). At the protocol level the adapter does both inside the
  call that first sees the change (``get_computed_blocks`` at admission, ``allocate_slots``
  after a token is sampled), so the driver charges them to the same calls.

Not timed: looking up the request, setting ``num_computed_tokens`` (an attribute write the
engine's scheduler does), the hits returned by ``get_computed_blocks`` go back to
``allocate_slots`` unconverted, as in vLLM's scheduler. A preempted request keeps its engine
object (and its block hashes), as in vLLM; a finished one is never seen again.

The hook is looked up with ``getattr`` on the adapter module (``native_factory``); when it is
absent the manager level is simply not reported (``missing_hook_note`` says so), never
estimated. Multi-group specs (``kv_cache_groups``) are not covered by the hook.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from kvcheck.bench.measure.allocator import scheduler_metrics, workload_spec
from kvcheck.bench.measure.metrics import Metric
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.bench.measure.timing import timed_call
from kvcheck.bench.replay.scheduler import SchedulerRun, run_workload
from kvcheck.bench.workload.scenarios import Workload
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.protocol import KVCacheSpec, RequestView
from kvcheck.errors import KVCheckInputError

__all__ = [
    "MANAGER_PREFIX",
    "NATIVE_HOOK",
    "NativeDriver",
    "NativeManager",
    "NativeRun",
    "NativeSchedulerBench",
    "manager_level_metrics",
    "missing_hook_note",
    "native_factory",
    "run_native_workload",
]

#: Name of the optional module-level hook of an adapter module.
NATIVE_HOOK = "make_native_manager"
#: Prefix of the manager-level metrics a ``--kv-bench`` scheduler result carries.
MANAGER_PREFIX = "manager_"
#: The manager-level figures reported beside the protocol-level ones.
MANAGER_METRICS = ("scheduled_tokens_per_s", "allocate_slots_calls_per_s")


#: The engine's request type (``NativeManager``).
Req = TypeVar("Req")
#: The engine's type of ``get_computed_blocks`` hits and ``allocate_slots`` results.
Blocks = TypeVar("Blocks")


class NativeManager(Protocol[Req, Blocks]):
    """What ``make_native_manager(spec)`` returns: one engine manager, engine objects in and
    out. ``spec`` is a single-group ``KVCacheSpec`` (raise ``UnsupportedSpec`` otherwise).

    Requests returned by ``new_request`` must have a writable ``num_computed_tokens``
    attribute (the driver sets it before every call, as vLLM's scheduler does).
    """

    def new_request(self, view: RequestView) -> Req:
        """The engine's request for ``view``'s prompt alone (the driver appends any output
        tokens with ``append_output``), hashed as the engine hashes a new request."""
        ...

    def append_output(self, request: Req, token_ids: list[int]) -> None:
        """Append sampled tokens to ``request`` (the engine's own append, hashing included)."""
        ...

    def get_computed_blocks(self, request: Req) -> tuple[Blocks, int]:
        """``(hits, num_computed_tokens)``: ``hits`` in the engine's own form."""
        ...

    def allocate_slots(self, request: Req, num_new_tokens: int, num_new_computed_tokens: int,
                       new_computed_blocks: Blocks | None) -> Blocks | None:
        """The engine's ``allocate_slots``; ``new_computed_blocks`` is what
        ``get_computed_blocks`` returned, or None (a running request). None: refused."""
        ...

    def free(self, request: Req) -> None:
        """The engine's ``free``."""
        ...

    def num_free_blocks(self) -> int:
        """Free blocks (evictable cached ones included), as the adapter's."""
        ...

    def block_ids(self, blocks: Blocks) -> list[int]:
        """Block ids of a ``get_computed_blocks`` hit or an ``allocate_slots`` result (never
        timed: only for checks)."""
        ...


# Any: each engine has its own request and block types; the driver only passes them back to
# the manager that made them.
NativeFactory = Callable[[KVCacheSpec], NativeManager[Any, Any]]


def native_factory(impl: ImplHandle) -> NativeFactory | None:
    """The hook of a loaded implementation (an ``ImplHandle``) or of a module, or None.

    Raises:
        KVCheckInputError: the attribute exists but is not callable.
    """
    module = getattr(impl, "module", impl)
    hook = getattr(module, NATIVE_HOOK, None)
    if hook is None:
        return None
    if not callable(hook):
        raise KVCheckInputError(
            f"{getattr(module, '__name__', module)}.{NATIVE_HOOK} is a "
            f"{type(hook).__name__}, not a function; define def {NATIVE_HOOK}(spec) -> "
            "manager (see kvcheck.bench.replay.native) or remove it")
    return cast(NativeFactory, hook)


def missing_hook_note(name: str) -> str:
    """What the output says when an implementation has no manager-level hook."""
    return (f"manager level not reported: {name} has no {NATIVE_HOOK} hook "
            "(see kvcheck.bench.replay.native)")


@dataclass
class NativeRun(SchedulerRun):
    """A ``SchedulerRun`` at the manager level. ``allocate_ns`` / ``lookup_ns`` / ``free_ns``
    hold the engine's time per call, the request work charged to the call that triggered it
    (see the module docstring); ``request_ns`` is that request work alone (already included,
    kept to report its share)."""

    request_ns: int = 0
    answers: list[object] = field(default_factory=list)  # with record=True: see NativeDriver


class NativeDriver(Generic[Req, Blocks]):
    """Stands in for the adapter in ``run_workload``: same method names and arguments, engine
    objects underneath, the engine's time recorded per call in its own lists.

    ``record=True`` keeps every answer in protocol form (block ids, counts), untimed, in
    ``answers`` (the order ``kvcheck.bench.replay.harness.RecordingManager`` uses), so a replay can
    be compared call by call with the protocol level's.
    """

    def __init__(self, native: NativeManager[Req, Blocks], record: bool = False) -> None:
        self.native = native
        self.allocate_ns: list[int] = []
        self.lookup_ns: list[int] = []
        self.free_ns: list[int] = []
        self.request_ns = 0
        self.answers: list[object] | None = [] if record else None
        # request id -> [engine request, output tokens absorbed]
        self._requests: dict[str, list[Any]] = {}  # Any: a Req and an int, in one list

    def _sync(self, view: RequestView) -> tuple[Req, int]:
        """The engine request for ``view``, brought up to date; returns it and the engine
        time spent (building it, appending new output tokens)."""
        entry = self._requests.get(view.request_id)
        parts: list[int] = []  # the engine's calls' times
        if entry is None:
            req = timed_call(parts, self.native.new_request, view)
            entry = self._requests[view.request_id] = [req, 0]
        outputs = view.output_token_ids
        if len(outputs) != entry[1]:
            if len(outputs) < entry[1]:
                raise KVCheckInputError(f"request {view.request_id!r}: output tokens shrank "
                                        f"from {entry[1]} to {len(outputs)}")
            timed_call(parts, self.native.append_output, entry[0], list(outputs[entry[1]:]))
            entry[1] = len(outputs)
        entry[0].num_computed_tokens = view.num_computed_tokens
        spent = sum(parts)
        self.request_ns += spent
        return entry[0], spent

    def get_computed_blocks(self, request: RequestView) -> tuple[Blocks, int]:
        req, spent = self._sync(request)
        hits, num = timed_call(self.lookup_ns, self.native.get_computed_blocks, req)
        self.lookup_ns[-1] += spent  # the request's own work is the call's (module docstring)
        if self.answers is not None:
            self.answers.append((self.native.block_ids(hits), num))
        return hits, num

    def allocate_slots(self, request: RequestView, num_new_tokens: int,
                       num_new_computed_tokens: int = 0, new_computed_blocks: Blocks | None = None
                       ) -> Blocks | None:
        req, spent = self._sync(request)
        new = timed_call(self.allocate_ns, self.native.allocate_slots, req, num_new_tokens,
                         num_new_computed_tokens, new_computed_blocks)
        self.allocate_ns[-1] += spent
        if self.answers is not None:
            self.answers.append(None if new is None else self.native.block_ids(new))
        return new

    def free(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            raise KVCheckInputError(f"free({request_id!r}): the scheduler never built it")
        timed_call(self.free_ns, self.native.free, entry[0])
        if self.answers is not None:
            self.answers.append(None)

    def num_free_blocks(self) -> int:
        num = int(self.native.num_free_blocks())
        if self.answers is not None:
            self.answers.append(num)
        return num


def run_native_workload(native: NativeManager[Req, Blocks], workload: Workload,
                        record: bool = False, max_steps: int | None = None) -> NativeRun:
    """Replay ``workload`` through ``run_workload`` on a fresh ``native`` manager, timing
    the engine only (module docstring). The counters (steps, preemptions, hits, peak usage)
    and the on-CPU fraction are the loop's; the call times are the driver's.

    Raises:
        KVCheckFailure: as ``run_workload``.
    """
    driver = NativeDriver(native, record)
    run = run_workload(driver, workload, max_steps)
    out = NativeRun(**{f: getattr(run, f) for f in _RUN_FIELDS})
    out.allocate_ns, out.lookup_ns, out.free_ns = (driver.allocate_ns, driver.lookup_ns,
                                                   driver.free_ns)
    out.request_ns = driver.request_ns
    out.answers = driver.answers or []
    return out


_RUN_FIELDS = tuple(f for f in SchedulerRun.__dataclass_fields__)


class NativeSchedulerBench(RoundBench[NativeRun]):
    """``SchedulerBench`` at the manager level: one replay per round on a fresh engine
    manager from ``factory`` (the implementation's ``make_native_manager``)."""

    def __init__(self, factory: NativeFactory, workload: Workload,
                 name: str = "") -> None:
        super().__init__()  # no clock: pytest-benchmark's timer times the protocol level
        self.factory = factory
        self.workload = workload
        self.name = name

    def setup(self) -> SetupArgs:
        native = self.factory(workload_spec(self.workload))
        gc.collect()
        return (native,), {}

    def run(self, native: NativeManager[Any, Any]) -> None:  # Any: as NativeFactory
        result = run_native_workload(native, self.workload)
        self.results.append(result)
        self.advance(result.on_cpu_ns / 1e9)

    def metrics(self, results: list[NativeRun]) -> list[Metric]:
        return scheduler_metrics(results)

    def request_share(self) -> float | None:
        """Median share of the engine's request work in the engine time (None: no round)."""
        shares = sorted(r.request_ns / r.impl_ns for r in self.results if r.impl_ns)
        return shares[len(shares) // 2] if shares else None


def manager_level_metrics(impl: ImplHandle, reference: ImplHandle, workload: Workload, rounds: int,
                          warmup: int) -> tuple[list[Metric], dict[str, object]]:
    """The manager-level scheduler figures of ``impl`` paired with ``reference`` (rounds
    interleaved A B B A, as the protocol level), renamed ``manager_<name>``, and the info to
    record. No metrics (and a note saying why) when either side lacks the hook.
    """
    from kvcheck.bench.measure.allocator import measure_rounds
    from kvcheck.bench.measure.paired import PairedBench

    mine, theirs = native_factory(impl), native_factory(reference)
    if mine is None or theirs is None:
        name = impl.name if mine is None else reference.name
        return [], {"manager_level": missing_hook_note(name)}
    bench = NativeSchedulerBench(mine, workload, impl.name)
    if impl.module is reference.module:
        metrics = measure_rounds(bench, rounds, warmup)
        for metric in metrics:
            metric.reference_value = metric.value
    else:
        pair = PairedBench(bench, NativeSchedulerBench(theirs, workload, reference.name))
        pair.measure(rounds, warmup)
        metrics, _ = pair.metrics(warmup)
    out = []
    for metric in metrics:
        if metric.name in MANAGER_METRICS:
            metric.name = MANAGER_PREFIX + metric.name
            out.append(metric)
    share = bench.request_share()
    return out, {"manager_level": "engine objects, no adapter (kvcheck.bench.replay.native)",
                 "manager_request_share": share}
