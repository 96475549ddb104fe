"""A request trace file as a ``Workload`` (``load_trace_workload``), and a ``Workload`` as one
(``dump_workload``): the workload of ``--kv-bench-workload=trace:PATH``.

A trace file is JSON Lines: one JSON object per line, blank lines ignored. An optional first
line ``{"kvcheck_trace": 1, ...}`` sets how the trace is replayed; every other line is one
request, in arrival order, in one of three shapes (they may be mixed):

* **tokens**: ``{"prompt_token_ids": [...], "output_token_ids": [...]}`` (or
  ``"output_length": n``: that many private output tokens). The form
  ``kvcheck bench trace dump`` writes; it round-trips exactly.
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

Tokens are drawn with ``kvcheck.bench.workload.scenarios.Draws`` (seeded PCG64, integer-only), so a
file gives the same ``Workload`` (same ``digest()``) on every machine. ``load_trace_workload``
checks everything first (``kvcheck.bench.workload.trace_file``), before any token is drawn, and
raises ``TraceFileError`` naming ``file:line``, the field, the limit and the fix.

Bounds (``kvcheck.conformance.bounds``, those of ``kvcheck replay`` first; the built-in
scenarios stay far below them):

* the file: a regular file of at most 256 MiB, lines of at most 16 MiB, UTF-8 JSON; numbers
  finite (no ``NaN`` / ``Infinity`` / ``1e400``), integers of at most 4300 digits;
* counts (lengths, steps, header options) are ints, or floats with an integral value
  (``1200.0``); ids (token ids, hash ids, ``kvcheck_trace``) are ints; never booleans;
* header: ``block_size`` 1..2^16, ``num_blocks`` 2..2^20 (also the pool sized from
  ``pool_fraction``, which lies in (0, 1]), ``max_num_seqs`` 1..2^20, ``max_num_batched_tokens``
  1..2^24, ``hash_block_tokens`` 1..2^16, ``ms_per_step`` 1..3600000, ``seed`` 0..2^63-1,
  ``kvcheck_trace`` 1, on the first line only;
* a request: ``input_length`` / ``output_length`` >= 1 and prompt + output at most 2^20
  tokens (replay's ``max_model_len``); token ids in [0, 2^31-1] (int32 in the digest);
  hash ids in [0, 2^63); ``arrival_step`` 0..2^20, and a ``timestamp`` a finite number of ms
  >= 0 whose step (``timestamp // ms_per_step``) is at most 2^20; ``request_id`` 1..256
  characters, unique; ``after`` an earlier request's id; a given ``input_length`` /
  ``output_length`` agrees with a given token list;
* the trace: at most 10^6 requests, 2^24 tokens, 2^21 full blocks (counted per request),
  2^24 tokens drawn for distinct hash ids, 2^32 decode token-steps (output tokens times
  request length, summed: what a round of the loop copies into request views) and 2^20
  steps of chat-turn delays (``arrival_step`` of the requests with ``after``), each refused
  at the line that crosses it.

::

    kvcheck bench trace dump shared_system_prompt -o ssp.jsonl
    kvcheck bench trace inspect mooncake_trace.jsonl
    pytest --kv-impl=mypkg.adapter --kv-bench -k scheduler \\
        --kv-bench-workload=trace:mooncake_trace.jsonl
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvcheck.atomic import write_atomic
from kvcheck.bench.workload.scenarios import (
    VOCAB_SIZE,
    Draws,
    RequestSpec,
    Workload,
    working_set_blocks,
)
from kvcheck.bench.workload.trace_file import (
    HEADER_KEY,
    HEADER_VERSION,
    TraceFileError,
    TraceLine,
    TraceOptions,
    read_trace,
)
from kvcheck.conformance.bounds import MAX_NUM_BLOCKS, power_of_two

__all__ = ["TRACE_PREFIX", "dump_workload", "load_trace_workload"]

#: ``--kv-bench-workload`` values naming a file start with this.
TRACE_PREFIX = "trace:"


# ----------------------------------------------------------------------------- reading
#: One int object per vocabulary token: drawn tokens point into it (8 bytes a token, not 36).
_VOCABULARY = tuple(range(VOCAB_SIZE))


class _TokenSource:
    """Deterministic tokens: one block per hash id (shared), private runs per request."""

    def __init__(self, options: TraceOptions) -> None:
        self.options = options
        self._blocks: dict[int, tuple[int, ...]] = {}

    def hash_block(self, hash_id: int) -> tuple[int, ...]:
        block = self._blocks.get(hash_id)
        if block is None:
            block = self._draw(f"trace-hash/{hash_id}", self.options.hash_block_tokens)
            self._blocks[hash_id] = block
        return block

    def private(self, label: str, n: int) -> tuple[int, ...]:
        return self._draw(label, n) if n > 0 else ()

    def _draw(self, label: str, n: int) -> tuple[int, ...]:
        return tuple(map(_VOCABULARY.__getitem__, Draws(self.options.seed, label).tokens(n)))


def _prompt(line: TraceLine, source: _TokenSource) -> tuple[int, ...]:
    """The given prompt, or the hash ids' blocks cut to ``input_length`` (private tokens pad
    it when the ids cover fewer tokens)."""
    if line.prompt_token_ids is not None:
        return line.prompt_token_ids
    length = line.input_length
    tokens: list[int] = []
    for hash_id in line.hash_ids:
        if len(tokens) >= length:
            break
        tokens.extend(source.hash_block(hash_id))
    if len(tokens) < length:
        tokens.extend(source.private(f"trace-prompt/{line.request_id}", length - len(tokens)))
    return tuple(tokens[:length])


def _outputs(line: TraceLine, source: _TokenSource) -> tuple[int, ...]:
    if line.output_token_ids is not None:
        return line.output_token_ids
    return source.private(f"trace-output/{line.request_id}", line.output_length)


def load_trace_workload(path: str | Path) -> Workload:
    """Read a trace file into a ``Workload`` (scenario ``trace:<file name>``, scale 1).

    Every line and the trace's totals are checked first (``kvcheck.bench.workload.trace_file``:
    the bounds of ``kvcheck replay`` and those of the module docstring); only then are
    tokens drawn, so a file that asks for too much costs no more than reading it.

    Raises:
        TraceFileError: the file is missing, not a regular file or too large, not JSON
            Lines, has no request, a bad header or request line (a value out of its bounds,
            a non-finite or non-integral number), duplicate request ids, an ``after`` that
            names no earlier request, a total past its bound, or a pool (``num_blocks``, or
            the one sized from ``pool_fraction``) that cannot hold its largest request or
            is larger than 2**20 blocks.
    """
    path = Path(path)
    trace = read_trace(path)
    source = _TokenSource(trace.options)
    requests = [RequestSpec(line.request_id, line.arrival_step, _prompt(line, source),
                            _outputs(line, source), line.after) for line in trace.lines]
    return _workload(path, requests, trace.options, trace.sha256)


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
        if num_blocks > MAX_NUM_BLOCKS:
            raise TraceFileError(
                f"{path}: the pool sized from pool_fraction={options.pool_fraction} of the "
                f"working set ({working_set} blocks of {block_size} tokens) is {num_blocks} "
                f"blocks; a pool holds at most {power_of_two(MAX_NUM_BLOCKS)} (as kvcheck "
                "replay)", "lower the header pool_fraction, raise block_size, or set "
                f"num_blocks (at most {MAX_NUM_BLOCKS})")
    return Workload(
        scenario=f"{TRACE_PREFIX}{path.name}", seed=options.seed, scale=1.0,
        block_size=block_size, requests=tuple(requests), num_blocks=num_blocks,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        working_set_blocks=working_set, pool_fraction=options.pool_fraction,
        distributions={"source": f"trace file {path.name}",
                       "file_sha256": file_sha256},
    )


# ----------------------------------------------------------------------------- writing
def dump_workload(workload: Workload, path: str | Path) -> Path:
    """Write ``workload`` as a trace file (header + one ``tokens`` line per request),
    atomically; ``load_trace_workload`` reads back the same requests and limits."""
    header: dict[str, object] = {
        HEADER_KEY: HEADER_VERSION, "block_size": workload.block_size,
        "num_blocks": workload.num_blocks, "max_num_seqs": workload.max_num_seqs,
        "max_num_batched_tokens": workload.max_num_batched_tokens, "seed": workload.seed}
    lines = [json.dumps(header)]
    for r in workload.requests:
        entry: dict[str, object] = {"request_id": r.request_id, "arrival_step": r.arrival_step}
        if r.after is not None:
            entry["after"] = r.after
        entry["prompt_token_ids"] = list(r.prompt_token_ids)
        entry["output_token_ids"] = list(r.output_token_ids)
        lines.append(json.dumps(entry, separators=(",", ":")))
    return write_atomic(path, "\n".join(lines) + "\n")
