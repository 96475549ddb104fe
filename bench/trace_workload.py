"""Request traces from a file: the workload of ``--kv-bench-workload=trace:PATH``.

A trace file is JSON Lines: one JSON object per line, blank lines ignored. An optional first
line ``{"kvcheck_trace": 1, ...}`` sets how the trace is replayed; every other line is one
request, in arrival order, in one of three shapes (they may be mixed):

* **tokens**: ``{"prompt_token_ids": [...], "output_token_ids": [...]}`` (or
  ``"output_length": n``: that many private output tokens). The form
  ``python -m kvcheck.bench.trace_workload dump`` writes; it round-trips exactly.
* **Mooncake** (the public trace format of Mooncake / FAST'25, also read by Dynamo's and
  llm-d's routers' benchmarks): ``{"timestamp": ms, "input_length": n, "output_length": m,
  "hash_ids": [...]}``. Each hash id stands for one ``hash_block_tokens``-token block of
  content (512 in Mooncake's traces): equal ids are equal tokens, so shared prefixes are
  shared here too. The prompt is the hash ids' blocks cut to ``input_length`` (private
  tokens pad it when the ids cover fewer tokens).
* **lengths**: ``{"input_length": n, "output_length": m}``: private random tokens, no reuse.

Optional on any request line: ``"request_id"`` (default ``trace-<line>``), ``"arrival_step"``
(scheduler step; default ``timestamp // ms_per_step``, or 0), ``"after"`` (the id of an
earlier request this one waits for, as a chat turn waits for the previous answer; its
``arrival_step`` then counts from that request's finish). Other keys are ignored.

Header keys (all optional): ``block_size`` (16), ``num_blocks`` (pool size, null block
included; default from ``pool_fraction``), ``pool_fraction`` (1.0: the pool holds the
trace's whole working set), ``max_num_seqs`` (64), ``max_num_batched_tokens`` (2048),
``hash_block_tokens`` (512), ``ms_per_step`` (20: one scheduler step per 20 ms of
``timestamp``), ``seed`` (0: the stream private and hash-id tokens are drawn from).

Tokens are drawn with ``kvcheck.bench.workloads.Draws`` (seeded PCG64, integer-only), so a
file gives the same ``Workload`` (same ``digest()``) on every machine. ``load_trace_workload``
checks everything first and raises ``TraceFileError`` naming the file, the line and the fix.

::

    python -m kvcheck.bench.trace_workload dump shared_system_prompt -o ssp.jsonl
    python -m kvcheck.bench.trace_workload inspect mooncake_trace.jsonl
    pytest --kv-impl=mypkg.adapter --kv-bench -k scheduler \\
        --kv-bench-workload=trace:mooncake_trace.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeGuard

from kvcheck.atomic import write_atomic
from kvcheck.bench.allocator import RoundBench, SchedulerBench
from kvcheck.bench.workloads import (
    DEFAULT_BLOCK_SIZE,
    SCENARIOS,
    Draws,
    RequestSpec,
    Workload,
    make_workload,
    trace_profile,
    working_set_blocks,
)
from kvcheck.conformance.recorded import Corpus
from kvcheck.errors import KVCheckInputError

__all__ = [
    "HEADER_DEFAULTS",
    "TRACE_PREFIX",
    "RecordedWorkload",
    "TraceFileError",
    "TraceOptions",
    "dump_workload",
    "is_recorded_corpus",
    "is_trace_workload",
    "load_trace_workload",
    "main",
    "resolve_workload",
    "scheduler_bench_maker",
    "trace_path",
]

#: ``--kv-bench-workload`` values naming a file start with this.
TRACE_PREFIX = "trace:"
HEADER_KEY = "kvcheck_trace"
HEADER_VERSION = 1
#: Token ids are stored as int32 in ``Workload.digest``; ids past this are refused.
MAX_TOKEN_ID = 2**31 - 1


class TraceFileError(KVCheckInputError):
    """A trace file that cannot be read or replayed; the message names the line and the fix."""


@dataclass(frozen=True)
class TraceOptions:
    """The header's replay settings, validated; the defaults are the header's."""

    block_size: int = DEFAULT_BLOCK_SIZE
    num_blocks: int | None = None
    pool_fraction: float = 1.0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    hash_block_tokens: int = 512
    ms_per_step: int = 20
    seed: int = 0


#: Header options and their defaults (see the module docstring): ``TraceOptions``'s fields.
HEADER_DEFAULTS: dict[str, int | float | None] = {
    f.name: f.default for f in fields(TraceOptions)}  # type: ignore[misc]
#: Every option but pool_fraction is an integer.
_INT_OPTIONS = set(HEADER_DEFAULTS) - {"pool_fraction"}


def is_trace_workload(value: str) -> bool:
    """Whether a ``--kv-bench-workload`` value names a trace file (``trace:PATH``)."""
    return value.startswith(TRACE_PREFIX)


def trace_path(value: str) -> Path:
    """The path of a ``trace:PATH`` value.

    Raises:
        TraceFileError: no path after ``trace:``.
    """
    path = value[len(TRACE_PREFIX):] if is_trace_workload(value) else value
    if not path:
        raise TraceFileError(f"{value!r}: no file after 'trace:'; write "
                             "--kv-bench-workload=trace:path/to/trace.jsonl")
    return Path(path)


# ----------------------------------------------------------------------------- reading
def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_header(obj: dict[str, Any], where: str) -> TraceOptions:
    version = obj[HEADER_KEY]
    if version != HEADER_VERSION:
        raise TraceFileError(f"{where}: {HEADER_KEY} is {version!r}; this kvcheck reads "
                             f"version {HEADER_VERSION} (upgrade kvcheck for a newer file)")
    unknown = sorted(set(obj) - set(HEADER_DEFAULTS) - {HEADER_KEY})
    if unknown:
        raise TraceFileError(f"{where}: unknown header option(s) {', '.join(unknown)}; known: "
                             f"{', '.join(HEADER_DEFAULTS)}")
    values: dict[str, Any] = {}
    for key, value in obj.items():
        if key == HEADER_KEY or value is None:
            continue
        if key in _INT_OPTIONS:
            low = 0 if key == "seed" else 1
            if not _is_int(value) or value < low:
                raise TraceFileError(f"{where}: header {key} must be an integer >= {low}, "
                                     f"got {value!r}")
        elif (not isinstance(value, (int, float)) or isinstance(value, bool)
              or not 0 < value <= 1):
            raise TraceFileError(f"{where}: header pool_fraction must lie in (0, 1], got "
                                 f"{value!r}")
        values[key] = value
    return TraceOptions(**values)


def _token_list(obj: dict[str, Any], key: str, where: str, why_nonempty: str
                ) -> tuple[int, ...]:
    """``obj[key]`` as token ids: a non-empty list of integers in ``[0, MAX_TOKEN_ID]``."""
    value = obj[key]
    if not isinstance(value, list) or not all(
            _is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise TraceFileError(f"{where}: {key} must be a list of token ids (integers in "
                             f"[0, {MAX_TOKEN_ID}])")
    if not value:
        raise TraceFileError(f"{where}: {key} is empty; {why_nonempty}")
    return tuple(value)


def _length(obj: dict[str, Any], key: str, where: str, low: int) -> int:
    value = obj.get(key)
    if not _is_int(value) or value < low:
        raise TraceFileError(f"{where}: {key} must be an integer >= {low}, got {value!r}"
                             + (" (every request samples at least one token)"
                                if key == "output_length" else ""))
    return int(value)


class _TokenSource:
    """Deterministic tokens: one block per hash id (shared), private runs per request."""

    def __init__(self, options: TraceOptions) -> None:
        self.options = options
        self._blocks: dict[int, tuple[int, ...]] = {}

    def hash_block(self, hash_id: int) -> tuple[int, ...]:
        block = self._blocks.get(hash_id)
        if block is None:
            block = Draws(self.options.seed, f"trace-hash/{hash_id}").tokens(
                self.options.hash_block_tokens)
            self._blocks[hash_id] = block
        return block

    def private(self, label: str, n: int) -> tuple[int, ...]:
        return Draws(self.options.seed, label).tokens(n) if n > 0 else ()


def _prompt(obj: dict[str, Any], where: str, source: _TokenSource, rid: str) -> tuple[int, ...]:
    if "prompt_token_ids" in obj:
        return _token_list(obj, "prompt_token_ids", where,
                           "a request needs a prompt of at least one token")
    if "input_length" not in obj:
        raise TraceFileError(f"{where}: a request needs prompt_token_ids, or input_length "
                             "(with hash_ids for shared content, as in Mooncake traces)")
    length = _length(obj, "input_length", where, 1)
    hash_ids = obj.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
        raise TraceFileError(f"{where}: hash_ids must be a list of integers (one per "
                             f"{source.options.hash_block_tokens}-token block)")
    tokens: list[int] = []
    for hash_id in hash_ids:
        if len(tokens) >= length:
            break
        tokens.extend(source.hash_block(hash_id))
    if len(tokens) < length:
        tokens.extend(source.private(f"trace-prompt/{rid}", length - len(tokens)))
    return tuple(tokens[:length])


def _outputs(obj: dict[str, Any], where: str, source: _TokenSource,
             rid: str) -> tuple[int, ...]:
    if "output_token_ids" in obj:
        return _token_list(obj, "output_token_ids", where,
                           "every request samples at least one token")
    return source.private(f"trace-output/{rid}", _length(obj, "output_length", where, 1))


def _arrival(obj: dict[str, Any], where: str, options: TraceOptions) -> int:
    if "arrival_step" in obj:
        return _length(obj, "arrival_step", where, 0)
    if "timestamp" in obj:
        stamp = obj["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or stamp < 0:
            raise TraceFileError(f"{where}: timestamp must be a number of milliseconds >= 0, "
                                 f"got {stamp!r}")
        return int(stamp // options.ms_per_step)
    return 0


def _read_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """``([(line number, object)...], sha256 of the file)``, the file read once."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise TraceFileError(f"trace file {path} does not exist; --kv-bench-workload="
                             "trace:PATH takes a JSON Lines request trace (see python -m "
                             "kvcheck.bench.trace_workload --help)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFileError(f"cannot read trace file {path}: {exc}") from None
    objects = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceFileError(f"{path}:{number}: not JSON ({exc.msg} at column "
                                 f"{exc.colno}); a trace file has one JSON object per "
                                 "line") from None
        if not isinstance(obj, dict):
            raise TraceFileError(f"{path}:{number}: expected a JSON object per line, got "
                                 f"{type(obj).__name__}")
        objects.append((number, obj))
    return objects, hashlib.sha256(data).hexdigest()


