"""``kvcheck events serve``, ``capture`` and ``check``: the reference's KV events published as
vLLM publishes them (``kvcheck.events.serve``; any implementation's over a workload:
``kvcheck bench event-serve``, which shares the options and ``run_serve``), and a
live stream captured to a file and checked against the stream's own laws
(``kvcheck.events.stream_check``).

    kvcheck events serve --endpoint 'tcp://*:5557' --replay-endpoint 'tcp://*:5558' --drop 5
    kvcheck events capture tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558 \
        -o s.kvcap
    kvcheck events check s.kvcap --format vllm-0.33
    kvcheck events check tcp://127.0.0.1:5557 --format vllm-0.33 --count 500

Exit codes: 0 every law holds (serve: all published), 1 a law is broken (the findings name
message, seq, event, field and rule), 2 unusable input (an endpoint, a capture file,
``kvcheck[events]`` missing).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from kvcheck.events.sources import BatchSource

__all__ = ["add_events_parser", "add_serve_options", "run_serve"]

_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
_RELEASES = ("vllm-0.33", "vllm-0.10")


def _fail(command: str, message: object) -> int:
    print(f"kvcheck events {command}: {message}", file=sys.stderr)
    return 2


def _events_missing(command: str, error: ImportError) -> int:
    return _fail(command, f"needs the events extra ({error.name or error}): pip install "
                          "'kvcheck[events]'")


class _CaptureArgs(TypedDict):
    """The options ``kvcheck.events.capture.capture`` takes from the command line."""

    replay_endpoint: str | None
    topic: str
    count: int | None
    idle_s: float
    duration_s: float | None
    bind: bool


def _capture_args(args: argparse.Namespace) -> _CaptureArgs:
    return {"replay_endpoint": args.replay_endpoint, "topic": args.topic,
            "count": args.count, "idle_s": args.idle, "duration_s": args.duration,
            "bind": args.bind}


def _cmd_capture(args: argparse.Namespace) -> int:
    try:
        from kvcheck.events.capture import capture, write_capture
        from kvcheck.events.errors import StreamError
    except ImportError as error:
        return _events_missing("capture", error)
    from kvcheck.results.io import OutputPathError, check_output_path

    try:
        check_output_path(args.output, "-o", example="stream.kvcap")
        cap = capture(args.endpoint, **_capture_args(args))
        write_capture(args.output, cap)
    except (StreamError, OutputPathError) as error:
        return _fail("capture", error)
    replayed = cap.sources.count("replay")
    print(f"kvcheck events capture: {len(cap.messages)} messages ({replayed} replayed, "
          f"{len(cap.messages) - replayed} live; {cap.overlap_dropped} live copies of replayed "
          f"batches dropped) from {args.endpoint} -> {args.output}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        from kvcheck.events.capture import capture, read_capture
        from kvcheck.events.errors import StreamError
        from kvcheck.events.stream_check import check_stream
    except ImportError as error:
        return _events_missing("check", error)

    live = args.source.startswith(_ENDPOINT_SCHEMES)
    try:
        cap = (capture(args.source, **_capture_args(args)) if live
               else read_capture(args.source))
    except StreamError as error:
        return _fail("check", error)
    if not cap.messages:
        return _fail("check", f"{args.source}: no message to check (nothing was published "
                              "within --idle, or an empty capture): no verdict")
    int_hashes = {"int": True, "bytes": False, "any": None}[args.hashes]
    report = check_stream(cap.messages, args.format, sources=cap.sources, int_hashes=int_hashes,
                          data_parallel_rank=args.dp_rank)
    sys.stdout.write(report.render(args.source))
    return 0 if report.ok else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from kvcheck.events.sources import reference_source
    except ImportError as error:
        return _events_missing("serve", error)
    source = reference_source(args.format, args.seed, int_hashes=args.hashes != "bytes",
                              data_parallel_rank=args.dp_rank)
    return run_serve(args, source, f"the reference's random engine, {args.hashes or 'int'} "
                                   f"hashes, seed {args.seed}", batches=args.batches or 200)


def run_serve(args: argparse.Namespace, source: BatchSource, described: str, *,
              batches: int | None, command: str = "kvcheck events serve") -> int:
    """Publish ``source``'s batches (``kvcheck.events.sources.BatchSource``) with the
    options of ``add_serve_options``; ``batches`` None: all the source has. Also the body of
    ``kvcheck bench event-serve`` (an implementation's events over a workload).
    Returns the exit status (2: unusable input, named on stderr)."""
    try:
        from kvcheck.events.errors import StreamError
        from kvcheck.events.publisher import EventPublisher
        from kvcheck.events.serve import Faults, serve
    except ImportError as error:
        return _events_missing("serve", error)
    from kvcheck.errors import KVCheckError

    def fail(message: object) -> int:
        print(f"{command}: {message}", file=sys.stderr)
        return 2

    faults = Faults(drop=frozenset(args.drop), duplicate=frozenset(args.duplicate),
                    restart_at=args.restart_at, flood_from=args.flood_from)
    if batches is not None and faults.named() and max(faults.named()) >= batches:
        return fail(f"a fault names batch {max(faults.named())}, but only {batches} are "
                    "published (numbered from 0): raise --batches")
    try:
        publisher = EventPublisher(args.endpoint, replay_endpoint=args.replay_endpoint,
                                   buffer_steps=args.buffer_steps, hwm=args.hwm,
                                   topic=args.topic, data_parallel_rank=args.dp_rank,
                                   release=args.format)
    except StreamError as error:
        return fail(error)
    with publisher:
        replay = (f", replay on {publisher.replay_endpoint}" if args.replay_endpoint else "")
        # Subscribers connect first: a PUB socket drops what nobody hears.
        wanted = args.subscribers
        wait = (DEFAULT_SUBSCRIBERS_WAIT_S if wanted else DEFAULT_WAIT_S) \
            if args.wait is None else args.wait
        when = (f"when {wanted} subscriber(s) connected (at most {wait:g} s)" if wanted
                else f"in {wait:g} s")
        print(f"{command}: {args.format} on {publisher.endpoint}{replay}; first batch {when}",
              flush=True)
        if not wanted:
            time.sleep(wait)
        elif (connected := publisher.wait_for_subscribers(wanted, wait)) < wanted:
            print(f"{command}: only {connected} of {wanted} subscriber(s) connected in "
                  f"{wait:g} s (--wait); publishing anyway", file=sys.stderr, flush=True)
        try:
            summary = serve(publisher, release=args.format, batches=batches,
                            data_parallel_rank=args.dp_rank, interval_s=args.interval,
                            faults=faults, source=source)
        except KVCheckError as error:  # an implementation's events that cannot be served
            return fail(error)
        print(f"{command}: {summary.batches} batches, {summary.events} events ({described}), "
              f"{summary.sent} messages sent; faults: {faults.describe()}", flush=True)
        unmet = sorted(n for n in faults.named() if n >= summary.batches)
        if unmet:
            return fail(f"the workload had only {summary.batches} batches with events, so "
                        f"the fault at batch {unmet[0]} never happened: name an earlier batch")
        # Late subscribers can still replay; Ctrl-C (SIGINT) ends the linger early.
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.linger)
    return 0


def add_events_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``events`` (with ``capture`` and ``check``) to the ``kvcheck`` subparsers."""
    events = sub.add_parser(
        "events", help="capture and check a live KV-event stream (ZMQ, vLLM's framing)",
        description="KV events on the wire (docs/events.md): capture a publisher's stream, "
                    "check its laws.")
    commands = events.add_subparsers(dest="events_command", required=True, metavar="COMMAND")

    def stream_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--replay-endpoint", metavar="ENDPOINT",
                            help="the publisher's replay ROUTER endpoint: first replay every "
                                 "buffered batch from seq 0 (vLLM's replay_endpoint)")
        parser.add_argument("--topic", default="", help="topic prefix to subscribe to "
                            "(default: everything, vLLM's default topic is \"\")")
        parser.add_argument("--count", type=_positive_int, metavar="N",
                            help="stop after N messages")
        parser.add_argument("--idle", type=_positive_float, default=2.0, metavar="S",
                            help="stop when no message came for S seconds (default 2)")
        parser.add_argument("--duration", type=_positive_float, metavar="S",
                            help="stop after S seconds in all")
        parser.add_argument("--bind", action="store_true",
                            help="bind ENDPOINT instead of connecting (for a publisher that "
                                 "connects: vLLM's does for tcp://host:port without '*')")

    cap = commands.add_parser(
        "capture", help="subscribe to a publisher and write its messages to a file",
        description="Subscribe to ENDPOINT (and replay from seq 0 when --replay-endpoint is "
                    "given) and write every message, frames as received, to FILE.")
    cap.add_argument("endpoint", metavar="ENDPOINT", help="the PUB endpoint, e.g. "
                     "tcp://127.0.0.1:5557")
    cap.add_argument("-o", "--output", required=True, metavar="FILE",
                     help="the capture file to write (atomically)")
    stream_options(cap)
    cap.set_defaults(func=_cmd_capture)

    srv = commands.add_parser(
        "serve", help="publish the reference engine's KV events as vLLM does, with faults",
        description="Run the reference manager's seeded random workload on one engine and "
                    "publish one batch per scheduler step with vLLM's frames, sequence "
                    "numbers and replay socket: a stream to point a router's consumer at. "
                    "Fault options name batch numbers (from 0).")
    add_serve_options(srv, hashes_help="the hash form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES; "
                      "default int)", batches_help="how many batches to publish (default 200)")
    srv.set_defaults(func=_cmd_serve)

    check = commands.add_parser(
        "check", help="check a captured or live stream against the stream's laws",
        description="Decode every message of a capture file (or of a live ENDPOINT) in the "
                    "release's wire format and check the stream's laws: frames, sequence "
                    "(gaps, restarts, duplicates), payloads, rank, removals and parents "
                    "against the rebuilt index, token counts, group metadata.")
    check.add_argument("source", metavar="FILE|ENDPOINT",
                       help="a capture file, or an endpoint (tcp://, ipc://, inproc://) to "
                            "capture from first")
    check.add_argument("--format", required=True, choices=_RELEASES,
                       help="the release whose wire format the stream is in")
    check.add_argument("--hashes", choices=("any", "int", "bytes"), default="any",
                       help="require the int form (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, "
                            "vLLM's default) or the bytes form; any: the first batch's form")
    check.add_argument("--dp-rank", type=int, metavar="N",
                       help="the data_parallel_rank every batch must carry (default: the "
                            "first batch's)")
    stream_options(check)
    check.set_defaults(func=_cmd_check)


