"""Allocator measurements through the adapter protocol, one ``RoundBench`` per benchmark.

Each is a ``kvcheck.bench.measure.rounds.RoundBench`` (``setup`` untimed, ``run`` one measured
round: the time spent inside the implementation's calls); the same object measures the reference
baseline without pytest-benchmark (``measure_rounds``), so both sides run identical code on
identical inputs.

* ``SchedulerBench``: a workload through the continuous-batching loop (``scheduler.py``).
* ``HashingBench``: block hashing per algorithm: ``get_computed_blocks`` of a fresh request on
  a cold cache plus ``block_hashes`` (capability ``block_hashes``), which must return every full
  block's hash, so the work is known to be done.
* ``SlotMappingBench``: ``slot_mapping(request_id, 0, n)`` per request (capability
  ``slot_mapping``), checked against kvcheck's vectorized ``compute_slot_mapping`` on the same
  block tables, whose throughput is reported too.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Sequence

import numpy as np

from kvcheck.bench.errors import BenchCheckFailure
from kvcheck.bench.measure.metrics import Metric, per_s, percentile
from kvcheck.bench.measure.rounds import Bench, RoundBench, SetupArgs
from kvcheck.bench.replay.scheduler import SchedulerManager, SchedulerRun, run_workload
from kvcheck.bench.workload.scenarios import Draws, Workload, scaled_count, trace_profile
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.pinning import declares_pinning
from kvcheck.conformance.protocol import KVCacheSpec, ManagerWithCapabilities, RequestView
from kvcheck.errors import KVCheckFailure, KVCheckInputError
from kvcheck.reference_impl.block_table import compute_slot_mapping

__all__ = [
    "HashingBench",
    "RoundBench",
    "SchedulerBench",
    "SlotMappingBench",
    "measure_rounds",
    "per_round",
]


def _median(samples: list[float]) -> float:
    return percentile(samples, 50)


def per_round(name: str, unit: str, direction: str, samples: list[float]) -> Metric:
    """A figure whose value is the median of its per-round ``samples``."""
    return Metric(name, unit, direction, _median(samples), samples)


def measure_rounds(bench: Bench, rounds: int, warmup: int) -> list[Metric]:
    """Run ``warmup + rounds`` rounds without pytest-benchmark (a collection before, GC off
    inside each round, as in ``paired.run_one_round``) and return the timed rounds' metrics."""
    from kvcheck.bench.measure.paired import run_one_round

    for _ in range(warmup + rounds):
        run_one_round(bench)
    return bench.metrics(bench.timed_results(warmup))


# ------------------------------------------------------------------------------------ scheduler
def workload_spec(workload: Workload, hash_algo: str = "sha256") -> KVCacheSpec:
    """The pool a workload is replayed on."""
    return KVCacheSpec(num_blocks=workload.num_blocks, block_size=workload.block_size,
                       hash_algo=hash_algo)


class SchedulerBench(RoundBench[SchedulerRun]):
    """One workload per round through ``run_workload`` on a fresh manager.

    Subclasses replay on another pool or loop by overriding ``spec`` and ``replay``
    (``kvcheck.bench.workload.hybrid.HybridBench``: a grouped pool, the per-group loop).
    """

    #: Whether the same workload can also be timed at the manager level (the adapters'
    #: ``make_native_manager`` hook, ``kvcheck.bench.replay.native``: single-group pools only).
    native_level: bool = True

    def __init__(self, impl: ImplHandle, workload: Workload) -> None:
        super().__init__()
        self.impl = impl
        self.workload = workload

    def spec(self) -> KVCacheSpec:
        """The pool each round's fresh manager is built for."""
        return workload_spec(self.workload)

    def replay(self, manager: SchedulerManager) -> SchedulerRun:
        """One round: the workload through the scheduler loop."""
        return run_workload(manager, self.workload, pinning=declares_pinning(self.impl))

    def setup(self) -> SetupArgs:
        gc.collect()
        return (self.impl.make_manager(self.spec(), guard=False),), {}

    def run(self, manager: SchedulerManager) -> None:
        result = self.replay(manager)
        self.results.append(result)
        self.advance(result.on_cpu_ns / 1e9)

    def info(self) -> dict[str, object]:
        w = self.workload
        return {
            "scenario": w.scenario, "seed": w.seed, "scale": w.scale, "digest": w.digest(),
            "num_requests": len(w.requests), "num_prompt_tokens": w.num_prompt_tokens,
            "num_output_tokens": w.num_output_tokens, "num_blocks": w.num_blocks,
            "block_size": w.block_size, "working_set_blocks": w.working_set_blocks,
            "pool_fraction": w.pool_fraction, "max_num_seqs": w.max_num_seqs,
            "max_num_batched_tokens": w.max_num_batched_tokens,
            "distributions": dict(w.distributions),
            "produced": {**trace_profile(w.requests, w.block_size), **self.produced()},
        }

    def produced(self) -> dict[str, object]:
        """What the measured rounds achieved (the first one; replays are deterministic):
        prefix hit rate, preemptions, peak usage. Empty before any round."""
        if not self.results:
            return {}
        run = self.results[0]
        return {"prefix_hit_rate": run.prefix_hit_rate, "preemptions": float(run.preemptions),
                "peak_usage": run.peak_usage, "steps": float(run.steps)}

    def metrics(self, results: list[SchedulerRun]) -> list[Metric]:
        return scheduler_metrics(results)


