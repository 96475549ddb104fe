"""A KV-aware router's index as a benchmark (capability ``indexer``): events applied per second
and matches answered per second, on the event streams of real vLLM workloads, paired with
kvcheck's reference index (``--kv-indexer=reference``) on the same streams.

The streams: the traces of the shipped recorded corpus of the profile's release
(``conformance/corpus/<release>.cbor.xz``, vLLM's own call sequences), each replayed on a fresh
reference manager with KV events on; every op that emits events is one batch, encoded as the
release's payload in the chosen hash form. Each trace is one worker; the workers' batches are
delivered round-robin, as a router receives eight streams at once. After every batch the index
answers one match, the probes cycling through the prompts the streams stored (each store that
starts a prompt, ``parent_block_hash`` None). Encoding and the probes are prepared once,
untimed; a round times only the calls into the index (``perf_counter_ns``), on a fresh index.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kvcheck.bench.measure.allocator import per_round
from kvcheck.bench.measure.metrics import Metric, per_s
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.conformance.indexer_protocol import (
    IndexerAdapter,
    IndexerConfig,
    MatchContext,
    SupportsDecodedEvents,
    SupportsWireBatches,
)
from kvcheck.conformance.loader import ImplHandle
from kvcheck.errors import KVCheckInputError
from kvcheck.reference_impl.events import BlockStored

__all__ = ["IndexerBench", "IndexerStreams", "corpus_streams"]

#: Traces (workers) at scale 1; CI's scale 0.1 keeps eight.
_TRACES_AT_SCALE_1: Final = 60
_MIN_TRACES: Final = 8


@dataclass(frozen=True)
class IndexerStreams:
    """What a round replays: ``deliveries`` as ``(worker_id, seq, payload, events)`` in
    order, ``probes`` as token lists, and the config every index is built with."""

    config: IndexerConfig
    deliveries: tuple[tuple[str, int, bytes, int], ...]
    probes: tuple[tuple[int, ...], ...]
    traces: tuple[str, ...]


def corpus_streams(release: str, *, int_hashes: bool, scale: float) -> IndexerStreams:
    """The corpus's event streams (see the module doc), ``max(8, 60 * scale)`` traces of one
    block size (the most common), so one index config serves them all.

    Raises:
        KVCheckInputError: the release has no shipped corpus.
    """
    from kvcheck.bench.event_serve import impl_source
    from kvcheck.bench.replay.recorded import lean_replay_problem
    from kvcheck.bench.workload.source import RecordedWorkload, resolve_workload
    from kvcheck.conformance.loader import load_impl
    from kvcheck.conformance.protocol import spec_from_dict
    from kvcheck.conformance.recorded import corpus_path
    from kvcheck.events.codec import decode_batch

    path = corpus_path(release)
    if not path.is_file():
        raise KVCheckInputError(f"no recorded corpus ships for {release} ({path})")
    workload = resolve_workload(f"trace:{path}", 0)
    assert isinstance(workload, RecordedWorkload)  # a .cbor.xz corpus resolves to one

    # Any: a trace's spec as the loaded corpus holds it (conformance.recorded.Corpus)
    def shape(spec: dict[str, Any]) -> tuple[int, str, str]:
        return (spec["block_size"], spec.get("hash_algo", "sha256"),
                spec.get("pythonhashseed", "0"))

    # One index config for every worker: the traces of the most common (block size, hash
    # algorithm, seed), single-group, caching on, that the lean replay replays as recorded
    # (no KV-connector trace: it has no external-KV step).
    usable = [t for t in workload.corpus["traces"] if not t["spec"].get("kv_cache_groups")
              and t["spec"].get("enable_caching", True)
              and not lean_replay_problem(t, spec_from_dict(t["spec"]))]
    shapes = [shape(t["spec"]) for t in usable]
    common = max(set(shapes), key=shapes.count)
    chosen = [t for t in usable if shape(t["spec"]) == common]
    chosen = chosen[:max(_MIN_TRACES, round(_TRACES_AT_SCALE_1 * scale))]
    block_size, hash_algo, seed = common
    reference = load_impl("reference", call_timeout=None)
    streams: list[list[tuple[str, int, bytes, int]]] = []
    probes: list[tuple[int, ...]] = []
    for number, trace in enumerate(chosen):
        worker = f"w{number}"
        source = impl_source(reference, workload, release=release,  # type: ignore[arg-type]
                             int_hashes=int_hashes, data_parallel_rank=None,
                             trace=trace["name"])
        stream = []
        for seq, batch in enumerate(source(0)):
            stream.append((worker, seq, batch.payload, batch.events))
            events = decode_batch(batch.payload, release=release).events  # type: ignore[arg-type]
            probes.extend(tuple(e.token_ids) for e in events
                          if isinstance(e, BlockStored) and e.parent_block_hash is None)
        streams.append(stream)
    deliveries = [s[i] for i in range(max(map(len, streams), default=0)) for s in streams
                  if i < len(s)]
    config = IndexerConfig(block_size=block_size, release=release,
                           hash_form="int" if int_hashes else "bytes", hash_algo=hash_algo,
                           pythonhashseed=seed)
    return IndexerStreams(config, tuple(deliveries), tuple(probes) or ((0,) * block_size,),
                          tuple(t["name"] for t in chosen))


class _Index(IndexerAdapter, SupportsWireBatches, SupportsDecodedEvents, Protocol):
    """An index as ``IndexerBench`` calls it: ``apply_events`` when it declares
    ``decoded_events``, ``apply_batch`` otherwise."""


class IndexerBench(RoundBench[tuple[int, int, int, int]]):
    """One pass over the streams per round, on a fresh index of ``impl`` (unguarded: its own
    object, as benchmarks call managers)."""

    def __init__(self, impl: ImplHandle, streams: IndexerStreams) -> None:
        super().__init__()
        self.impl = impl
        self.streams = streams
        self.decoded = "decoded_events" in impl.info.capabilities
        self._batches: list[Mapping[str, object]] = []
        if self.decoded:
            from kvcheck.conformance.indexer_driver import batch_dict

            config = streams.config
            self._batches = [batch_dict(p, config.release,  # type: ignore[arg-type]
                                        config.hash_form == "int")
                             for _, _, p, _ in streams.deliveries]

    def setup(self) -> SetupArgs:
        factory = self.impl.indexer_factory
        if factory is None:
            raise KVCheckInputError(f"{self.impl.name} does not declare capability 'indexer'")
        gc.collect()
        return (factory(self.streams.config),), {}

    def run(self, index: _Index) -> None:
        context = MatchContext()
        probes = self.streams.probes
        apply_ns = match_ns = events = 0
        clock = time.perf_counter_ns
        wall0, cpu0 = clock(), time.thread_time_ns()
        for number, (worker, seq, payload, count) in enumerate(self.streams.deliveries):
            if self.decoded:
                batch = dict(self._batches[number])
                start = clock()
                index.apply_events(worker, seq, batch, False)
            else:
                start = clock()
                index.apply_batch(worker, seq, payload, False)
            middle = clock()
            index.match(probes[number % len(probes)], context)
            apply_ns += middle - start
            match_ns += clock() - middle
            events += count
        cpu_ns, wall_ns = time.thread_time_ns() - cpu0, clock() - wall0
        if 0 < cpu_ns < wall_ns:  # another process had the core: count the on-CPU share
            apply_ns, match_ns = (round(apply_ns * cpu_ns / wall_ns),
                                  round(match_ns * cpu_ns / wall_ns))
        matches = len(self.streams.deliveries)
        self.results.append((events, apply_ns, matches, match_ns))
        self.advance((apply_ns + match_ns) / 1e9)

    def info(self) -> dict[str, object]:
        config = self.streams.config
        return {"traces": len(self.streams.traces), "batches": len(self.streams.deliveries),
                "probes": len(self.streams.probes), "block_size": config.block_size,
                "release": config.release, "hash_form": config.hash_form}

    def metrics(self, results: list[tuple[int, int, int, int]]) -> list[Metric]:
        return [per_round("events_applied_per_s", "events/s", "higher_is_better",
                          [per_s(n, ns / 1e9) for n, ns, _, _ in results]),
                per_round("matches_per_s", "matches/s", "higher_is_better",
                          [per_s(m, ns / 1e9) for _, _, m, ns in results])]