def load_trace_workload(path: str | Path) -> Workload:
    """Read a trace file into a ``Workload`` (scenario ``trace:<file name>``, scale 1).

    Raises:
        TraceFileError: the file is missing, unreadable, not JSON Lines, has no request, a
            bad header or request line, duplicate request ids, an ``after`` that names no
            earlier request, or a ``num_blocks`` too small for its largest request.
    """
    path = Path(path)
    lines, digest = _read_lines(path)
    options = TraceOptions()
    if lines and HEADER_KEY in lines[0][1]:
        options = _parse_header(lines[0][1], f"{path}:{lines[0][0]}")
        lines = lines[1:]
    if not lines:
        raise TraceFileError(f"{path}: no request lines; each line after the optional "
                             "header is one request")
    source = _TokenSource(options)
    requests: list[RequestSpec] = []
    seen: set[str] = set()
    for number, obj in lines:
        where = f"{path}:{number}"
        rid = obj.get("request_id", f"trace-{number:06d}")
        if not isinstance(rid, str) or not rid:
            raise TraceFileError(f"{where}: request_id must be a non-empty string")
        if rid in seen:
            raise TraceFileError(f"{where}: request_id {rid!r} is used twice; ids must be "
                                 "unique within a trace")
        after = obj.get("after")
        if after is not None and (not isinstance(after, str) or after not in seen):
            raise TraceFileError(f"{where}: after={after!r} names no earlier request; it must "
                                 "be the request_id of a request on an earlier line")
        requests.append(RequestSpec(rid, _arrival(obj, where, options),
                                    _prompt(obj, where, source, rid),
                                    _outputs(obj, where, source, rid), after))
        seen.add(rid)
    return _workload(path, requests, options, digest)


