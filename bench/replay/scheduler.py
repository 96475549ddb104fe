"""A continuous-batching scheduler loop that replays a ``Workload`` through the adapter protocol.

Per step, in vLLM V1's order:

1. arrivals join the waiting queue (a chat turn once its predecessor has finished);
2. running requests are scheduled first, in admission order: ``allocate_slots`` for the rest
   of a chunked prefill (within the step's token budget) or for one decode token. When it
   returns None the *last* running request is preempted (``free``, recompute later from
   token 0, back to the head of the waiting queue) and the call is retried;
3. if nothing was preempted, waiting requests are admitted while ``max_num_seqs``, the token
   budget and ``allocate_slots`` allow: ``get_computed_blocks`` then ``allocate_slots`` with
   the hits; the first refusal stops admission for this step (for an implementation that
   declares ``pinning_lookup``, ``release_computed`` then drops the refused lookup's pins,
   untimed: kvcheck.conformance.pinning);
4. the step "executes": scheduled tokens become computed; a request whose tokens are all
   computed samples its next output token (from the trace); one that has sampled all its
   output is freed.

Only the implementation's calls are timed (``perf_counter_ns`` around each); the loop's own
bookkeeping is excluded. Pool usage is read once per step (``num_free_blocks``, untimed).

One loop for one and many KV-cache groups: ``get_computed_blocks``'s hits go back to
``allocate_slots`` as they came (one flat list for a single-group spec, one list per group on a
spec with ``kv_cache_groups``, ``SupportsKVCacheGroups``). With ``observe`` (the spec the
manager was built for) the loop also reads, after each step's execution and before its
finished requests are freed, every running request's table per group (``get_block_ids``,
untimed; a single-group spec's flat table is its one group) and counts per group:

* live entries (real blocks) and null entries (block id 0) summed over steps (block-steps) and
  at their per-step peak;
* blocks freed by the window: entries that were real at the request's previous reading and
  are null now (``remove_skipped_blocks``). The nulls a request starts with are the padding of
  a sliding-window hit, never allocated, and are not counted as freed. A request's last frees
  before a preemption are not seen (it leaves the running list first).

The reading is opt-in: it walks every running table every step, which adds a third to most of
an unobserved replay's wall time, and the single-group benchmarks do not report it.

On a loaded machine the process is descheduled now and then, and a call that spans it counts
another process's time. The whole replay's CPU time (``thread_time_ns``) over its wall time
gives the fraction of the replay spent on the CPU; ``SchedulerRun.on_cpu_ns`` scales the
summed call times by it (1.0 on an idle machine). Per-call CPU clocks would avoid the
assumption that the stolen time falls evenly, but on Linux VMs they cost ~1 us per read, as
much as a short ``allocate_slots``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, cast

from kvcheck.bench.measure.timing import timed_call
from kvcheck.bench.workload.scenarios import RequestSpec, Workload
from kvcheck.conformance.protocol import (
    KVCacheManagerAdapter,
    KVCacheSpec,
    RequestView,
    SupportsKVCacheGroups,
    SupportsReleaseComputed,
)
from kvcheck.errors import KVCheckFailure

__all__ = ["SchedulerManager", "SchedulerRun", "drive", "iter_steps", "run_workload"]


class SchedulerManager(Protocol):
    """What the scheduler loop calls, by position: an adapter (``KVCacheManagerAdapter``), or
    a stand-in with the same methods (``harness.RecordingManager`` and ``NullManager``,
    ``native.NativeDriver``). Besides these, ``release_computed`` is called only with
    ``pinning`` (the adapter declares ``pinning_lookup``) and ``get_block_ids`` only with
    ``observe`` (a real adapter).

    The loop never reads the hits and the new blocks: it passes the hits back as they came
    and checks the new blocks for None, so their types are the manager's own (one flat list,
    one list per group, or an engine's objects for ``NativeDriver``)."""

    def get_computed_blocks(self, request: RequestView, /) -> tuple[object, int]: ...

    @property
    def allocate_slots(self) -> Callable[..., object]:
        """``allocate_slots(request, num_new_tokens[, num_new_computed_tokens, hits])``,
        None when refused: a property, so that every manager's own signature matches."""
        ...

    def free(self, request_id: str, /) -> object: ...

    def num_free_blocks(self) -> int: ...


