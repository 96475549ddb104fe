"""What an input file may ask of kvcheck: the bounds shared by every reader of traces.

One place for the limits that ``kvcheck replay`` (``kvcheck.conformance.trace_check``), the
benchmark's request traces (``kvcheck.bench.workload.request_trace``) and recorded corpora replayed
as benchmarks (``kvcheck.bench.replay.recorded``) apply before anything runs, so the three
agree. Each bound is far above what kvcheck's own suite, scenarios and shipped corpora use
(noted beside it) and low enough that a file at the bound loads and runs in bounded time
and memory.

Replay bounds (``kvcheck replay`` and every trace or corpus):

* ``MAX_NUM_BLOCKS`` (2**20) blocks in a pool, null block included;
* ``MAX_BLOCK_SIZE`` (2**16) tokens in a block;
* ``MAX_REQUEST_TOKENS`` (2**20) tokens in one request (prompt and output together; also
  ``max_model_len``);
* ``MAX_OPS`` (10**6) ops in a trace (a request of a benchmark trace is at least one op);
* token ids in ``[0, TOKEN_ID_LIMIT)`` (2**63);
* ``MAX_TRACE_BYTES`` (256 MiB) in a trace file.

Seeds (``MAX_SEED``, 2**63 - 1): every seed kvcheck takes (``--kv-seed``, ``--kv-bench-seed``,
``kvcheck record --seed``, the benchmark commands' ``--seed``, a trace header's ``seed``) is
an int in ``[0, MAX_SEED]``: what a signed 64-bit field holds, as records, corpora and
``Workload.digest`` store it.

Benchmark bounds (request traces and corpora replayed as benchmarks), chosen so that one
round of the scheduler loop stays bounded whatever the numbers in a small file say:

* ``MAX_TRACE_TOKENS`` (2**24) tokens over all the requests of a trace, and as many tokens
  drawn for its Mooncake hash ids: the largest pool (``MAX_NUM_BLOCKS``) at the default
  16-token block holds exactly that many, so a trace past it could never be resident at
  once; the built-in scenarios hold under 3 * 10**5;
* ``MAX_DECODE_TOKEN_STEPS`` (2**32): the sum over requests of output tokens times the
  request's length. Each decode step hands the adapter a fresh snapshot of the whole request
  (``RequestView`` is immutable), so this is what one round copies: about 5 s at the bound on
  the development VM (the built-in scenarios: under 3 * 10**7);
* ``MAX_ARRIVAL_STEP`` (2**20) for an arrival step, and for the sum of the delays of the
  chat turns that wait for an earlier request (``after``): the loop steps through idle steps
  one by one, and 2**20 steps at the default 20 ms per step cover 5.8 hours of a
  timestamped trace (Mooncake's traces span one hour).
"""

from __future__ import annotations

__all__ = [
    "MAX_ARRIVAL_STEP",
    "MAX_BLOCK_SIZE",
    "MAX_DECODE_TOKEN_STEPS",
    "MAX_NUM_BLOCKS",
    "MAX_OPS",
    "MAX_REQUEST_TOKENS",
    "MAX_SEED",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_TOKENS",
    "TOKEN_ID_LIMIT",
    "num_digits",
    "power_of_two",
]

MAX_NUM_BLOCKS = 1 << 20
MAX_BLOCK_SIZE = 1 << 16
MAX_REQUEST_TOKENS = 1 << 20
MAX_OPS = 1_000_000
#: Token ids are ints in ``[0, TOKEN_ID_LIMIT)``.
TOKEN_ID_LIMIT = 1 << 63
#: Largest trace file read (the suite's traces are a few KiB).
MAX_TRACE_BYTES = 256 << 20

MAX_SEED = (1 << 63) - 1

MAX_TRACE_TOKENS = 1 << 24
MAX_DECODE_TOKEN_STEPS = 1 << 32
MAX_ARRIVAL_STEP = 1 << 20


def power_of_two(value: int) -> str:
    """``value`` with its power of two when it is one (``1048576 (2^20)``), for messages."""
    if value > 0 and value & (value - 1) == 0:
        return f"{value} (2^{value.bit_length() - 1})"
    return str(value)


def num_digits(value: int) -> int:
    """Decimal digits of ``value`` (sign aside), without ``str()``: Python refuses to print an
    int of more than 4300 digits, and a file may hold one."""
    value = abs(value)
    digits = int((max(value.bit_length(), 1) - 1) * 0.30102999566398120) + 1
    return digits + 1 if value >= 10**digits else digits
