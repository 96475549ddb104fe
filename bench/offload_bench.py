"""An offload tier as a benchmark (capability ``offload``): lookups, stores and evictions per
second on a scheduler-like stream, paired with kvcheck's reference tier on the same stream.

::

    kvcheck bench offload                        # reference against itself
    kvcheck bench offload --impl vllm --policy arc --rounds 9
    kvcheck bench offload --impl mypkg.tier --scale 0.5 --tier-fraction 0.1

The stream (``make_offload_workload``, seeded: the same keys for every policy and every
implementation): 32 documents of 8-64 blocks with Zipf-like popularity; each request reads the
first half or more of one document's blocks (the prefix it shares with other requests of that
document) and then 1-16 blocks of its own. One key per block (a 32-byte hash and KV-cache
group 0, as vLLM's ``make_offload_key``), positioned 16 tokens per block. The tier holds
``--tier-fraction`` (default 0.25) of the stream's distinct keys, so it evicts.

Per request, as vLLM's offloading connector drives the tier: ``on_new_request``,
``set_key_positions``; ``lookup`` from the head until the first key that is not ``HIT``;
``prepare_load`` of the hits (pinned while the request stores); its remaining keys offered in
chunks of 16 (``prepare_store``, then ``complete_store`` of the keys it took); ``complete_load``;
``on_request_finished``; ``take_events``.

A round replays the whole stream on a fresh tier of the implementation (its own object, no
guard: ``handle.make_offloading_manager(spec).raw``) and times every call
(``perf_counter_ns``), scaled by the round's on-CPU fraction as the other benchmarks do. Rounds
of the implementation and the reference alternate A B B A (``kvcheck.bench.measure.paired``: a
collection before, the collector off during each round). Figures, each per round, median over
the timed rounds:

* ``lookups_per_s``: ``lookup`` calls / time in ``lookup``;
* ``stores_per_s``: keys stored / time in ``prepare_store`` and ``complete_store``;
* ``evictions_per_s``: keys evicted / time in the ``prepare_store`` calls that evicted;
* ``calls_per_s``: every call of the round / time in all of them.

Each side's figures count its own answers (a tier that answers differently does other work:
the command says so; the ``offload`` area says which answer is wrong).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.allocator import per_round
from kvcheck.bench.measure.metrics import Metric, PairedRatio, per_s
from kvcheck.bench.measure.rounds import RoundBench, SetupArgs
from kvcheck.bench.workload.scenarios import Draws, scaled_count
from kvcheck.conformance.loader import ImplHandle
from kvcheck.conformance.offload_protocol import OffloadingManagerAdapter, OffloadSpec
from kvcheck.errors import KVCheckInputError

__all__ = ["POLICIES", "OffloadBench", "OffloadRequest", "OffloadRound", "OffloadWorkload",
           "main", "make_offload_workload", "replay"]

#: The cache policies a tier is timed with (``OffloadSpec.cache_policy``).
POLICIES: Final = ("lru", "arc")
#: Requests at scale 1.
_REQUESTS_AT_SCALE_1: Final = 400
#: Documents (shared prefixes), their lengths in blocks, a request's own blocks.
_DOCUMENTS: Final = 32
_DOCUMENT_BLOCKS: Final = (8, 64)
_OWN_BLOCKS: Final = (1, 16)
#: Tokens per block (a key's position is where its block ends).
_BLOCK_TOKENS: Final = 16
#: Keys per ``prepare_store`` offer.
STORE_CHUNK: Final = 16
#: The tier's share of the stream's distinct keys (default).
DEFAULT_TIER_FRACTION: Final = 0.25


@dataclass(frozen=True, eq=False)
class OffloadRequest:
    """One request: its keys head to tail and where each key's block ends (tokens)."""

    req_id: str
    keys: tuple[bytes, ...]
    positions: dict[bytes, int]


@dataclass(frozen=True, eq=False)
class OffloadWorkload:
    """What a round replays (``make_offload_workload``)."""

    policy: Literal["lru", "arc"]
    seed: int
    scale: float
    tier_fraction: float
    requests: tuple[OffloadRequest, ...]
    working_set: int
    num_chunks: int
    store_chunk: int = STORE_CHUNK

    def spec(self) -> OffloadSpec:
        """The tier each round's fresh tier is built for (events on: they are drained)."""
        return OffloadSpec(num_chunks=self.num_chunks, cache_policy=self.policy)

    @property
    def num_keys(self) -> int:
        """Keys over all requests (with repeats)."""
        return sum(len(r.keys) for r in self.requests)

    def digest(self) -> str:
        """A short SHA-256 of the request stream (ids and keys, in order)."""
        h = hashlib.sha256()
        for request in self.requests:
            h.update(request.req_id.encode())
            for key in request.keys:
                h.update(key)
        return h.hexdigest()[:16]