@dataclass
class SchedulerRun:
    """What one replay of a workload measured and counted.

    Durations are nanoseconds of the implementation's calls (every call, refused ones too).
    ``hit_tokens`` / ``queried_tokens`` are summed over admissions: the prefix hit and the
    request's token count when its ``allocate_slots`` succeeds (a request re-admitted after a
    preemption counts again; lookups whose allocation was refused do not count).

    Per group, with ``observe`` (one entry per group of the spec, in spec order; one for a
    single-group spec; empty when the replay did not observe the tables):

    Attributes:
        live_block_steps: real blocks in running requests' tables, summed over step ends.
        null_block_steps: null entries in the same tables, summed the same way.
        peak_live_blocks: the most real blocks the group's tables held at one step end.
        window_freed_blocks: real entries that became null between two readings.
        hit_null_blocks: null entries a request's table already had at its first reading
            (sliding-window hit padding), summed over admissions.
    """

    allocate_ns: list[int] = field(default_factory=list)
    lookup_ns: list[int] = field(default_factory=list)  # get_computed_blocks
    free_ns: list[int] = field(default_factory=list)
    scheduled_tokens: int = 0  # tokens computed by the model: prefill chunks + decode tokens
    hit_tokens: int = 0
    queried_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    finished: int = 0
    peak_used_blocks: int = 0
    usable_blocks: int = 0
    wall_ns: int = 0  # the whole replay, loop included
    cpu_ns: int = 0  # this thread's CPU time over the same span
    live_block_steps: list[int] = field(default_factory=list)
    null_block_steps: list[int] = field(default_factory=list)
    peak_live_blocks: list[int] = field(default_factory=list)
    window_freed_blocks: list[int] = field(default_factory=list)
    hit_null_blocks: list[int] = field(default_factory=list)

    @property
    def impl_ns(self) -> int:
        """Total wall time inside the implementation's calls."""
        return sum(self.allocate_ns) + sum(self.lookup_ns) + sum(self.free_ns)

    @property
    def on_cpu_fraction(self) -> float:
        """CPU time over wall time of the replay, at most 1 (1 when not measured)."""
        if self.wall_ns <= 0 or self.cpu_ns <= 0:
            return 1.0
        return min(1.0, self.cpu_ns / self.wall_ns)

    @property
    def on_cpu_ns(self) -> float:
        """``impl_ns`` less the share of the replay when the process was not running."""
        return self.impl_ns * self.on_cpu_fraction

    @property
    def prefix_hit_rate(self) -> float:
        """Hit tokens over admitted tokens (0 when nothing was admitted)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def peak_usage(self) -> float:
        """Peak fraction of the usable pool (null block excluded) held by requests:
        ``1 - num_free_blocks / usable`` at its highest (evictable cached blocks count as free,
        as in vLLM's KV-cache usage gauge)."""
        return self.peak_used_blocks / self.usable_blocks if self.usable_blocks else 0.0

    @property
    def null_fractions(self) -> list[float]:
        """Per group: null entries over all entries of the running tables (0 when empty)."""
        return [n / (n + live) if n + live else 0.0
                for live, n in zip(self.live_block_steps, self.null_block_steps, strict=True)]


class _Live:
    """A request inside the scheduler: the trace entry plus its progress."""

    __slots__ = ("num_computed", "num_outputs", "outputs", "spec")

    def __init__(self, spec: RequestSpec) -> None:
        self.spec = spec
        self.num_outputs = 0  # sampled so far
        self.num_computed = 0
        self.outputs: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.spec.prompt_token_ids) + self.num_outputs

    def view(self) -> RequestView:
        return RequestView(self.spec.request_id, self.spec.prompt_token_ids, self.outputs,
                           self.num_computed)

    def sample(self) -> None:
        self.num_outputs += 1
        self.outputs = self.spec.output_token_ids[: self.num_outputs]


