"""Reading and checking a request trace file (``kvcheck.bench.workload.request_trace``), bounded.

``read_trace`` checks every field of every line, and the trace's totals, before a single
token is drawn: what it returns is small (the file's own token lists and a few numbers per
request), so reading costs time and memory in proportion to the file, never to the numbers
written in it. The bounds are ``kvcheck.conformance.bounds`` (shared with ``kvcheck
replay``) plus the few below; every refusal is a ``TraceFileError`` naming ``file:line``, the
field, the limit and the fix.

Numbers: JSON's ``NaN`` / ``Infinity``, floats too large to be finite (``1e400``) and
integers of more than 4300 digits are refused where they stand. A count (a length, a step,
a header option) is an int, or a float with an integral value (``1200.0``, as some tools
write); ids (token ids, hash ids, ``kvcheck_trace``) are ints; booleans are never numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Protocol, cast

from kvcheck.bench.errors import TraceFileError
from kvcheck.bench.workload.scenarios import DEFAULT_BLOCK_SIZE
from kvcheck.conformance.bounds import (
    MAX_ARRIVAL_STEP,
    MAX_BLOCK_SIZE,
    MAX_DECODE_TOKEN_STEPS,
    MAX_NUM_BLOCKS,
    MAX_OPS,
    MAX_REQUEST_TOKENS,
    MAX_SEED,
    MAX_TRACE_BYTES,
    MAX_TRACE_TOKENS,
    TOKEN_ID_LIMIT,
    num_digits,
    power_of_two,
)

__all__ = [
    "HEADER_DEFAULTS",
    "HEADER_KEY",
    "HEADER_VERSION",
    "MAX_LINE_BYTES",
    "MAX_MS_PER_STEP",
    "MAX_REQUEST_ID_CHARS",
    "MAX_TOKEN_ID",
    "MAX_TRACE_BLOCKS",
    "MAX_TRACE_REQUESTS",
    "TraceFile",
    "TraceFileError",
    "TraceLine",
    "TraceOptions",
    "read_trace",
]

HEADER_KEY = "kvcheck_trace"
HEADER_VERSION = 1
#: Token ids are stored as int32 in ``Workload.digest``; ids past this are refused (kvcheck
#: replay's 2**63 would not survive the digest).
MAX_TOKEN_ID = 2**31 - 1
#: Longest line read: a request at ``MAX_REQUEST_TOKENS`` tokens of ten digits, written with
#: ``json.dumps``' ", " separators, is 12.6 MB.
MAX_LINE_BYTES = 16 << 20
#: Requests in a trace: each is at least one op of a replay trace (``MAX_OPS``).
MAX_TRACE_REQUESTS = MAX_OPS
#: Full blocks the requests fill, counted per request (twice the largest pool): sizing the
#: pool keeps one entry per distinct block, so this bounds its memory when ``block_size`` is
#: small (at the default 16 tokens ``MAX_TRACE_TOKENS`` is reached first).
MAX_TRACE_BLOCKS = 2 * MAX_NUM_BLOCKS
#: Request ids are quoted in messages and records; vLLM's are about 40 characters.
MAX_REQUEST_ID_CHARS = 256
#: One scheduler step per hour at most.
MAX_MS_PER_STEP = 3_600_000


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

#: Integer header option -> (lowest, highest, why the highest).
_HEADER_BOUNDS: dict[str, tuple[int, int, str]] = {
    "block_size": (1, MAX_BLOCK_SIZE, "tokens per block, as kvcheck replay"),
    "num_blocks": (2, MAX_NUM_BLOCKS, "blocks in a pool with its null block, as kvcheck replay"),
    "max_num_seqs": (1, MAX_NUM_BLOCKS, "each running request holds a block"),
    "max_num_batched_tokens": (1, MAX_TRACE_TOKENS, "the tokens of the largest trace"),
    "hash_block_tokens": (1, MAX_BLOCK_SIZE, "a hash id stands for one block of content"),
    "ms_per_step": (1, MAX_MS_PER_STEP, "one scheduler step per hour"),
    "seed": (0, MAX_SEED, "stored as a signed 64-bit integer"),
}


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One checked request line: its own token lists (None: drawn from the lengths), the
    hash ids that cover its prompt, and where it arrives."""

    number: int
    request_id: str
    arrival_step: int
    after: str | None
    input_length: int
    output_length: int
    prompt_token_ids: tuple[int, ...] | None
    output_token_ids: tuple[int, ...] | None
    hash_ids: tuple[int, ...]


