"""Allocator benchmarks through the adapter protocol (CPU; every implementation).

Each figure is measured on the implementation through pytest-benchmark and on kvcheck's
reference, same inputs, rounds interleaved A B B A (``kvcheck.bench.measure.paired``), and reported
with the median of the paired ratios. The timer is the time spent inside the implementation's
calls (``ALLOCATOR_CLOCK``), GC is collected before and off during every round of both sides,
and each round starts from a fresh manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.bench.measure.allocator import HashingBench, SlotMappingBench
from kvcheck.bench.measure.timing import allocator_time
from kvcheck.bench.workload.hybrid import (
    HYBRID_SCENARIOS,
    HybridBench,
    hybrid_spec,
    make_hybrid_workload,
)
from kvcheck.bench.workload.scenarios import Workload
from kvcheck.bench.workload.source import scheduler_bench_maker
from kvcheck.conformance.protocol import UnsupportedSpec
from kvcheck.reference_impl.hashing import HASH_FUNCTIONS

if TYPE_CHECKING:
    from kvcheck.bench.measure.rounds import BenchmarkFixture
    from kvcheck.bench.session import BenchSession
    from kvcheck.conformance.loader import ImplHandle



def _require(kv_impl: ImplHandle, capability: str, what: str) -> None:
    if not kv_impl.has(capability):
        pytest.skip(f"{kv_impl.name} does not declare capability {capability!r} "
                    f"(needed to benchmark {what})")


@pytest.mark.benchmark(group="scheduler", timer=allocator_time, disable_gc=True)
def test_scheduler(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle, scenario: str) -> None:
    """Continuous batching of one workload (a built-in scenario, or a ``--kv-bench-workload``
    value: see the bench plugin's ``pytest_generate_tests``): scheduled tokens/s,
    allocate_slots calls/s and latency, prefix hit rate, peak usage, preemptions."""
    _require(kv_impl, "manager", "the scheduler loop")
    workload = kv_bench.workload(scenario)
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           scheduler_bench_maker(workload, kv_impl, kv_reference), "scheduler",
                           workload.scenario)


@pytest.mark.benchmark(group="scheduler", timer=allocator_time, disable_gc=True)
@pytest.mark.parametrize("scenario", list(HYBRID_SCENARIOS))
def test_hybrid_scheduler(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle, scenario: str) -> None:
    """Continuous batching on a hybrid layout (1 full-attention group, 5 sliding-window
    groups of 1024 and 4096 tokens) through the per-group protocol: the scheduler figures,
    plus live / null blocks and window frees per group in the record's ``produced``."""
    _require(kv_impl, "manager", "the scheduler loop")
    _require(kv_impl, "kv_cache_groups", "a hybrid (multi-group) workload")
    _require(kv_impl, "sliding_window", "sliding-window groups")
    options = kv_bench.options
    hybrid = make_hybrid_workload(scenario, options.seed, options.scale)
    for side in (kv_impl, kv_reference):
        try:
            side.make_manager(hybrid_spec(hybrid), guard=False)
        except UnsupportedSpec as exc:
            pytest.skip(f"{side.name} declines the hybrid spec of {scenario}: {exc}")
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           lambda impl: HybridBench(impl, hybrid), "scheduler", scenario)


@pytest.mark.benchmark(group="event_wire", timer=allocator_time, disable_gc=True)
def test_event_wire(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle) -> None:
    """take_event_batch after every scheduler step of the eviction-pressure workload (stores
    and removals): events and payload bytes encoded per second, paired with the reference on
    the same steps (kvcheck.bench.kinds.event_wire; with --kv-impl=vllm: vLLM's encoder)."""
    _require(kv_impl, "event_wire", "KV-event encoding")
    pytest.importorskip("msgspec", reason="the event_wire benchmark decodes with msgspec")
    from kvcheck.bench.kinds.event_wire import EventWireBench

    profiles = request.config.hook.pytest_kvcheck_profiles(config=request.config)
    profile = next(iter(profiles.values())) if profiles else kv_impl.info.profile
    workload = kv_bench.workload("eviction_pressure")
    assert isinstance(workload, Workload)  # a built-in scenario's name resolves to one
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           lambda impl: EventWireBench(impl, workload, profile), "event_wire",
                           "eviction_pressure")


@pytest.mark.benchmark(group="event_wire", timer=allocator_time, disable_gc=True)
def test_event_decode(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle) -> None:
    """Decoding the eviction-pressure workload's payloads (the reference's bytes) with the
    module's ``decode_event_batch`` hook, paired with kvcheck's ``decode_batch`` (which
    validates as it decodes) on the same bytes: payloads and bytes decoded per second
    (kvcheck.bench.kinds.event_wire; with --kv-impl=vllm: vLLM's own decoder)."""
    if not callable(getattr(kv_impl.module, "decode_event_batch", None)):
        pytest.skip(f"{kv_impl.name} defines no decode_event_batch(payload, release) (an "
                    "optional module-level hook for this benchmark)")
    pytest.importorskip("msgspec", reason="the event_decode benchmark decodes with msgspec")
    from kvcheck.bench.kinds.event_wire import EventDecodeBench

    profiles = request.config.hook.pytest_kvcheck_profiles(config=request.config)
    profile = next(iter(profiles.values())) if profiles else kv_impl.info.profile
    workload = kv_bench.workload("eviction_pressure")
    assert isinstance(workload, Workload)  # a built-in scenario's name resolves to one
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           lambda impl: EventDecodeBench(impl, workload, profile),
                           "event_decode", "eviction_pressure")