class _StepBatch:
    """What one step schedules: ``(request, num_new_tokens)`` pairs within the token budget."""

    __slots__ = ("scheduled", "token_budget")

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget  # tokens this step may still schedule
        self.scheduled: list[tuple[_Live, int]] = []

    def add(self, live: _Live, num_new: int) -> None:
        self.scheduled.append((live, num_new))
        self.token_budget -= num_new


class _Scheduler:
    """The loop's queues and the phases of one step (numbered as in the module docstring).

    Every call into ``manager`` goes through ``_timed`` into ``run``'s samples, and every
    count lands in ``run``: the phases only move requests between the queues. ``observe``:
    the spec whose per-group tables ``observe_groups`` reads after each step (None: none).
    """

    def __init__(self, manager: SchedulerManager, workload: Workload, run: SchedulerRun, *,
                 pinning: bool = False, observe: KVCacheSpec | None = None) -> None:
        self.manager = manager
        self.pinning = pinning  # its lookups pin their hits (pinning_lookup)
        self.observe = observe
        self.grouped = observe is not None and bool(observe.kv_cache_groups)
        self._nulls: dict[str, list[int]] = {}  # request id -> nulls per group at last reading
        self.workload = workload
        self.run = run
        # Requests with no predecessor, by arrival step (sorted is stable: trace order on ties).
        self.arrivals = deque(sorted(
            (r for r in workload.requests if r.after is None), key=lambda r: r.arrival_step))
        self.dependents: dict[str, list[RequestSpec]] = {}  # predecessor id -> next turns
        for r in workload.requests:
            if r.after is not None:
                self.dependents.setdefault(r.after, []).append(r)
        self.released: list[tuple[int, RequestSpec]] = []  # (absolute arrival step, request)
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []  # admission order: the last one is preempted first

    @property
    def has_work(self) -> bool:
        return bool(self.arrivals or self.released or self.waiting or self.running)

    def stall_message(self, step: int) -> str:
        return (f"{self.workload.scenario}: no progress after {step} steps ({self.run.finished}"
                f" of {len(self.workload.requests)} requests finished, {len(self.running)} "
                f"running, {len(self.waiting)} waiting)")

    def step(self, step: int) -> None:
        """One scheduler step: arrivals, running requests, admissions, execution, finishes."""
        self.admit_arrivals(step)
        batch = _StepBatch(self.workload.max_num_batched_tokens)
        preemptions_before = self.run.preemptions
        self.schedule_running(batch)
        if self.run.preemptions == preemptions_before:  # vLLM admits nothing after preempting
            self.admit_waiting(batch)
        self.execute(batch)
        if self.observe is not None:
            self.observe_groups()  # before the step's frees: finished tables still held
        self.free_finished(step)
        self.record_usage()

    # 1. arrivals
    def admit_arrivals(self, step: int) -> None:
        """Requests due at ``step`` join the tail of the waiting queue: trace arrivals first,
        then chat turns released by a finished predecessor."""
        while self.arrivals and self.arrivals[0].arrival_step <= step:
            self.waiting.append(_Live(self.arrivals.popleft()))
        if self.released:
            due = [r for s, r in self.released if s <= step]
            self.released = [(s, r) for s, r in self.released if s > step]
            self.waiting.extend(_Live(r) for r in due)

    # 2. running requests
    def schedule_running(self, batch: _StepBatch) -> None:
        """Running requests in admission order, each for the rest of its prefill (chunked by
        the budget) or one decode token, until the budget is spent or a request is itself
        preempted."""
        i = 0
        while i < len(self.running) and batch.token_budget > 0:
            live = self.running[i]
            num_new = min(live.num_tokens - live.num_computed, batch.token_budget)
            if not self._allocate_or_preempt(live, num_new):
                break
            batch.add(live, num_new)
            i += 1

    def _allocate_or_preempt(self, live: _Live, num_new: int) -> bool:
        """``allocate_slots`` for ``live``; after each refusal the last running request is
        preempted and the call retried. False when ``live`` itself was the victim. Victims
        come from the tail, which has not been scheduled yet this step."""
        while timed_call(self.run.allocate_ns, self.manager.allocate_slots, live.view(),
                     num_new) is None:
            if self._preempt_last() is live:
                return False
        return True

    def _preempt_last(self) -> _Live:
        """Free the lowest-priority (last admitted) request; it recomputes from token 0 and
        goes back to the head of the waiting queue."""
        victim = self.running.pop()
        timed_call(self.run.free_ns, self.manager.free, victim.spec.request_id)
        victim.num_computed = 0
        self.waiting.appendleft(victim)
        self.run.preemptions += 1
        return victim

    # 3. admissions
    def admit_waiting(self, batch: _StepBatch) -> None:
        """Admit from the head of the waiting queue while ``max_num_seqs``, the budget and
        ``allocate_slots`` allow; the first refusal ends admission for this step.

        Raises:
            KVCheckFailure: the refused request would be alone in the pool (it never fits).
        """
        while (self.waiting and batch.token_budget > 0
               and len(self.running) < self.workload.max_num_seqs):
            live = self.waiting[0]
            view = live.view()
            hit_ids, num_hit = timed_call(self.run.lookup_ns, self.manager.get_computed_blocks,
                                      view)
            num_new = min(live.num_tokens - num_hit, batch.token_budget)
            new = timed_call(self.run.allocate_ns, self.manager.allocate_slots, view, num_new,
                         num_hit, hit_ids)
            if new is None:
                if self.pinning:  # a refused admission keeps its lookup's pins: drop them
                    cast(SupportsReleaseComputed, self.manager).release_computed(
                        view.request_id)
                if not self.running:
                    raise KVCheckFailure(
                        f"{self.workload.scenario}: {live.spec.request_id} ({live.num_tokens} "
                        f"tokens) cannot be admitted into an idle pool of "
                        f"{self.workload.num_blocks} blocks")
                return
            self.waiting.popleft()
            self.running.append(live)
            self.run.hit_tokens += num_hit
            self.run.queried_tokens += live.num_tokens
            live.num_computed = num_hit
            batch.add(live, num_new)

    # 4. execution and finishes
    def execute(self, batch: _StepBatch) -> None:
        """Scheduled tokens become computed; a request with all its tokens computed samples
        its next output token."""
        for live, num_new in batch.scheduled:
            live.num_computed += num_new
            self.run.scheduled_tokens += num_new
            if live.num_computed == live.num_tokens:
                live.sample()

    def free_finished(self, step: int) -> None:
        """Free every running request that has sampled all its output (in admission order) and
        release its next chat turn, due ``arrival_step`` steps after this one."""
        still_running = []
        for live in self.running:
            if live.num_outputs < len(live.spec.output_token_ids):
                still_running.append(live)
                continue
            timed_call(self.run.free_ns, self.manager.free, live.spec.request_id)
            self.run.finished += 1
            for nxt in self.dependents.pop(live.spec.request_id, ()):
                self.released.append((step + 1 + nxt.arrival_step, nxt))
        self.running = still_running

    def observe_groups(self) -> None:
        """Read the running requests' per-group tables (untimed) and update the counts.

        Raises:
            KVCheckFailure: ``get_block_ids`` of a grouped spec is not one list per group.
        """
        run = self.run
        g = len(run.live_block_steps)
        live_now = [0] * g
        nulls_by_rid: dict[str, list[int]] = {}
        # observe reads the tables of a real adapter: one list per group on a grouped spec, a
        # flat table (its one group) otherwise.
        grouped = cast(SupportsKVCacheGroups, self.manager) if self.grouped else None
        flat = cast(KVCacheManagerAdapter, self.manager)
        for live in self.running:
            rid = live.spec.request_id
            tables = (grouped.get_block_ids(rid) if grouped is not None
                      else [flat.get_block_ids(rid)])
            if self.grouped and len(tables) != g:
                raise KVCheckFailure(
                    f"{self.workload.scenario}: get_block_ids({rid!r}) returned {len(tables)} "
                    f"lists on a spec of {g} KV-cache groups")
            nulls = [sum(1 for b in table if b == 0) if self.grouped else 0
                     for table in tables]
            before = self._nulls.get(rid)
            for i, table in enumerate(tables):
                real = len(table) - nulls[i]
                live_now[i] += real
                run.live_block_steps[i] += real
                run.null_block_steps[i] += nulls[i]
                if before is None:
                    run.hit_null_blocks[i] += nulls[i]
                else:
                    run.window_freed_blocks[i] += max(0, nulls[i] - before[i])
            nulls_by_rid[rid] = nulls
        self._nulls = nulls_by_rid  # preempted and finished requests start over
        for i in range(g):
            run.peak_live_blocks[i] = max(run.peak_live_blocks[i], live_now[i])

    def record_usage(self) -> None:
        """Pool usage after the step (untimed ``num_free_blocks``), kept at its peak."""
        used = self.run.usable_blocks - self.manager.num_free_blocks()
        self.run.peak_used_blocks = max(self.run.peak_used_blocks, used)