@dataclass
class TraceFile:
    """A checked trace file: its options, its request lines and the file's SHA-256."""

    path: Path
    options: TraceOptions
    lines: list[TraceLine] = field(default_factory=list)
    sha256: str = ""


# ----------------------------------------------------------------------------- values
def _show(value: object) -> str:
    """``value`` for a message: short, one line, never the whole of a huge list or int."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        if value.bit_length() > 64:  # str() of a huge int is slow, or refused past 4300 digits
            return f"an integer of {num_digits(value)} digits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return "an object"
    text = repr(value[:60] if isinstance(value, str) else value)
    return text if len(text) <= 64 else text[:61] + "..."


def _refuse(where: str, key: str, value: object, must: str, fix: str) -> TraceFileError:
    return TraceFileError(f"{where}: {key}={_show(value)}: {must}", fix)


def _count(value: object, where: str, key: str, low: int, high: int, why: str = "") -> int:
    """``value`` as an int in ``[low, high]``: an int, or a float with an integral value."""
    limit = f"an integer in [{low}, {power_of_two(high)}]" + (f" ({why})" if why else "")
    number: int | float
    if (isinstance(value, float) and value.is_integer()) or (
            isinstance(value, int) and not isinstance(value, bool)):
        number = value
    else:
        raise _refuse(where, key, value, f"must be {limit}",
                      f"write {key} as a whole number, e.g. {key}: {max(low, 1)}")
    if not low <= number <= high:
        raise _refuse(where, key, value, f"out of range: must be {limit}",
                      f"give {key} between {low} and {high}")
    return int(number)


def _ids(value: object, where: str, key: str, limit: int, what: str, max_len: int) -> list[int]:
    """``value`` as a list of at most ``max_len`` ints in ``[0, limit]``; the length is
    checked before the elements."""
    if not isinstance(value, list):
        raise _refuse(where, key, value, f"must be a list of {what}",
                      f"write {key} as a JSON list of integers")
    if len(value) > max_len:
        raise _refuse(where, key, value, f"more than {power_of_two(max_len)} items (tokens "
                      "per request, as kvcheck replay)", "cut the request or split the trace")
    if value and (set(map(type, value)) != {int} or min(value) < 0 or max(value) > limit):
        bad = next(v for v in value if type(v) is not int or not 0 <= v <= limit)
        index = value.index(bad) if type(bad) is int else next(
            i for i, v in enumerate(value) if v is bad)
        raise TraceFileError(f"{where}: {key}[{index}]={_show(bad)}: {what} are integers in "
                             f"[0, {limit}]", f"replace {key}[{index}] with such an integer")
    return value


# ----------------------------------------------------------------------------- lines
class _BadNumber(Exception):
    """A JSON number kvcheck refuses (NaN, Infinity, an overflowing float)."""


def _no_constant(literal: str) -> float:
    raise _BadNumber(literal)


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _BadNumber(literal if len(literal) <= 40 else literal[:37] + "...")
    return value


class _Marked:
    """Where a refused number stood, found by parsing the line again (only after an error)."""

    def __init__(self, literal: str) -> None:
        self.literal = literal


def _marked_field(text: str) -> tuple[str, str] | None:
    """``(field, literal)`` of the first refused number of a request line, or None."""

    def mark_float(literal: str) -> float | _Marked:
        value = float(literal)
        return value if math.isfinite(value) else _Marked(literal)

    def mark_int(literal: str) -> int | _Marked:
        return _Marked(literal) if len(literal.lstrip("-")) > 4300 else int(literal)

    try:
        obj = json.loads(text, parse_constant=_Marked, parse_float=mark_float,
                         parse_int=mark_int)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    for key, value in obj.items():
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if isinstance(item, _Marked):
                at = f"{key}[{index}]" if isinstance(value, list) else str(key)
                return at, item.literal
    return None


def _parse(raw: bytes, where: str) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFileError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                             f"{exc.start + 1})", "save the trace as UTF-8 JSON Lines") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except _BadNumber as exc:
        marked = _marked_field(text)
        at = f"{marked[0]}={marked[1][:40]}" if marked else f"the number {exc.args[0]}"
        raise TraceFileError(f"{where}: {at}: not a finite number; numbers in a trace are "
                             "finite (JSON has no NaN or Infinity)",
                             "write a finite number, or drop the field") from None
    except json.JSONDecodeError as exc:
        raise TraceFileError(f"{where}: not JSON ({exc.msg} at column {exc.colno}); a trace "
                             "file has one JSON object per line",
                             "write one JSON object per line") from None
    except RecursionError:
        raise TraceFileError(f"{where}: JSON nested too deeply to read; a request line is a "
                             "flat object of numbers, strings and lists of integers",
                             "flatten the line") from None
    except ValueError:  # an integer of more than 4300 digits (Python's int-parsing limit)
        marked = _marked_field(text)
        at = (f"{marked[0]}=an integer of {len(marked[1].lstrip('-'))} digits" if marked
              else "an integer of more than 4300 digits")
        raise TraceFileError(f"{where}: {at}: too long to read; counts and ids in a trace "
                             "have at most 19 digits", "write counts and ids as integers "
                             "below 2^63") from None


def _open(path: Path) -> IO[bytes]:
    """``path`` opened for reading once it is known to be a regular file within
    ``MAX_TRACE_BYTES`` (stat first: opening a named pipe would wait for a writer)."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise TraceFileError(f"trace file {path} is not a regular file (a directory, "
                                 "named pipe or device); a request trace is a JSON Lines "
                                 "file", "give the path of a .jsonl file")
        if info.st_size > MAX_TRACE_BYTES:
            raise TraceFileError(f"trace file {path}: {info.st_size} bytes; a trace is at "
                                 f"most {MAX_TRACE_BYTES} bytes (256 MiB, as kvcheck replay)",
                                 "cut the trace (e.g. keep its first lines with head -n)")
        return path.open("rb")
    except FileNotFoundError:
        raise TraceFileError(f"trace file {path} does not exist; --kv-bench-workload="
                             "trace:PATH takes a JSON Lines request trace (see kvcheck bench "
                             "trace --help)") from None
    except OSError as exc:
        raise TraceFileError(f"cannot read trace file {path}: {exc}") from None


