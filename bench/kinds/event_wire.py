"""``take_event_batch`` as a benchmark (capability ``event_wire``): the time an implementation
takes to drain and encode each scheduler step's KV events into the payload vLLM's publisher
sends, on a built-in workload, paired with the reference on the same steps.

A round replays the workload through kvcheck's scheduler loop (``bench.scheduler.iter_steps``)
on a fresh manager with KV events on and calls ``take_event_batch(ts)`` after every step;
only those calls are timed (``perf_counter_ns``; the loop and the allocator calls are not),
scaled by the round's on-CPU fraction as the scheduler benchmark does. The figures are events
encoded per second and payload bytes per second; the payloads are decoded strictly
(``kvcheck.events.codec.decode_batch``, untimed) so an implementation cannot win with bytes
no consumer reads. With ``--kv-impl=vllm`` the implementation side is vLLM's own encoder
(its ``KVEventBatch`` and msgspec encoder), so the paired ratio compares vLLM with kvcheck's.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sized
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from kvcheck.bench.measure.allocator import per_round, workload_spec
from kvcheck.bench.measure.metrics import Metric, per_s
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.bench.measure.timing import collector_off
from kvcheck.bench.replay.scheduler import iter_steps
from kvcheck.bench.workload.scenarios import Workload
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.pinning import declares_pinning
from kvcheck.conformance.protocol import ManagerWithCapabilities
from kvcheck.errors import KVCheckFailure

if TYPE_CHECKING:
    from kvcheck.events.codec import Release

__all__ = ["EventDecodeBench", "EventWireBench"]


class EventWireBench(RoundBench[tuple[int, int, int]]):
    """One workload per round, ``take_event_batch`` timed after every step."""

    def __init__(self, impl: ImplHandle, workload: Workload, profile: str) -> None:
        super().__init__()
        self.impl = impl
        self.workload = workload
        self.spec = replace(workload_spec(workload), enable_kv_cache_events=True,
                            profile=profile)
        # generic speaks 0.33's wire form (SupportsEventWire)
        self.release: Release = "vllm-0.10" if profile == "vllm-0.10" else "vllm-0.33"

    def setup(self) -> SetupArgs:
        gc.collect()
        return (self.impl.make_manager(self.spec, guard=False),), {}

    def run(self, manager: ManagerWithCapabilities) -> None:
        from kvcheck.events.codec import decode_batch
        from kvcheck.events.errors import WireFormatError

        payloads: list[bytes] = []
        total_ns = 0
        wall0, cpu0 = time.perf_counter_ns(), time.thread_time_ns()
        for step in iter_steps(manager, self.workload, pinning=declares_pinning(self.impl)):
            start = time.perf_counter_ns()
            payload = manager.take_event_batch(float(step))
            total_ns += time.perf_counter_ns() - start
            payloads.append(payload)
        cpu_ns, wall_ns = time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0
        if 0 < cpu_ns < wall_ns:
            total_ns = round(total_ns * cpu_ns / wall_ns)
        events = 0
        for step, payload in enumerate(payloads):
            try:
                events += len(decode_batch(payload, release=self.release).events)
            except WireFormatError as error:
                raise KVCheckFailure(f"{self.impl.name}: take_event_batch({float(step)!r}) "
                                     f"after step {step} of {self.workload.scenario} is not "
                                     f"a {self.release} KVEventBatch: {error}") from None
        self.results.append((events, sum(map(len, payloads)), total_ns))
        self.advance(total_ns / 1e9)

    def info(self) -> dict[str, object]:
        w = self.workload
        return {"scenario": w.scenario, "seed": w.seed, "scale": w.scale, "digest": w.digest(),
                "num_blocks": w.num_blocks, "block_size": w.block_size,
                "release": self.release, "events_per_round": self.results[0][0]
                if self.results else None}

    def metrics(self, results: list[tuple[int, int, int]]) -> list[Metric]:
        return [per_round("events_encoded_per_s", "events/s", "higher_is_better",
                          [per_s(n, ns / 1e9) for n, _, ns in results]),
                per_round("payload_bytes_per_s", "B/s", "higher_is_better",
                          [per_s(b, ns / 1e9) for _, b, ns in results])]


class EventDecodeBench(RoundBench[tuple[int, int, int]]):
    """Decoding one workload's payloads with the implementation module's optional hook
    ``decode_event_batch(payload, release)`` (benchmarks only: the reference adapter's is
    ``kvcheck.events.codec.decode_batch``, which validates as it decodes; the vLLM adapter's is
    vLLM's own ``msgspec.msgpack.Decoder(KVEventBatch)``, which validates nothing more than
    the types). The payloads are the reference's ``take_event_batch`` bytes after every step
    of the workload, made once (untimed); a round decodes all of them, timed as one span with
    the collector off. Figures: payloads and payload bytes decoded per second."""

    def __init__(self, impl: ImplHandle, workload: Workload, profile: str) -> None:
        super().__init__()
        from kvcheck.adapters.reference import make_kv_cache_manager

        self.impl = impl
        self.workload = workload
        self.release: Release = "vllm-0.10" if profile == "vllm-0.10" else "vllm-0.33"
        decode = getattr(impl.module, "decode_event_batch", None)
        if not callable(decode):
            raise KVCheckFailure(f"{impl.name} has no module-level decode_event_batch(payload, "
                                 "release) to benchmark")
        self.decode = decode
        spec = replace(workload_spec(workload), enable_kv_cache_events=True,
                       profile=profile)
        manager = make_kv_cache_manager(spec)
        self.payloads = [manager.take_event_batch(float(step))
                         for step in iter_steps(manager, workload, pinning=False)]
        self.num_events = sum(len(_events(decode(p, self.release))) for p in self.payloads)

    def setup(self) -> SetupArgs:
        gc.collect()
        return (), {}

    def run(self) -> None:
        decode, release, payloads = self.decode, self.release, self.payloads
        with collector_off(collect=False):  # setup collected
            start = time.perf_counter_ns()
            for payload in payloads:
                decode(payload, release)
            total_ns = time.perf_counter_ns() - start
        self.results.append((len(payloads), sum(map(len, payloads)), total_ns))
        self.advance(total_ns / 1e9)

    def info(self) -> dict[str, object]:
        w = self.workload
        return {"scenario": w.scenario, "seed": w.seed, "scale": w.scale, "digest": w.digest(),
                "release": self.release, "payloads": len(self.payloads),
                "events_per_round": self.num_events}

    def metrics(self, results: list[tuple[int, int, int]]) -> list[Metric]:
        return [per_round("payloads_decoded_per_s", "batches/s", "higher_is_better",
                          [per_s(n, ns / 1e9) for n, _, ns in results]),
                per_round("payload_bytes_decoded_per_s", "B/s", "higher_is_better",
                          [per_s(b, ns / 1e9) for _, b, ns in results])]


class _DecodedBatch(Protocol):
    """What ``_events`` reads of a decoded batch (``wire_events`` too, when it has them)."""

    @property
    def events(self) -> Sized: ...


def _events(decoded: _DecodedBatch) -> Sized:
    """The wire events of a decoded batch (kvcheck's ``DecodedBatch.wire_events`` or vLLM's
    own ``KVEventBatch.events``)."""
    wire_events = getattr(decoded, "wire_events", None)
    return decoded.events if wire_events is None else wire_events