def run_workload(manager: SchedulerManager, workload: Workload, max_steps: int | None = None, *,
                 pinning: bool = False, observe: KVCacheSpec | None = None) -> SchedulerRun:
    """Replay ``workload`` on a fresh ``manager`` (a ``KVCacheManagerAdapter``, or one of a
    spec with ``kv_cache_groups``: ``SupportsKVCacheGroups``; ``pinning``: its implementation
    declares ``pinning_lookup``). ``observe``: the spec ``manager`` was built for, whose
    tables are then read per group after every step (see the module docstring; the run's
    per-group counts get one entry per group of ``observe.groups``).

    Raises:
        KVCheckFailure: a request cannot be admitted into an otherwise empty pool (the pool is
            too small for it), the replay exceeds ``max_steps`` (default: see ``drive``),
            which means the implementation stopped making progress, or (with ``observe`` on
            a grouped spec) ``get_block_ids`` does not return one list per group.
    """
    g = 0 if observe is None else len(observe.groups)
    run = SchedulerRun(usable_blocks=max(1, workload.num_blocks - 1),
                       live_block_steps=[0] * g, null_block_steps=[0] * g,
                       peak_live_blocks=[0] * g, window_freed_blocks=[0] * g,
                       hit_null_blocks=[0] * g)
    drive(_Scheduler(manager, workload, run, pinning=pinning, observe=observe), max_steps)
    return run