@pytest.mark.benchmark(group="indexer", timer=allocator_time, disable_gc=True)
@pytest.mark.kv_capability("indexer")
def test_indexer(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle) -> None:
    """A router's index (--kv-indexer) on the event streams of the recorded corpus's traces,
    one worker each, delivered round-robin: events applied and matches answered per second,
    paired with kvcheck's reference index on the same streams (kvcheck.bench.kinds.indexer)."""
    _require(kv_impl, "indexer", "a router's index")
    from kvcheck.bench.kinds.indexer import IndexerBench, corpus_streams
    from kvcheck.conformance.loader import load_indexers

    profiles = request.config.hook.pytest_kvcheck_profiles(config=request.config)
    profile = (profiles or {}).get(kv_impl.name, kv_impl.info.profile)
    release = "vllm-0.10" if profile == "vllm-0.10" else "vllm-0.33"
    int_hashes = kv_impl.has("int_hashes")
    streams = corpus_streams(release, int_hashes=int_hashes, scale=kv_bench.options.scale)
    reference = load_indexers("reference", call_timeout=None)[0]
    kv_bench.run_allocator(benchmark, request, kv_impl, reference,
                           lambda impl: IndexerBench(impl, streams), "indexer",
                           f"{len(streams.traces)} corpus traces, "
                           f"{'int' if int_hashes else 'bytes'} hashes")


@pytest.mark.benchmark(group="offload", timer=allocator_time, disable_gc=True)
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_offload_tier(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle, policy: str) -> None:
    """An offload tier (capability ``offload``) on a scheduler-like stream of requests over
    shared documents, the tier a quarter of the keys: lookups, keys stored, keys evicted and
    calls per second, paired with the reference tier of the same policy on the same calls
    (kvcheck.bench.offload_bench)."""
    _require(kv_impl, "offload", "an offload tier")
    from kvcheck.bench.offload_bench import OffloadBench, make_offload_workload

    workload = make_offload_workload(policy, kv_bench.options.seed, kv_bench.options.scale)
    for side in (kv_impl, kv_reference):
        try:
            side.make_offloading_manager(workload.spec())
        except UnsupportedSpec as exc:
            pytest.skip(f"{side.name} declines cache_policy {policy!r}: {exc}")
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           lambda impl: OffloadBench(impl, workload), "offload", policy)


@pytest.mark.benchmark(group="wire", timer=allocator_time, disable_gc=True)
def test_wire_round_trip(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle) -> None:
    """An ``exec:`` implementation's cost per call over the wire (docs/wire-protocol.md): an
    empty call and a 512-token lookup in microseconds, paired with the same calls on the
    reference in process (kvcheck.bench.kinds.wire)."""
    _require(kv_impl, "manager", "calls over the wire")
    if not kv_impl.target.startswith("exec:"):
        pytest.skip(f"{kv_impl.name} runs in process (--kv-impl=exec:COMMAND runs over the "
                    "wire)")
    from kvcheck.bench.kinds.wire import WireRoundTripBench

    scale = kv_bench.options.scale
    kv_bench.run_allocator(benchmark, request, kv_impl, kv_reference,
                           lambda impl: WireRoundTripBench(impl, scale), "wire",
                           "empty call, 512-token lookup")


@pytest.mark.benchmark(group="hashing", timer=allocator_time, disable_gc=True)
@pytest.mark.parametrize("hash_algo", list(HASH_FUNCTIONS))
def test_hashing(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle, hash_algo: str) -> None:
    """Block hashes per second for one algorithm (cold-cache lookups of fresh prompts)."""
    _require(kv_impl, "block_hashes", "block hashing")
    if hash_algo not in kv_impl.info.hash_algos:
        pytest.skip(f"{kv_impl.name} does not list {hash_algo!r} in IMPL_INFO.hash_algos")
    options = kv_bench.options
    kv_bench.run_allocator(
        benchmark, request, kv_impl, kv_reference,
        lambda impl: HashingBench(impl, hash_algo, options.seed, options.scale),
        "hashing", hash_algo)


@pytest.mark.benchmark(group="slot_mapping", timer=allocator_time, disable_gc=True)
def test_slot_mapping(
        benchmark: BenchmarkFixture, request: pytest.FixtureRequest, kv_bench: BenchSession,
        kv_impl: ImplHandle, kv_reference: ImplHandle) -> None:
    """slot_mapping tokens per second through the protocol (checked against, and shown
    beside, kvcheck's vectorized compute_slot_mapping on the same block tables)."""
    _require(kv_impl, "slot_mapping", "slot_mapping")
    options = kv_bench.options
    kv_bench.run_allocator(
        benchmark, request, kv_impl, kv_reference,
        lambda impl: SlotMappingBench(impl, options.seed, options.scale),
        "slot_mapping", "2048-token requests")