#: ``--wait``'s defaults: a fixed pause, or the most to wait for ``--subscribers``.
DEFAULT_WAIT_S = 1.0
DEFAULT_SUBSCRIBERS_WAIT_S = 60.0


def add_serve_options(parser: argparse.ArgumentParser, *, hashes_help: str,
                      batches_help: str) -> None:
    """The publisher, format and fault options of ``kvcheck events serve`` (shared with
    ``kvcheck bench event-serve``)."""
    parser.add_argument("--endpoint", default="tcp://*:5557",
                        help="the PUB endpoint (vLLM's default tcp://*:5557; bound for '*', "
                             "'::', ipc:// and inproc://, connected otherwise, as vLLM does)")
    parser.add_argument("--replay-endpoint", metavar="ENDPOINT",
                        help="the replay ROUTER endpoint, bound (vLLM's replay_endpoint)")
    parser.add_argument("--format", choices=_RELEASES, default="vllm-0.33",
                        help="the release whose wire format to publish (default vllm-0.33)")
    parser.add_argument("--hashes", choices=("int", "bytes"), help=hashes_help)
    parser.add_argument("--batches", type=_positive_int, metavar="N", help=batches_help)
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0)")
    parser.add_argument("--topic", default="", help="the topic frame (vLLM's default \"\")")
    parser.add_argument("--dp-rank", type=int, default=0, metavar="N",
                        help="the data_parallel_rank in every batch; as vLLM, both ports are "
                             "offset by it (default 0)")
    parser.add_argument("--buffer-steps", type=_positive_int, default=10_000, metavar="N",
                        help="batches kept for replay (vLLM's default 10000; a small value "
                             "makes a replay from 0 start later, silently, as vLLM's does)")
    parser.add_argument("--hwm", type=_positive_int, default=100_000, metavar="N",
                        help="the PUB send high-water mark (vLLM's default 100000)")
    parser.add_argument("--interval", type=_non_negative_float, default=0.0, metavar="S",
                        help="seconds between batches (default 0)")
    parser.add_argument("--wait", type=_non_negative_float, metavar="S",
                        help=f"seconds before the first batch, for subscribers to connect "
                             f"(default {DEFAULT_WAIT_S:g}); with --subscribers, the most to "
                             f"wait for them (default {DEFAULT_SUBSCRIBERS_WAIT_S:g})")
    parser.add_argument("--subscribers", type=_positive_int, metavar="N",
                        help="start publishing as soon as N subscribers are connected (each "
                             "one's ZMTP handshake done), not after a fixed --wait: no batch "
                             "is lost to a consumer that starts slowly")
    parser.add_argument("--linger", type=_non_negative_float, default=0.0, metavar="S",
                        help="seconds to keep answering replay requests after the last batch "
                             "(Ctrl-C ends it early)")
    parser.add_argument("--drop", type=_batch_number, action="append", default=[],
                        metavar="BATCH", help="fault: buffer this batch for replay but never "
                        "send it live (a sequence gap, as past the high-water mark); repeatable")
    parser.add_argument("--duplicate", type=_batch_number, action="append", default=[],
                        metavar="BATCH", help="fault: send this batch twice; repeatable")
    parser.add_argument("--restart-at", type=_batch_number, metavar="BATCH",
                        help="fault: from this batch on, a new engine process (an empty cache, "
                             "sequence numbers from 0, an empty replay buffer)")
    parser.add_argument("--flood-from", type=_batch_number, metavar="BATCH",
                        help="fault: from this batch on, no --interval pause: a subscriber "
                             "slower than the flood passes the high-water mark (--hwm) and ZMQ "
                             "drops batches for it, silently (sequence gaps)")


def _int_at_least(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value}: {what} must be at least {minimum}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "an integer")


def _batch_number(text: str) -> int:
    return _int_at_least(text, 0, "a batch number")


def _seconds(text: str, *, zero_ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        kind = "non-negative" if zero_ok else "positive"
        raise argparse.ArgumentTypeError(f"{text} must be a {kind}, finite number of "
                                         "seconds")
    return value


def _positive_float(text: str) -> float:
    return _seconds(text, zero_ok=False)


def _non_negative_float(text: str) -> float:
    return _seconds(text, zero_ok=True)