def _step_limit(requests: tuple[RequestSpec, ...] | list[RequestSpec]) -> int:
    """``drive``'s default ``max_steps`` (see there)."""
    return (4 * sum(r.num_tokens for r in requests)
            + max((r.arrival_step for r in requests), default=0)
            + sum(r.arrival_step for r in requests if r.after is not None) + 1000)


def iter_steps(manager: SchedulerManager, workload: Workload, *,
               pinning: bool = False) -> Iterator[int]:
    """Replay ``workload`` on a fresh ``manager`` as ``run_workload`` does, yielding each
    step's number once the step has run (its frees included), for a caller that reads the
    manager between steps (``kvcheck events serve`` takes each step's KV events).

    Raises:
        KVCheckFailure: as ``run_workload`` (a pool too small, no progress).
    """
    scheduler = _Scheduler(manager, workload, SchedulerRun(
        usable_blocks=max(1, workload.num_blocks - 1)), pinning=pinning)
    limit = _step_limit(workload.requests)
    step = 0
    while scheduler.has_work:
        if step >= limit:
            raise KVCheckFailure(scheduler.stall_message(step))
        scheduler.step(step)
        yield step
        step += 1


def drive(scheduler: _Scheduler, max_steps: int | None = None) -> None:
    """Step ``scheduler`` until every request has finished, and fill its run's ``steps``,
    ``wall_ns`` and ``cpu_ns``. The default ``max_steps`` is 4 steps per trace token, plus
    the last arrival step (a trace file's timestamps may leave idle steps), plus the delays
    of every chat turn (``after``: each may idle the loop in turn), plus 1000.

    Raises:
        KVCheckFailure: more than ``max_steps`` steps (no progress).
    """
    limit = max_steps if max_steps is not None else _step_limit(scheduler.workload.requests)
    run = scheduler.run
    step = 0
    wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
    while scheduler.has_work:
        if step >= limit:
            raise KVCheckFailure(scheduler.stall_message(step))
        scheduler.step(step)
        step += 1
    run.cpu_ns = time.thread_time_ns() - cpu0
    run.wall_ns = time.perf_counter_ns() - wall0
    run.steps = step