def _workload(path: Path, requests: list[RequestSpec], options: TraceOptions,
              file_sha256: str) -> Workload:
    block_size = options.block_size
    working_set = working_set_blocks(requests, block_size)
    largest = max(math.ceil(r.num_tokens / block_size) for r in requests)
    if options.num_blocks is not None:
        if options.num_blocks - 1 < largest:
            raise TraceFileError(
                f"{path}: header num_blocks={options.num_blocks} cannot hold the largest "
                f"request ({largest} blocks of {block_size} tokens plus the null block); "
                f"raise it to at least {largest + 1} or drop it to size the pool from "
                "pool_fraction")
        num_blocks = options.num_blocks
    else:
        num_blocks = 1 + max(largest, math.ceil(options.pool_fraction * working_set))
    return Workload(
        scenario=f"{TRACE_PREFIX}{path.name}", seed=options.seed, scale=1.0,
        block_size=block_size, requests=tuple(requests), num_blocks=num_blocks,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        working_set_blocks=working_set, pool_fraction=options.pool_fraction,
        distributions={"source": f"trace file {path.name}",
                       "file_sha256": file_sha256},
    )


@dataclass(frozen=True)
class RecordedWorkload:
    """A recorded corpus named as a workload (``trace:PATH.cbor.xz``): its calls are replayed
    as recorded (``kvcheck.bench.recorded_bench``), not scheduled by kvcheck's loop."""

    scenario: str  # trace:<file name>
    corpus: Corpus