def scheduler_metrics(runs: Sequence[SchedulerRun]) -> list[Metric]:
    """The scheduler figures of some rounds (see ``SchedulerRun`` for the counters).

    Throughputs are per round (``count / seconds inside the implementation``, scaled by the
    round's on-CPU fraction: ``SchedulerRun.on_cpu_ns``), headline = median round. Per-call
    latencies (wall, uncorrected) pool every call of every round for the headline percentile;
    their samples are the per-round percentiles.
    """
    if not runs:
        raise KVCheckInputError("scheduler_metrics: no rounds")
    pooled_us = [ns / 1e3 for run in runs for ns in run.allocate_ns]
    p50s = [percentile([ns / 1e3 for ns in r.allocate_ns], 50) for r in runs]
    p99s = [percentile([ns / 1e3 for ns in r.allocate_ns], 99) for r in runs]
    return [
        per_round("scheduled_tokens_per_s", "tokens/s", "higher_is_better",
                   [per_s(r.scheduled_tokens, r.on_cpu_ns / 1e9) for r in runs]),
        per_round("allocate_slots_calls_per_s", "calls/s", "higher_is_better",
                   [per_s(len(r.allocate_ns), sum(r.allocate_ns) * r.on_cpu_fraction / 1e9)
                    for r in runs]),
        Metric("allocate_slots_us_p50", "us", "lower_is_better", percentile(pooled_us, 50),
               p50s, stat="p50 of all calls"),
        Metric("allocate_slots_us_p99", "us", "lower_is_better", percentile(pooled_us, 99),
               p99s, stat="p99 of all calls"),
        per_round("prefix_hit_rate", "fraction", "higher_is_better",
                   [r.prefix_hit_rate for r in runs]),
        per_round("peak_usage", "fraction", "lower_is_better", [r.peak_usage for r in runs]),
        per_round("preemptions", "count", "lower_is_better",
                   [float(r.preemptions) for r in runs]),
    ]


# -------------------------------------------------------------------------------------- hashing
class HashingBench(RoundBench[tuple[int, int]]):
    """Hash ``num_requests`` fresh prompts of ``blocks_per_request`` full blocks per round."""

    def __init__(self, impl: ImplHandle, hash_algo: str, seed: int = 0, scale: float = 1.0,
                 block_size: int = 16, blocks_per_request: int = 32) -> None:
        super().__init__()
        self.impl = impl
        self.hash_algo = hash_algo
        self.seed = seed
        self.block_size = block_size
        self.blocks_per_request = blocks_per_request
        self.num_requests = scaled_count(64, scale)
        self._round = 0

    def setup(self) -> SetupArgs:
        # Fresh tokens every round (the same sequence of rounds for every implementation).
        draws = Draws(self.seed, f"hashing/{self._round}")
        self._round += 1
        length = self.blocks_per_request * self.block_size + 1  # +1: no block is partial
        views = [RequestView(f"hash-{i:05d}", draws.tokens(length))
                 for i in range(self.num_requests)]
        spec = KVCacheSpec(num_blocks=16, block_size=self.block_size, hash_algo=self.hash_algo)
        gc.collect()
        return (self.impl.make_manager(spec, guard=False), views), {}

    def run(self, manager: ManagerWithCapabilities, views: list[RequestView]) -> None:
        total_ns = 0
        pinning = declares_pinning(self.impl)
        wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
        for view in views:
            start = time.perf_counter_ns()
            manager.get_computed_blocks(view)
            hashes = manager.block_hashes(view.request_id)
            total_ns += time.perf_counter_ns() - start
            if pinning:  # a probe, not an admission: drop its pins
                manager.release_computed(view.request_id)
            if len(hashes) != self.blocks_per_request:
                raise BenchCheckFailure(
                    f"{self.impl.name}: block_hashes({view.request_id!r}) returned "
                    f"{len(hashes)} hashes after get_computed_blocks of a "
                    f"{view.num_tokens}-token prompt; expected {self.blocks_per_request} (one "
                    f"per full block of {self.block_size})")
            manager.free(view.request_id)
        # Less the share of the round when the process was not running (see scheduler.py).
        cpu_ns, wall_ns = time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0
        if 0 < cpu_ns < wall_ns:
            total_ns = round(total_ns * cpu_ns / wall_ns)
        self.results.append((self.num_requests * self.blocks_per_request, total_ns))
        self.advance(total_ns / 1e9)

    def info(self) -> dict[str, object]:
        return {"hash_algo": self.hash_algo, "num_requests": self.num_requests,
                "blocks_per_request": self.blocks_per_request, "block_size": self.block_size,
                "seed": self.seed}

    def metrics(self, results: list[tuple[int, int]]) -> list[Metric]:
        return [per_round("hash_blocks_per_s", "blocks/s", "higher_is_better",
                           [per_s(n, ns / 1e9) for n, ns in results])]


