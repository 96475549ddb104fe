"""``kvcheck bench event-serve``: any implementation's KV events over a workload,
published as vLLM's ``ZmqEventPublisher`` publishes them (``kvcheck events serve``'s
publisher, options and faults; that command serves the reference's own random engine).

    kvcheck bench event-serve --workload eviction_pressure --kv-impl my.adapter
    kvcheck bench event-serve --workload trace:prod.jsonl --replay-endpoint 'tcp://*:5558'
    kvcheck bench event-serve --workload trace:corpus.cbor.xz --trace t07-mixed-bs2-events

The workload is a built-in scenario or a request trace run through kvcheck's scheduler loop
(``bench.replay.scheduler.iter_steps``, as ``--kv-bench-workload``), or one trace of a recorded
corpus replayed op by op (``bench.replay.recorded.iter_ops``) on its recorded pool. After every step
(every op) the implementation's events are drained; a step with events is one batch (vLLM's
scheduler publishes nothing for a step without). It lives in ``bench`` because the workloads
and the scheduler loop do: the layering keeps the plugin (``kvcheck``'s CLI) below ``bench``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from kvcheck.bench.cli_args import BenchTool, run_tool
from kvcheck.bench.measure.allocator import workload_spec
from kvcheck.bench.replay.recorded import (
    RecordedRun,
    decode_trace,
    iter_ops,
    lean_replay_problem,
    missing_capabilities,
)
from kvcheck.bench.replay.scheduler import iter_steps
from kvcheck.bench.workload.source import RecordedWorkload, WorkloadSource, resolve_workload
from kvcheck.conformance.loader import ImplHandle, load_impl
from kvcheck.conformance.pinning import declares_pinning
from kvcheck.conformance.protocol import KVCacheSpec, ManagerWithCapabilities
from kvcheck.errors import KVCheckError, KVCheckInputError
from kvcheck.events.codec import Release
from kvcheck.events.sources import BatchSource, SourceBatch, encoded_events, with_rank
from kvcheck.plugin.events_cli import add_serve_options, run_serve

__all__ = ["impl_source", "main", "wire_route"]



def wire_route(impl: ImplHandle, int_hashes: bool | None) -> bool | None:
    """How ``impl``'s events reach the wire: None, its own ``take_event_batch`` bytes; True
    or False, its ``take_events()`` dicts encoded by kvcheck in that hash form (asked for, or
    int, vLLM's default, when it declares only ``events``).

    Raises:
        KVCheckInputError: it declares neither capability, or a hash form was asked for and
            it has no ``take_events`` to encode.
    """
    if int_hashes is not None:
        if not impl.has("events"):
            raise KVCheckInputError(
                f"{impl.name} does not declare 'events' (take_events), which --hashes "
                "encodes: drop --hashes to serve its own take_event_batch bytes")
        return int_hashes
    if impl.has("event_wire"):
        return None
    if impl.has("events"):
        return True
    raise KVCheckInputError(f"{impl.name} declares neither 'event_wire' nor 'events': it has "
                            "no KV events to serve (declare one, see "
                            "docs/writing-an-adapter.md)")


#: ``steps(manager)``: drives one manager through the workload, yielding after each step
#: (``iter_steps``) or op (``iter_ops``); what it yields is not read.
_Steps = Callable[[ManagerWithCapabilities], Iterator[object]]


def impl_source(impl: ImplHandle, workload: WorkloadSource, *, release: Release,
                int_hashes: bool | None, data_parallel_rank: int | None,
                trace: str | None = None) -> BatchSource:
    """``impl``'s events (a loaded ``--kv-impl``, ``kvcheck.conformance.loader.ImplHandle``)
    over ``workload`` (``kvcheck.bench.workload.source.resolve_workload``'s answer): a
    scheduled ``Workload`` on the pool it names, or one recorded trace (``trace``, default
    the corpus's first) replayed op by op on its recorded pool. ``int_hashes`` as
    ``wire_route`` takes it.

    Raises:
        KVCheckInputError: as ``wire_route``; a trace name the corpus lacks, a trace recorded
            under another release or one the implementation cannot run.
    """
    route = wire_route(impl, int_hashes)
    spec, steps = _plan(impl, workload, release, trace)

    def batches(engine: int) -> Iterator[SourceBatch]:
        del engine  # every engine replays the workload from its start on a fresh manager
        manager = impl.make_manager(spec)
        number = 0
        for _ in steps(manager):
            if route is None:
                batch = with_rank(manager.take_event_batch(float(number)), data_parallel_rank,
                                  release, number)
            else:
                batch = encoded_events(manager.take_events(), spec, ts=float(number),
                                       release=release, int_hashes=route,
                                       data_parallel_rank=data_parallel_rank, number=number)
            if batch.events:  # vLLM's scheduler publishes only a step that has events
                yield batch
                number += 1
    return batches


def _plan(impl: ImplHandle, workload: WorkloadSource, release: Release, trace: str | None
          ) -> tuple[KVCacheSpec, _Steps]:
    """The spec to build managers for and ``steps(manager)``, which drives one."""
    if not isinstance(workload, RecordedWorkload):
        if trace is not None:
            raise KVCheckInputError(f"--trace names a trace of a recorded corpus, but "
                                    f"{workload.scenario} is not one: drop --trace")
        spec = replace(workload_spec(workload), profile=release, enable_kv_cache_events=True)
        return spec, lambda manager: iter_steps(manager, workload,
                                                pinning=declares_pinning(impl))
    return _recorded_plan(impl, workload, release, trace)


def _recorded_plan(impl: ImplHandle, workload: RecordedWorkload, release: Release,
                   trace: str | None) -> tuple[KVCacheSpec, _Steps]:
    traces = workload.corpus["traces"]
    names = [t["name"] for t in traces]
    raw = traces[0] if trace is None else next((t for t in traces if t["name"] == trace), None)
    if raw is None:
        raise KVCheckInputError(f"{workload.scenario} has no trace {trace!r}: give one of "
                                f"{', '.join(names[:20])}{' ...' if len(names) > 20 else ''}")
    decoded = decode_trace(raw)
    if decoded.spec.profile != release:
        raise KVCheckInputError(
            f"trace {decoded.name} of {workload.scenario} was recorded under "
            f"{decoded.spec.profile}: serve it with --format {decoded.spec.profile}")
    missing = missing_capabilities(impl, raw, decoded.spec)
    if missing:
        raise KVCheckInputError(f"{impl.name} cannot replay trace {decoded.name}: it does not "
                                f"declare {sorted(missing)}")
    lean = lean_replay_problem(raw, decoded.spec)
    if lean:
        raise KVCheckInputError(f"trace {decoded.name} of {workload.scenario} is {lean}, "
                                "which the op-by-op replay does not model; give another "
                                "--trace")
    decoded = replace(decoded, spec=replace(decoded.spec, enable_kv_cache_events=True))
    return decoded.spec, lambda manager: iter_ops(impl, manager, decoded, RecordedRun())


def _source(args: argparse.Namespace) -> tuple[BatchSource, str]:
    impl = load_impl(args.kv_impl, call_timeout=None)
    workload = resolve_workload(args.workload, args.seed)
    int_hashes = None if args.hashes is None else args.hashes == "int"
    route = wire_route(impl, int_hashes)
    how = ("its own take_event_batch bytes" if route is None else
           f"its take_events encoded by kvcheck, {'int' if route else 'bytes'} hashes")
    trace = f" trace {args.trace}" if args.trace else ""
    source = impl_source(impl, workload, release=args.format, int_hashes=int_hashes,
                         data_parallel_rank=args.dp_rank, trace=args.trace)
    return source, f"{impl.name} on {args.workload}{trace}, {how}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, metavar="SCENARIO|trace:FILE",
                        help="a built-in scenario (as --kv-bench-workload), trace:FILE.jsonl "
                             "a request trace, trace:CORPUS.cbor.xz a recorded corpus")
    parser.add_argument("--kv-impl", default="reference", metavar="MODULE",
                        help="the implementation (default reference); it declares "
                             "event_wire (its own bytes are published) or events")
    parser.add_argument("--trace", metavar="NAME",
                        help="with a recorded corpus: the trace to replay (default the first)")
    add_serve_options(
        parser, hashes_help="encode the implementation's take_events() in this hash form "
        "(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) instead of publishing its own take_event_batch "
        "bytes (default: its bytes under event_wire, else int)",
        batches_help="publish at most N batches (default: all the workload's)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Returns the exit status (0 published, 2 unusable input)."""
    try:
        source, described = _source(args)
    except KVCheckError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        print(f"{parser.prog}: needs the events extra ({error.name or error}): pip install "
              "'kvcheck[events]'", file=sys.stderr)
        return 2
    return run_serve(args, source, described, batches=args.batches, command=parser.prog)


TOOL = BenchTool("event-serve", "kvcheck.bench.event_serve",
                 "Run a workload through an implementation and publish its KV events with "
                 "vLLM's frames, sequence numbers and replay socket (docs/events.md).",
                 add_arguments, run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvcheck.bench.event_serve``: the same as ``kvcheck bench event-serve``."""
    return run_tool(TOOL, argv)


if __name__ == "__main__":
    sys.exit(main())