class _Digest(Protocol):
    """What ``_objects`` feeds every line to (a ``hashlib`` hash)."""

    def update(self, data: bytes, /) -> None: ...


def _objects(path: Path, digest: _Digest) -> Iterator[tuple[int, object]]:
    """``(line number, object)`` of every non-blank line, read one bounded line at a time
    (``MAX_LINE_BYTES``, ``MAX_TRACE_BYTES`` in all), each line fed to ``digest``."""
    with _open(path) as handle:
        total = 0
        number = 0
        while True:
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise TraceFileError(f"cannot read trace file {path}: {exc}") from None
            if not raw:
                return
            number += 1
            total += len(raw)
            where = f"{path}:{number}"
            if len(raw) > MAX_LINE_BYTES:
                raise TraceFileError(f"{where}: the line is longer than {MAX_LINE_BYTES} bytes "
                                     "(16 MiB: a request of 2^20 tokens fits in 13 MB)",
                                     "split the line: one request per line")
            if total > MAX_TRACE_BYTES:  # the file grew while being read
                raise TraceFileError(f"trace file {path}: more than {MAX_TRACE_BYTES} bytes",
                                     "cut the trace (e.g. keep its first lines with head -n)")
            digest.update(raw)
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some editors write
            if raw.strip():
                yield number, _parse(raw, where)