def is_recorded_corpus(path: Path) -> bool:
    """Whether a trace path names a recorded corpus (``kvcheck record`` output: ``.cbor.xz``
    or ``.cbor``) rather than a JSON Lines request trace."""
    return path.name.endswith((".cbor.xz", ".cbor"))


def resolve_workload(value: str, seed: int = 0, scale: float = 1.0
                     ) -> Workload | RecordedWorkload:
    """The workload a ``--kv-bench-workload`` value names: a built-in scenario (built with
    ``seed`` and ``scale``), ``trace:PATH`` of a request trace (seed and scale are the file's),
    or ``trace:PATH.cbor.xz`` of a recorded corpus.

    Raises:
        KVCheckInputError: an unknown scenario name (the message lists the known ones), or
            any ``TraceFileError`` / ``CorpusError`` of the file.
    """
    if is_trace_workload(value):
        path = trace_path(value)
        if is_recorded_corpus(path):
            from kvcheck.bench.recorded_bench import load_recorded_workload

            return RecordedWorkload(f"{TRACE_PREFIX}{path.name}", load_recorded_workload(path))
        return load_trace_workload(path)
    if value not in SCENARIOS:
        raise KVCheckInputError(
            f"unknown workload {value!r}: give a built-in scenario ({', '.join(SCENARIOS)}) "
            "or trace:PATH for a request trace file (JSON Lines: python -m "
            "kvcheck.bench.trace_workload --help)")
    return make_workload(value, seed, scale)


