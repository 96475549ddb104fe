"""The continuous-batching loop of ``scheduler.py`` on a grouped (hybrid) spec.

The per-step order of calls is ``scheduler.py``'s, unchanged: chunked prefill within the token
budget, one decode token, preempt the last running request when ``allocate_slots`` returns
None, then admissions with ``get_computed_blocks`` hits passed back to ``allocate_slots``. On a
spec with ``kv_cache_groups`` those hits are already one list per group
(``SupportsKVCacheGroups``), so the loop hands them through as they came. The timed region is
the same: the implementation's calls only.

The seam (``execute`` overridden): after each step's execution and before its finished
requests are freed, the loop reads every running request's per-group block table
(``get_block_ids``, untimed) and counts

* live entries (real blocks) and null entries (block id 0) per group, summed over steps
  (block-steps) and at their per-step peak;
* blocks freed by the window per group: entries that were real at the request's previous
  reading and are null now (``remove_skipped_blocks``). The nulls a request starts with are
  the padding of a sliding-window hit, never allocated, and are not counted as freed. A
  request's last frees before a preemption are not seen (it leaves the running list first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcheck.bench.scheduler import SchedulerRun, _Scheduler, _StepBatch, drive
from kvcheck.bench.workloads import Workload
from kvcheck.errors import KVCheckFailure, KVCheckInputError

__all__ = ["HybridRun", "run_hybrid_workload"]


@dataclass
class HybridRun(SchedulerRun):
    """``SchedulerRun`` plus what the groups held, one entry per group in spec order.

    Attributes:
        live_block_steps: real blocks in running requests' tables, summed over step ends.
        null_block_steps: null entries in the same tables, summed the same way.
        peak_live_blocks: the most real blocks the group's tables held at one step end.
        window_freed_blocks: real entries that became null between two readings.
        hit_null_blocks: null entries a request's table already had at its first reading
            (sliding-window hit padding), summed over admissions.
    """

    live_block_steps: list[int] = field(default_factory=list)
    null_block_steps: list[int] = field(default_factory=list)
    peak_live_blocks: list[int] = field(default_factory=list)
    window_freed_blocks: list[int] = field(default_factory=list)
    hit_null_blocks: list[int] = field(default_factory=list)

    @property
    def null_fractions(self) -> list[float]:
        """Per group: null entries over all entries of the running tables (0 when empty)."""
        return [n / (n + live) if n + live else 0.0
                for live, n in zip(self.live_block_steps, self.null_block_steps, strict=True)]


class _HybridScheduler(_Scheduler):
    """``_Scheduler`` with a per-group reading of the running tables after each step."""

    def __init__(self, manager: Any, workload: Workload, run: HybridRun,
                 num_groups: int, *, pinning: bool = False) -> None:
        super().__init__(manager, workload, run, pinning=pinning)
        self.hybrid = run
        self.num_groups = num_groups
        self._nulls: dict[str, list[int]] = {}  # request id -> nulls per group at last reading

    def execute(self, batch: _StepBatch) -> None:
        """``_Scheduler.execute``, then ``observe_groups`` (before the step's frees)."""
        super().execute(batch)
        self.observe_groups()

    def observe_groups(self) -> None:
        """Read the running requests' per-group tables (untimed) and update the counts."""
        run, g = self.hybrid, self.num_groups
        live_now = [0] * g
        nulls_by_rid: dict[str, list[int]] = {}
        for live in self.running:
            rid = live.spec.request_id
            tables = self.manager.get_block_ids(rid)
            if len(tables) != g:
                raise KVCheckFailure(
                    f"{self.workload.scenario}: get_block_ids({rid!r}) returned {len(tables)} "
                    f"lists on a spec of {g} KV-cache groups")
            nulls = [sum(1 for b in table if b == 0) for table in tables]
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


def run_hybrid_workload(manager: Any, workload: Workload, num_groups: int,
                        max_steps: int | None = None, *, pinning: bool = False) -> HybridRun:
    """Replay ``workload`` on a fresh grouped ``manager`` (built for a spec with
    ``num_groups`` entries in ``kv_cache_groups``), as ``scheduler.run_workload`` does.

    Raises:
        KVCheckInputError: ``num_groups < 1``.
        KVCheckFailure: a request cannot be admitted into an otherwise empty pool, the replay
            exceeds ``max_steps`` (default: see ``scheduler.drive``), or
            ``get_block_ids`` does not return one list per group.
    """
    if num_groups < 1:
        raise KVCheckInputError(f"num_groups must be >= 1, got {num_groups}")
    run = HybridRun(usable_blocks=max(1, workload.num_blocks - 1),
                    live_block_steps=[0] * num_groups, null_block_steps=[0] * num_groups,
                    peak_live_blocks=[0] * num_groups, window_freed_blocks=[0] * num_groups,
                    hit_null_blocks=[0] * num_groups)
    drive(_HybridScheduler(manager, workload, run, num_groups, pinning=pinning), max_steps)
    return run