# ----------------------------------------------------------------------------- header
def _header(obj: dict[str, object], where: str) -> TraceOptions:
    version = obj[HEADER_KEY]
    if type(version) is not int or version != HEADER_VERSION:
        raise TraceFileError(f"{where}: {HEADER_KEY}={_show(version)}; this kvcheck reads "
                             f"version {HEADER_VERSION}",
                             "upgrade kvcheck for a newer file, or write "
                             f'"{HEADER_KEY}": {HEADER_VERSION}')
    unknown = sorted(set(obj) - set(HEADER_DEFAULTS) - {HEADER_KEY})
    if unknown:
        raise TraceFileError(f"{where}: unknown header option(s) {', '.join(unknown)}; known: "
                             f"{', '.join(HEADER_DEFAULTS)}", "drop or rename them")
    values: dict[str, Any] = {}  # Any: TraceOptions' fields by name, each checked here
    for key, value in obj.items():
        if key == HEADER_KEY or value is None:
            continue
        if key in _HEADER_BOUNDS:
            low, high, why = _HEADER_BOUNDS[key]
            values[key] = _count(value, where, f"header {key}", low, high, why)
        elif (isinstance(value, bool) or not isinstance(value, (int, float))
              or not 0 < value <= 1):
            raise _refuse(where, "header pool_fraction", value, "must lie in (0, 1]",
                          "give the fraction of the working set the pool holds, e.g. 0.5")
        else:
            values[key] = value
    return TraceOptions(**values)


# ----------------------------------------------------------------------------- requests
class _Totals:
    """The trace's running totals, each checked against its bound at the line that
    crosses it."""

    def __init__(self, options: TraceOptions) -> None:
        self.options = options
        self.requests = 0
        self.tokens = 0
        self.blocks = 0
        self.decode_steps = 0
        self.delays = 0
        self.hash_ids: set[int] = set()
        self.ids: set[str] = set()

    def add(self, line: TraceLine, where: str) -> None:
        self.requests += 1
        if self.requests > MAX_TRACE_REQUESTS:
            raise TraceFileError(f"{where}: more than {MAX_TRACE_REQUESTS} requests (a request "
                                 "is at least one op of a kvcheck replay trace, at most 10^6)",
                                 "cut the trace (e.g. keep its first lines with head -n)")
        n = line.input_length + line.output_length
        self.tokens += n
        if self.tokens > MAX_TRACE_TOKENS:
            raise TraceFileError(
                f"{where}: the requests up to this line hold {self.tokens} tokens; a trace "
                f"holds at most {power_of_two(MAX_TRACE_TOKENS)} (what the largest pool, "
                f"{MAX_NUM_BLOCKS} blocks of 16 tokens, holds)",
                "cut the trace (keep the lines before this one) or shorten its requests")
        # Full blocks of what the request holds: its prompt and all outputs but the last.
        self.blocks += (n - 1) // self.options.block_size
        if self.blocks > MAX_TRACE_BLOCKS:
            raise TraceFileError(
                f"{where}: the requests up to this line fill {self.blocks} blocks of "
                f"{self.options.block_size} tokens; a trace fills at most "
                f"{power_of_two(MAX_TRACE_BLOCKS)} (twice the largest pool)",
                "raise the header block_size, or cut the trace")
        self.decode_steps += line.output_length * n
        if self.decode_steps > MAX_DECODE_TOKEN_STEPS:
            raise TraceFileError(
                f"{where}: decoding the requests up to this line hands out "
                f"{self.decode_steps} request tokens (the sum of output tokens times request "
                f"length); a trace may hand out at most "
                f"{power_of_two(MAX_DECODE_TOKEN_STEPS)}, about 5 s of each benchmark round",
                "shorten the longest outputs (output_length) or cut the trace")
        if line.after is not None:
            self.delays += line.arrival_step
            if self.delays > MAX_ARRIVAL_STEP:
                raise TraceFileError(
                    f"{where}: the arrival_step delays of the requests that wait for another "
                    f"(after) add up to {self.delays} steps up to this line; at most "
                    f"{power_of_two(MAX_ARRIVAL_STEP)} (the loop idles through each in turn)",
                    "shorten the delays between chat turns")
        hbt = self.options.hash_block_tokens
        new = len(set(line.hash_ids) - self.hash_ids)
        if new:
            self.hash_ids.update(line.hash_ids)
            if len(self.hash_ids) * hbt > MAX_TRACE_TOKENS:
                raise TraceFileError(
                    f"{where}: the hash ids up to this line stand for {len(self.hash_ids)} "
                    f"distinct blocks of {hbt} tokens, {len(self.hash_ids) * hbt} tokens to "
                    f"draw; at most {power_of_two(MAX_TRACE_TOKENS)}",
                    "cut the trace, or lower the header hash_block_tokens")