def _key(seed: int, name: str) -> bytes:
    return hashlib.sha256(f"kvcheck-offload-bench:{seed}:{name}".encode()).digest() + \
        (0).to_bytes(4, "big")


def make_offload_workload(policy: str, seed: int = 0, scale: float = 1.0,
                          tier_fraction: float = DEFAULT_TIER_FRACTION) -> OffloadWorkload:
    """The seeded request stream of the module doc, ``400 * scale`` requests (at least one).
    The keys depend on ``seed`` and ``scale`` only; the tier holds ``tier_fraction`` of the
    distinct keys, and always room for one request's keys and one offer.

    Raises:
        KVCheckInputError: an unknown policy, a negative seed, ``scale <= 0`` or a
            ``tier_fraction`` outside (0, 1].
    """
    if policy not in POLICIES:
        raise KVCheckInputError(f"unknown cache policy {policy!r}; use one of "
                                f"{', '.join(POLICIES)}")
    if not 0.0 < tier_fraction <= 1.0:
        raise KVCheckInputError(f"tier_fraction must lie in (0, 1], got {tier_fraction}")
    draws = Draws(seed, "offload_bench")
    num_requests = scaled_count(_REQUESTS_AT_SCALE_1, scale)
    lengths = draws.ints(*_DOCUMENT_BLOCKS, _DOCUMENTS)
    weights = [max(1, 1000 // (d + 1)) for d in range(_DOCUMENTS)]
    documents = [[_key(seed, f"d{d}/{i}") for i in range(n)] for d, n in enumerate(lengths)]
    requests = []
    for number in range(num_requests):
        d = draws.weighted(weights)
        shared = draws.int(max(1, lengths[d] // 2), lengths[d])
        own = draws.int(*_OWN_BLOCKS)
        keys = (*documents[d][:shared], *(_key(seed, f"r{number}/{j}") for j in range(own)))
        requests.append(OffloadRequest(
            f"req-{number:06d}", keys,
            {key: (i + 1) * _BLOCK_TOKENS for i, key in enumerate(keys)}))
    working_set = len({key for r in requests for key in r.keys})
    longest = max(len(r.keys) for r in requests)
    num_chunks = max(round(working_set * tier_fraction), longest + STORE_CHUNK)
    return OffloadWorkload("lru" if policy == "lru" else "arc", seed, scale, tier_fraction,
                           tuple(requests), working_set, num_chunks)


@dataclass(frozen=True)
class OffloadRound:
    """One replay: what the tier answered (counts) and the time inside its calls (ns, on-CPU
    corrected). ``evict_ns`` is the part of ``store_ns`` spent in the ``prepare_store`` calls
    that evicted."""

    lookups: int
    hits: int
    offers: int
    refused: int
    stored: int
    evicted: int
    events: int
    calls: int
    lookup_ns: int
    store_ns: int
    evict_ns: int
    total_ns: int

    def work(self) -> dict[str, int]:
        """The counts (what a second side doing the same work must match)."""
        return {"lookups": self.lookups, "hits": self.hits, "offers": self.offers,
                "refused": self.refused, "stored": self.stored, "evicted": self.evicted,
                "events": self.events, "calls": self.calls}


def replay(tier: OffloadingManagerAdapter, workload: OffloadWorkload, *,
           clock: Callable[[], int] = time.perf_counter_ns,
           cpu_clock: Callable[[], int] = time.thread_time_ns) -> OffloadRound:
    """Drive ``tier`` through ``workload`` (the calls of the module doc), timing each call with
    ``clock`` (nanoseconds); ``cpu_clock``: the thread's CPU time (nanoseconds), which scales
    the times down by the share of the core the thread had (another process had the rest).

    A ``prepare_store`` answered None (no room) counts as refused; the offer's keys are not
    stored.
    """
    lookup, prepare_store, complete_store = tier.lookup, tier.prepare_store, tier.complete_store
    chunk = workload.store_chunk
    lookups = hits = offers = refused = stored = evicted = events = calls = 0
    lookup_ns = store_ns = evict_ns = other_ns = 0
    wall0, cpu0 = clock(), cpu_clock()
    for request in workload.requests:
        rid, keys = request.req_id, request.keys
        start = clock()
        tier.on_new_request(rid)
        tier.set_key_positions(rid, request.positions)
        other_ns += clock() - start
        found = 0
        for key in keys:
            start = clock()
            answer = lookup(key, rid)
            lookup_ns += clock() - start
            lookups += 1
            if answer != "HIT":
                break
            found += 1
        loaded = keys[:found]
        if found:
            start = clock()
            tier.prepare_load(loaded, rid)
            other_ns += clock() - start
        for first in range(found, len(keys), chunk):
            start = clock()
            out = prepare_store(keys[first:first + chunk], rid)
            took = clock() - start
            store_ns += took
            offers += 1
            if out is None:
                refused += 1
                continue
            gone, new = out["evicted_keys"], out["keys_to_store"]
            if gone:
                evicted += len(gone)
                evict_ns += took
            if new:
                start = clock()
                complete_store(new, rid)
                store_ns += clock() - start
                stored += len(new)
                calls += 1
        start = clock()
        if found:
            tier.complete_load(loaded, rid)
        tier.on_request_finished(rid)
        events += len(tier.take_events())
        other_ns += clock() - start
        hits += found
        calls += 4 + (2 if found else 0)
    calls += lookups + offers
    cpu_ns, wall_ns = cpu_clock() - cpu0, clock() - wall0
    share = cpu_ns / wall_ns if 0 < cpu_ns < wall_ns else 1.0  # another process had the core
    return OffloadRound(lookups, hits, offers, refused, stored, evicted, events, calls,
                        round(lookup_ns * share), round(store_ns * share),
                        round(evict_ns * share),
                        round((lookup_ns + store_ns + other_ns) * share))


def _rate(count: int, ns: int) -> float:
    """``count`` per second of ``ns``; 0 when nothing was done (no eviction in a round)."""
    return per_s(count, ns / 1e9) if count and ns > 0 else 0.0


class OffloadBench(RoundBench[OffloadRound]):
    """One replay of ``workload`` per round, on a fresh tier of ``impl`` (its own object),
    timed with ``clock`` and ``cpu_clock`` (``replay``'s; a test passes clocks that count
    calls, so two sides doing the same work measure the same)."""

    def __init__(self, impl: ImplHandle, workload: OffloadWorkload, *,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 cpu_clock: Callable[[], int] = time.thread_time_ns) -> None:
        super().__init__()
        self.impl = impl
        self.workload = workload
        self._clocks = clock, cpu_clock

    def setup(self) -> SetupArgs:
        gc.collect()
        return (self.impl.make_offloading_manager(self.workload.spec()).raw,), {}

    def run(self, tier: OffloadingManagerAdapter) -> None:
        clock, cpu_clock = self._clocks
        result = replay(tier, self.workload, clock=clock, cpu_clock=cpu_clock)
        self.results.append(result)
        self.advance(result.total_ns / 1e9)

    def info(self) -> dict[str, object]:
        w = self.workload
        info: dict[str, object] = {
            "policy": w.policy, "seed": w.seed, "scale": w.scale, "digest": w.digest(),
            "requests": len(w.requests), "keys": w.num_keys, "working_set": w.working_set,
            "num_chunks": w.num_chunks, "tier_fraction": w.tier_fraction,
            "store_chunk": w.store_chunk}
        if self.results:
            info["produced"] = self.results[0].work()
        return info

    def metrics(self, results: list[OffloadRound]) -> list[Metric]:
        return [
            per_round("lookups_per_s", "lookups/s", "higher_is_better",
                      [_rate(r.lookups, r.lookup_ns) for r in results]),
            per_round("stores_per_s", "keys/s", "higher_is_better",
                      [_rate(r.stored, r.store_ns) for r in results]),
            per_round("evictions_per_s", "keys/s", "higher_is_better",
                      [_rate(r.evicted, r.evict_ns) for r in results]),
            per_round("calls_per_s", "calls/s", "higher_is_better",
                      [_rate(r.calls, r.total_ns) for r in results]),
        ]


# ----------------------------------------------------------------------------- command line
def _fmt_ratio(r: PairedRatio | None) -> str:
    if r is None:
        return "-"
    return f"{r.ratio:6.3f} [{r.ci_low:5.3f}, {r.ci_high:5.3f}]"


def _measure(impl: ImplHandle, reference: ImplHandle, workload: OffloadWorkload, rounds: int,
             warmup: int) -> tuple[list[Metric], OffloadBench, OffloadBench]:
    from kvcheck.bench.measure.paired import PairedBench

    mine, theirs = OffloadBench(impl, workload), OffloadBench(reference, workload)
    pair = PairedBench(mine, theirs)
    pair.measure(rounds, warmup)
    metrics, _ = pair.metrics(warmup)
    return metrics, mine, theirs


def _print_policy(impl_name: str, workload: OffloadWorkload, metrics: list[Metric],
                  mine: OffloadBench, theirs: OffloadBench, rounds: int, warmup: int) -> None:
    w = workload
    print(f"\noffload tier, policy {w.policy}: {len(w.requests):,} requests, {w.num_keys:,} "
          f"keys ({w.working_set:,} distinct), a tier of {w.num_chunks:,} chunks, offers of "
          f"{w.store_chunk}; seed {w.seed}, scale {w.scale:g}; {rounds} timed pairs "
          f"(A B B A) after {warmup} warm-up")
    work, ref_work = mine.results[0].work(), theirs.results[0].work()
    print(f"per round: {work['lookups']:,} lookups ({work['hits']:,} HIT), {work['stored']:,} "
          f"keys stored in {work['offers']:,} offers ({work['refused']:,} refused), "
          f"{work['evicted']:,} evicted, {work['calls']:,} calls")
    if work != ref_work:
        diff = ", ".join(f"{k} {work[k]:,} against {ref_work[k]:,}" for k in work
                         if work[k] != ref_work[k])
        print(f"note: {impl_name} answered differently from the reference ({diff}): each "
              "side's figures count its own work; run the offload area to see which answer "
              "is wrong")
    a_name, b_name = ((f"{impl_name} A", "reference B") if impl_name == "reference" else
                      (impl_name, "reference"))
    print(f"{'figure':18s} {a_name + ' (median)':>22s} {b_name + ' (median)':>22s}   "
          f"{a_name} / {b_name} [interval]")
    for metric in metrics:
        ref = metric.reference_value
        print(f"{metric.name:18s} {metric.value:>22,.0f} "
              f"{'-' if ref is None else f'{ref:,.0f}':>22s}   {_fmt_ratio(metric.paired)}")
    paired = next((m.paired for m in metrics if m.paired is not None), None)
    if paired is not None:
        print(f"median of {paired.pairs} paired ratios, interval at {paired.confidence:.1%} "
              f"coverage; above 1: {a_name} is faster", flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import float_in, names_in
    from kvcheck.bench.options import (
        add_impl_option,
        add_rounds_option,
        add_scale_option,
        add_seed_option,
        add_warmup_option,
    )

    add = parser.add_argument
    add_impl_option(add, note="an A/A run; it declares capability 'offload'")
    add("--policy", type=names_in(POLICIES, "cache policy"), default=list(POLICIES),
        help="cache policies to time, comma-separated (default: lru,arc)")
    add_rounds_option(add, default=9, per="policy")
    add_warmup_option(add, default=1, per="policy")
    add_scale_option(add, note="400 requests")
    add_seed_option(add)
    add("--tier-fraction", type=float_in(
        0.0, 1.0, "the tier's share of the stream's distinct keys", "--tier-fraction 0.25",
        low_open=True), default=DEFAULT_TIER_FRACTION,
        help="the tier's size as a share of the distinct keys (default 0.25: it evicts)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (2: a bad argument or an implementation without an offload
    tier, named on one line; or no policy measured)."""
    from kvcheck.conformance.loader import load_impl
    from kvcheck.conformance.protocol import UnsupportedSpec

    impl = load_impl(args.impl, call_timeout=None)
    reference = load_impl("reference", call_timeout=None)
    if not impl.has("offload"):
        print(f"{parser.prog}: error: --impl {args.impl}: {impl.name} does not declare "
              "capability 'offload' (IMPL_INFO.capabilities); Fix: name a module that defines "
              "make_offloading_manager(spec) (kvcheck.conformance.offload_protocol)",
              file=sys.stderr)
        return 2
    measured = 0
    for policy in args.policy:
        workload = make_offload_workload(policy, args.seed, args.scale, args.tier_fraction)
        declined = None
        for side in (impl, reference):
            try:
                side.make_offloading_manager(workload.spec())
            except UnsupportedSpec as exc:
                declined = f"{side.name} declines it ({exc})"
                break
        if declined is not None:
            print(f"\npolicy {policy}: not measured: {declined}")
            continue
        start = time.perf_counter()
        metrics, mine, theirs = _measure(impl, reference, workload, args.rounds, args.warmup)
        _print_policy(impl.name, workload, metrics, mine, theirs, args.rounds, args.warmup)
        print(f"policy {policy}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
        measured += 1
    return 0 if measured else 2


TOOL = BenchTool("offload", "kvcheck.bench.offload_bench", __doc__.split("\n\n")[0],
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.offload_bench``: the same as ``kvcheck bench offload``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    raise SystemExit(main())
