"""A continuous-batching scheduler loop that replays a ``Workload`` through the adapter protocol.

Per step, in vLLM V1's order:

1. arrivals join the waiting queue (a chat turn once its predecessor has finished);
2. running requests are scheduled first, in admission order: ``allocate_slots`` for the rest
   of a chunked prefill (within the step's token budget) or for one decode token. When it
   returns None the *last* running request is preempted (``free``, recompute later from
   token 0, back to the head of the waiting queue) and the call is retried;
3. if nothing was preempted, waiting requests are admitted while ``max_num_seqs``, the token
   budget and ``allocate_slots`` allow: ``get_computed_blocks`` then ``allocate_slots`` with
   the hits; the first refusal stops admission for this step;
4. the step "executes": scheduled tokens become computed; a request whose tokens are all
   computed samples its next output token (from the trace); one that has sampled all its
   output is freed.

Only the implementation's calls are timed (``perf_counter_ns`` around each); the loop's own
bookkeeping is excluded. Pool usage is read once per step (``num_free_blocks``, untimed).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvcheck.bench.workloads import RequestSpec, Workload
from kvcheck.conformance.protocol import RequestView

__all__ = ["SchedulerRun", "run_workload"]


@dataclass
class SchedulerRun:
    """What one replay of a workload measured and counted.

    Durations are nanoseconds of the implementation's calls (every call, refused ones too).
    ``hit_tokens`` / ``queried_tokens`` are summed over admissions: the prefix hit and the
    request's token count when its ``allocate_slots`` succeeds (a request re-admitted after a
    preemption counts again; lookups whose allocation was refused do not count).
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

    @property
    def impl_ns(self) -> int:
        """Total time inside the implementation's calls."""
        return sum(self.allocate_ns) + sum(self.lookup_ns) + sum(self.free_ns)

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


class _Live:
    """A request inside the scheduler: the trace entry plus its progress."""

    __slots__ = ("spec", "num_outputs", "num_computed", "outputs")

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


def _timed(samples: list[int], fn: Any, *args: Any) -> Any:
    start = time.perf_counter_ns()
    result = fn(*args)
    samples.append(time.perf_counter_ns() - start)
    return result


def run_workload(manager: Any, workload: Workload, max_steps: int | None = None) -> SchedulerRun:
    """Replay ``workload`` on a fresh ``manager`` (a ``KVCacheManagerAdapter``).

    Raises:
        RuntimeError: a request cannot be admitted into an otherwise empty pool (the pool is
            too small for it), or the replay exceeds ``max_steps`` (default: 4 steps per trace
            token plus 1000), which means the implementation stopped making progress.
    """
    run = SchedulerRun(usable_blocks=max(1, workload.num_blocks - 1))
    arrivals = deque(sorted(
        (r for r in workload.requests if r.after is None), key=lambda r: r.arrival_step))
    dependents: dict[str, list[RequestSpec]] = {}
    for r in workload.requests:
        if r.after is not None:
            dependents.setdefault(r.after, []).append(r)
    released: list[tuple[int, RequestSpec]] = []  # (absolute arrival step, request)
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    limit = max_steps if max_steps is not None else (
        4 * sum(r.num_tokens for r in workload.requests) + 1000)
    step = 0
    while arrivals or released or waiting or running:
        if step >= limit:
            raise RuntimeError(
                f"{workload.scenario}: no progress after {step} steps ({run.finished} of "
                f"{len(workload.requests)} requests finished, {len(running)} running, "
                f"{len(waiting)} waiting)")
        while arrivals and arrivals[0].arrival_step <= step:
            waiting.append(_Live(arrivals.popleft()))
        if released:
            due = [r for s, r in released if s <= step]
            released = [(s, r) for s, r in released if s > step]
            waiting.extend(_Live(r) for r in due)

        budget = workload.max_num_batched_tokens
        scheduled: list[tuple[_Live, int]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            live = running[i]
            num_new = min(live.num_tokens - live.num_computed, budget)
            is_scheduled = True
            while _timed(run.allocate_ns, manager.allocate_slots, live.view(), num_new) is None:
                # Preempt the lowest-priority (last admitted) request and retry; victims come
                # from the tail, which has not been scheduled yet this step.
                victim = running.pop()
                _timed(run.free_ns, manager.free, victim.spec.request_id)
                victim.num_computed = 0
                waiting.appendleft(victim)
                run.preemptions += 1
                preempted = True
                if victim is live:
                    is_scheduled = False
                    break
            if not is_scheduled:
                break
            scheduled.append((live, num_new))
            budget -= num_new
            i += 1

        while (not preempted and waiting and budget > 0
               and len(running) < workload.max_num_seqs):
            live = waiting[0]
            view = live.view()
            hit_ids, num_hit = _timed(run.lookup_ns, manager.get_computed_blocks, view)
            num_new = min(live.num_tokens - num_hit, budget)
            new = _timed(run.allocate_ns, manager.allocate_slots, view, num_new, num_hit,
                         hit_ids)
            if new is None:
                if not running:
                    raise RuntimeError(
                        f"{workload.scenario}: {live.spec.request_id} ({live.num_tokens} "
                        f"tokens) cannot be admitted into an idle pool of "
                        f"{workload.num_blocks} blocks")
                break
            waiting.popleft()
            running.append(live)
            run.hit_tokens += num_hit
            run.queried_tokens += live.num_tokens
            live.num_computed = num_hit
            scheduled.append((live, num_new))
            budget -= num_new

        for live, num_new in scheduled:
            live.num_computed += num_new
            run.scheduled_tokens += num_new
            if live.num_computed == live.num_tokens:
                live.sample()
        still_running = []
        for live in running:
            if live.num_outputs < len(live.spec.output_token_ids):
                still_running.append(live)
                continue
            _timed(run.free_ns, manager.free, live.spec.request_id)
            run.finished += 1
            for nxt in dependents.pop(live.spec.request_id, ()):
                released.append((step + 1 + nxt.arrival_step, nxt))
        running = still_running
        used = run.usable_blocks - manager.num_free_blocks()
        run.peak_used_blocks = max(run.peak_used_blocks, used)
        step += 1
    run.steps = step
    return run