def _tokens(obj: dict[str, object], key: str, where: str, why_nonempty: str) -> tuple[int, ...]:
    value = _ids(obj[key], where, key, MAX_TOKEN_ID, "token ids", MAX_REQUEST_TOKENS)
    if not value:
        raise TraceFileError(f"{where}: {key} is empty; {why_nonempty}",
                             f"give {key} at least one token id")
    return tuple(value)


def _request(obj: dict[str, object], number: int, where: str, totals: _Totals) -> TraceLine:
    options = totals.options
    rid = obj.get("request_id", f"trace-{number:06d}")
    if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID_CHARS:
        raise _refuse(where, "request_id", rid, "must be a non-empty string of at most "
                      f"{MAX_REQUEST_ID_CHARS} characters", "give a short unique id, or drop "
                      "request_id for the default trace-<line>")
    if rid in totals.ids:
        raise TraceFileError(f"{where}: request_id {rid!r} is used twice; ids must be "
                             "unique within a trace", "rename one of them")
    after = obj.get("after")
    if after is not None and (not isinstance(after, str) or after not in totals.ids):
        raise _refuse(where, "after", after, "names no earlier request; it must be the "
                      "request_id of a request on an earlier line", "fix the id or drop after")

    prompt = output = None
    hash_ids: list[int] = []
    if "hash_ids" in obj:
        hash_ids = _ids(obj["hash_ids"], where, "hash_ids", TOKEN_ID_LIMIT - 1,
                        f"hash ids (one per {options.hash_block_tokens}-token block)",
                        MAX_REQUEST_TOKENS)
    if "prompt_token_ids" in obj:
        prompt = _tokens(obj, "prompt_token_ids", where,
                         "a request needs a prompt of at least one token")
        input_length = len(prompt)
        hash_ids = []  # the prompt is given: hash ids do not apply
        if "input_length" in obj and obj["input_length"] != input_length:
            raise _refuse(where, "input_length", obj["input_length"], "differs from the "
                          f"{input_length} tokens of prompt_token_ids",
                          "drop input_length or make it agree")
    elif "input_length" in obj:
        input_length = _count(obj["input_length"], where, "input_length", 1,
                              MAX_REQUEST_TOKENS, "tokens per request, as kvcheck replay")
        hash_ids = hash_ids[:-(-input_length // options.hash_block_tokens)]
    else:
        raise TraceFileError(f"{where}: a request needs prompt_token_ids, or input_length "
                             "(with hash_ids for shared content, as in Mooncake traces)",
                             "add one of them")
    if "output_token_ids" in obj:
        output = _tokens(obj, "output_token_ids", where,
                         "every request samples at least one token")
        output_length = len(output)
        if "output_length" in obj and obj["output_length"] != output_length:
            raise _refuse(where, "output_length", obj["output_length"], "differs from the "
                          f"{output_length} tokens of output_token_ids",
                          "drop output_length or make it agree")
    elif "output_length" in obj:
        output_length = _count(obj["output_length"], where, "output_length", 1,
                               MAX_REQUEST_TOKENS, "tokens per request, as kvcheck replay; "
                               "every request samples at least one token")
    else:
        raise TraceFileError(f"{where}: a request needs output_token_ids or output_length "
                             "(every request samples at least one token)", "add one of them")
    if input_length + output_length > MAX_REQUEST_TOKENS:
        raise TraceFileError(
            f"{where}: {input_length} prompt + {output_length} output tokens; a request holds "
            f"at most {power_of_two(MAX_REQUEST_TOKENS)} (as kvcheck replay's max_model_len)",
            "shorten the prompt or the output")
    line = TraceLine(number, rid, _arrival(obj, where, options), after, input_length,
                     output_length, prompt, output, tuple(hash_ids))
    totals.add(line, where)
    totals.ids.add(rid)
    return line


def _arrival(obj: dict[str, object], where: str, options: TraceOptions) -> int:
    stamp = obj.get("timestamp")
    if "timestamp" in obj and (isinstance(stamp, bool) or not isinstance(stamp, (int, float))
                               or stamp < 0):
        raise _refuse(where, "timestamp", stamp, "must be a finite number of milliseconds "
                      ">= 0", "write the request's arrival time in ms since the trace began")
    if "arrival_step" in obj:
        return _count(obj["arrival_step"], where, "arrival_step", 0, MAX_ARRIVAL_STEP,
                      "the scheduler loop steps through idle steps one by one")
    if stamp is None:
        return 0
    stamp = cast("int | float", stamp)  # the check above refused any other present timestamp
    ms = options.ms_per_step
    if stamp >= (MAX_ARRIVAL_STEP + 1) * ms:
        raise _refuse(where, "timestamp", stamp, f"arrives after scheduler step "
                      f"{power_of_two(MAX_ARRIVAL_STEP)} at ms_per_step={ms} (timestamps "
                      f"below {(MAX_ARRIVAL_STEP + 1) * ms} ms)",
                      "make timestamps relative to the trace's start, raise the header "
                      "ms_per_step, or cut the trace")
    return int(stamp // ms)


# ----------------------------------------------------------------------------- the file
def read_trace(path: Path) -> TraceFile:
    """Read and check a request trace file (see the module docstring).

    Raises:
        TraceFileError: the file is missing, not a regular file, too large, has a line too
            long, not UTF-8 or not JSON (a non-finite or overlong number, deep nesting), no
            request, a bad header or request line, a header other than on the first line,
            duplicate request ids, an ``after`` that names no earlier request, or a total
            past its bound (requests, tokens, blocks, decode work, chat-turn delays, hash
            blocks).
    """
    digest = hashlib.sha256()
    trace: TraceFile | None = None
    totals: _Totals | None = None
    for number, obj in _objects(path, digest):
        where = f"{path}:{number}"
        if not isinstance(obj, dict):
            raise TraceFileError(f"{where}: expected a JSON object per line, got "
                                 f"{type(obj).__name__}", "write one JSON object per line")
        if HEADER_KEY in obj:
            if trace is not None:
                raise TraceFileError(f"{where}: a {HEADER_KEY} header after the first line; "
                                     "the header is the file's first line",
                                     "move it to the top (or drop it)")
            trace = TraceFile(path, _header(obj, where))
            totals = _Totals(trace.options)
            continue
        if trace is None or totals is None:
            trace = TraceFile(path, TraceOptions())
            totals = _Totals(trace.options)
        trace.lines.append(_request(obj, number, where, totals))
    if trace is None or not trace.lines:
        raise TraceFileError(f"{path}: no request lines; each line after the optional "
                             "header is one request", "add request lines")
    trace.sha256 = digest.hexdigest()
    return trace
