"""kvcheck's event codec against vLLM's own, on the same batches: paired, interleaved ratios.

    kvcheck bench event-codec [--batches N] [--pairs P] [--seed S]

Needs vLLM installed (CI's vLLM stages; ``scripts/vllm-cpu-env.sh``). The batches are the
reference's (``kvcheck.events.workload.random_batches``) in the installed release's form, in
both hash forms. Four figures, each the median of per-pair time ratios kvcheck / vLLM
(below 1: kvcheck is faster) with a 95% interval (``kvcheck.bench.measure.paired``), the two sides
of a pair run back to back in the order A B B A A B ..., the collector off:

* ``decode``: ``decode_batch(payload)`` (validating: one hash form, u64 ints, digest widths,
  ``group_idx >= 0``) against vLLM's ``msgspec.msgpack.Decoder(KVEventBatch).decode``
  (which validates none of that);
* ``encode``: ``encode_batch(reference events)`` against vLLM's publisher step,
  ``Encoder.encode(KVEventBatch(events))`` of vLLM's structs (already built: vLLM's block
  pool builds them as it caches, so this side is the encoder alone);
* ``encode+build``: the same, with vLLM's side also building its structs from the events
  (what a port of vLLM's event path pays);
* ``publish rate``: batches per second ``EventPublisher`` would have to encode to keep up with
  the reference engine's own rate on the same steps: the reference's time per step (the
  scheduler calls that made the batch) over ``encode_batch``'s time per batch.

Exit 0 after printing the table; 2 when vLLM is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

import msgspec

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.timing import collector_off
from kvcheck.events.codec import decode_batch, encode_batch

if TYPE_CHECKING:
    from kvcheck.bench.measure.metrics import PairedRatio
    from kvcheck.events.codec import GroupMetadata, Release
    from kvcheck.events.workload import StepBatch

__all__ = ["main", "measure"]

_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"


def _timed(fn: Callable[[], object]) -> float:
    with collector_off():
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start


def _paired(mine: Callable[[], object], theirs: Callable[[], object], pairs: int
            ) -> PairedRatio | None:
    from kvcheck.bench.measure.paired import abba_first, paired_ratio

    a: list[float] = []
    b: list[float] = []
    mine()
    theirs()  # warm both
    for i in range(pairs):
        if abba_first(i) == "impl":
            a.append(_timed(mine))
            b.append(_timed(theirs))
        else:
            b.append(_timed(theirs))
            a.append(_timed(mine))
    return paired_ratio(a, b)


def _figures(kv: ModuleType, release: Release, steps: list[StepBatch], int_hashes: bool,
             pairs: int) -> list[tuple[str, str, PairedRatio | None]]:
    """The three paired figures of one hash form (vLLM's environment variable already set)."""
    from kvcheck.events.crosscheck import vllm_event

    form = "int" if int_hashes else "bytes"

    def meta(step: StepBatch) -> GroupMetadata | None:
        return step.group_metadata if release == "vllm-0.33" else None

    payloads = [encode_batch(s.events, ts=1.0, release=release, int_hashes=int_hashes,
                             group_metadata=meta(s)) for s in steps]
    structs = [[vllm_event(e, release, s.group_metadata) for e in s.events] for s in steps]
    decoder = msgspec.msgpack.Decoder(kv.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()

    def ours_decode() -> None:
        for p in payloads:
            decode_batch(p, release)

    def vllm_decode() -> None:
        for p in payloads:
            decoder.decode(p)

    def ours_encode() -> None:
        for s in steps:
            encode_batch(s.events, ts=1.0, release=release, int_hashes=int_hashes,
                         group_metadata=meta(s))

    def vllm_encode() -> None:
        for events in structs:
            encoder.encode(kv.KVEventBatch(ts=1.0, events=events))

    def vllm_build_encode() -> None:
        for s in steps:
            events = [vllm_event(e, release, s.group_metadata) for e in s.events]
            encoder.encode(kv.KVEventBatch(ts=1.0, events=events))

    return [("decode", form, _paired(ours_decode, vllm_decode, pairs)),
            ("encode", form, _paired(ours_encode, vllm_encode, pairs)),
            ("encode+build", form, _paired(ours_encode, vllm_build_encode, pairs))]


def measure(batches: int, pairs: int, seed: int) -> list[tuple[str, str, PairedRatio | None]]:
    """``(figure, hash form, PairedRatio)`` rows (see the module doc)."""
    from vllm.distributed import kv_events as kv

    from kvcheck.events.crosscheck import installed_release
    from kvcheck.events.workload import random_batches

    release, _ = installed_release()
    steps = list(random_batches(release, seed, batches))
    rows = []
    for int_hashes in (True, False):
        os.environ[_ENV] = "1" if int_hashes else "0"
        rows.extend(_figures(kv, release, steps, int_hashes, pairs))
    return rows


def _engine_rate(batches: int, seed: int) -> tuple[float, float]:
    """(reference steps per second with events on, encode_batch batches per second), on the
    same steps."""
    from kvcheck.events.workload import random_batches

    start = time.perf_counter()
    steps = list(random_batches("vllm-0.33", seed, batches))
    engine = time.perf_counter() - start
    encode = _timed(lambda: [encode_batch(s.events, ts=1.0, group_metadata=s.group_metadata)
                             for s in steps])
    return len(steps) / engine, len(steps) / encode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvcheck.bench.cli_args import int_in
    from kvcheck.bench.options import add_rounds_option, add_seed_option

    add = parser.add_argument
    add("--batches", type=int_in(1, 1_000_000, "batches per round", "--batches 2000"),
        default=2000, metavar="N", help="batches per round (default 2000)")
    add_rounds_option(add, default=12, per="figure", name="pairs", low=2)
    add_seed_option(add)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (2: no vLLM to compare with)."""
    try:
        rows = measure(args.batches, args.pairs, args.seed)
    except ImportError as error:
        print(f"{parser.prog}: needs vLLM installed ({error})", file=sys.stderr)
        return 2
    print(f"kvcheck / vLLM time per {args.batches} batches, median of {args.pairs} "
          "interleaved pairs (below 1: kvcheck faster)")
    for figure, form, ratio in rows:
        assert ratio is not None  # None only when every reference time is 0 (no real work)
        print(f"  {figure:13} {form:5} {ratio.ratio:6.3f}  "
              f"[{ratio.ci_low:.3f}, {ratio.ci_high:.3f}] at {ratio.confidence:.0%}")
    engine, encode = _engine_rate(args.batches, args.seed)
    print(f"  publish rate: the reference makes {engine:,.0f} steps/s with events on; "
          f"encode_batch encodes {encode:,.0f} batches/s ({encode / engine:.0f}x headroom)")
    return 0


TOOL = BenchTool("event-codec", "kvcheck.bench.event_codec", __doc__.split("\n\n")[0],
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.event_codec``: the same as ``kvcheck bench event-codec``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    sys.exit(main())