# ---------------------------------------------------------------------------------- slot_mapping
class SlotMappingBench(RoundBench[tuple[int, int, int]]):
    """``num_requests`` requests of ``num_tokens`` allocated (untimed), then their slots."""

    def __init__(self, impl: ImplHandle, seed: int = 0, scale: float = 1.0, block_size: int = 16,
                 num_tokens: int = 2048) -> None:
        super().__init__()
        self.impl = impl
        self.seed = seed
        self.block_size = block_size
        self.num_tokens = num_tokens
        self.num_requests = scaled_count(32, scale)
        self._round = 0

    def setup(self) -> SetupArgs:
        draws = Draws(self.seed, f"slot_mapping/{self._round}")
        self._round += 1
        blocks = math.ceil(self.num_tokens / self.block_size)
        spec = KVCacheSpec(num_blocks=1 + self.num_requests * blocks,
                           block_size=self.block_size, enable_caching=False)
        manager = self.impl.make_manager(spec, guard=False)
        rids = []
        for i in range(self.num_requests):
            view = RequestView(f"slots-{i:05d}", draws.tokens(self.num_tokens))
            if manager.allocate_slots(view, self.num_tokens) is None:
                raise KVCheckFailure(f"{self.impl.name}: allocate_slots refused {view.request_id}"
                                     f" in a pool sized for it ({spec.num_blocks} blocks)")
            rids.append(view.request_id)
        gc.collect()
        return (manager, rids), {}

    def run(self, manager: ManagerWithCapabilities, rids: list[str]) -> None:
        n = self.num_tokens
        impl_ns, got = 0, []
        for rid in rids:
            start = time.perf_counter_ns()
            slots = manager.slot_mapping(rid, 0, n)
            impl_ns += time.perf_counter_ns() - start
            got.append(slots)
        # kvcheck's vectorized path on the same block tables: timed, and the oracle.
        table = np.array([manager.get_block_ids(rid) for rid in rids], dtype=np.int32)
        qsl = np.arange(0, (len(rids) + 1) * n, n, dtype=np.int64)
        positions = np.tile(np.arange(n, dtype=np.int64), len(rids))
        start = time.perf_counter_ns()
        expected = compute_slot_mapping(table, self.block_size, qsl, positions)
        vector_ns = time.perf_counter_ns() - start
        flat = np.asarray([s for slots in got for s in slots], dtype=np.int64)
        if flat.shape != expected.shape or not np.array_equal(flat, expected):
            bad = int(np.argmax(flat != expected)) if flat.shape == expected.shape else -1
            where = (f"first mismatch at token {bad % n} of {rids[bad // n]!r}: got "
                     f"{int(flat[bad])}, expected {int(expected[bad])}" if bad >= 0 else
                     f"{flat.size} slots returned, {expected.size} expected")
            raise BenchCheckFailure(f"{self.impl.name}: slot_mapping disagrees with "
                                 f"compute_slot_mapping over its own block tables ({where})")
        self.results.append((len(rids) * n, impl_ns, vector_ns))
        self.advance(impl_ns / 1e9)

    def info(self) -> dict[str, object]:
        return {"num_requests": self.num_requests, "tokens_per_request": self.num_tokens,
                "block_size": self.block_size, "seed": self.seed}

    def metrics(self, results: list[tuple[int, int, int]]) -> list[Metric]:
        return [
            per_round("slot_mapping_tokens_per_s", "tokens/s", "higher_is_better",
                       [per_s(n, ns / 1e9) for n, ns, _ in results]),
            per_round("vectorized_slot_mapping_tokens_per_s", "tokens/s", "higher_is_better",
                       [per_s(n, ns / 1e9) for n, _, ns in results]),
        ]