def scheduler_bench_maker(workload: Workload | RecordedWorkload, impl: Any, reference: Any
                          ) -> Callable[[Any], RoundBench]:
    """``make(side) -> RoundBench`` for ``BenchSession.run_allocator``: kvcheck's scheduler
    loop over a ``Workload``, or the recorded calls of a corpus, restricted to the traces both
    ``impl`` and ``reference`` can run so that paired rounds replay the same calls."""
    if isinstance(workload, Workload):
        return lambda side: SchedulerBench(side, workload)
    from kvcheck.bench.recorded_bench import recorded_pair

    mine, theirs = recorded_pair(impl, reference, workload.corpus, workload.scenario)
    return lambda side: mine if side is impl else theirs


# ----------------------------------------------------------------------------- writing
def dump_workload(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` as a trace file (header + one ``tokens`` line per request),
    atomically; ``load_trace_workload`` reads back the same requests and limits."""
    header: dict[str, Any] = {
        HEADER_KEY: HEADER_VERSION, "block_size": workload.block_size,
        "num_blocks": workload.num_blocks, "max_num_seqs": workload.max_num_seqs,
        "max_num_batched_tokens": workload.max_num_batched_tokens, "seed": workload.seed}
    lines = [json.dumps(header)]
    for r in workload.requests:
        entry: dict[str, Any] = {"request_id": r.request_id, "arrival_step": r.arrival_step}
        if r.after is not None:
            entry["after"] = r.after
        entry["prompt_token_ids"] = list(r.prompt_token_ids)
        entry["output_token_ids"] = list(r.output_token_ids)
        lines.append(json.dumps(entry, separators=(",", ":")))
    return write_atomic(path, "\n".join(lines) + "\n")


def describe(workload: Workload | RecordedWorkload) -> list[str]:
    """Human-readable lines: size, limits and ``trace_profile`` of a workload (a recorded
    corpus: what was recorded, traces and steps)."""
    if isinstance(workload, RecordedWorkload):
        header = workload.corpus["header"]
        return [(f"{workload.scenario}: recorded corpus of {header['impl']} "
                f"{header['impl_version']} ({header['profile']}), {header['traces']} traces, "
                f"{header['steps']} steps; replayed call by call")]
    profile = trace_profile(workload.requests, workload.block_size)
    return [
        (f"{workload.scenario}: {len(workload.requests)} requests, "
         f"{workload.num_prompt_tokens} prompt + {workload.num_output_tokens} output tokens"),
        (f"pool {workload.num_blocks} blocks of {workload.block_size} tokens (working set "
         f"{workload.working_set_blocks}), max_num_seqs {workload.max_num_seqs}, "
         f"max_num_batched_tokens {workload.max_num_batched_tokens}"),
        "prompt tokens p10/p50/p90/max: " + "/".join(
            f"{profile[f'prompt_tokens_{q}']:.0f}" for q in ("p10", "p50", "p90", "max")),
        f"shared-prefix fraction of full prompt blocks: {profile['shared_prefix_fraction']:.3f}",
        f"digest {workload.digest()}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``dump`` a built-in scenario as a trace file, or ``inspect`` a trace file."""
    parser = argparse.ArgumentParser(prog="python -m kvcheck.bench.trace_workload",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dump = sub.add_parser("dump", help="write a built-in scenario as a trace file")
    dump.add_argument("scenario")
    dump.add_argument("-o", "--output", required=True)
    dump.add_argument("--seed", type=int, default=0)
    dump.add_argument("--scale", type=float, default=1.0)
    inspect = sub.add_parser("inspect", help="read a trace file and describe it")
    inspect.add_argument("path", help="a request trace (.jsonl) or a recorded corpus "
                         "(.cbor.xz)")
    args = parser.parse_args(argv)
    try:
        if args.command == "dump":
            written = dump_workload(make_workload(args.scenario, args.seed, args.scale),
                                    args.output)
            print(f"wrote {os.fspath(written)}")
        else:
            print("\n".join(describe(resolve_workload(TRACE_PREFIX + args.path))))
    except KVCheckInputError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
