"""Bounded request traces (``--kv-bench-workload=trace:PATH``): every field and total of a
trace file is checked against ``kvcheck.conformance.bounds`` before a token is drawn, and a
bad file is refused naming ``file:line``, the field, the limit and the fix, fast and in
little memory: through ``load_trace_workload``, through ``python -m
kvcheck.bench.trace_workload inspect`` (exit 2, one line) and through pytest (usage error
before any benchmark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcheck.bench.replay.scheduler import run_workload
from kvcheck.bench.trace_workload import main
from kvcheck.bench.workload import trace_file
from kvcheck.bench.workload.request_trace import dump_workload, load_trace_workload
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.bench.workload.trace_file import TraceFileError
from kvcheck.conformance.bounds import MAX_ARRIVAL_STEP, MAX_REQUEST_TOKENS
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheSpec

#: How the tool's one-line errors begin.
PROG = "python -m kvcheck.bench.trace_workload"
OK = '{"input_length": 8, "output_length": 1}'


def _request(**fields: object) -> str:
    return json.dumps({"input_length": 8, "output_length": 1, **fields})


def _header(**fields: object) -> str:
    return json.dumps({"kvcheck_trace": 1, **fields})


def _many(line: str, n: int) -> str:
    return "\n".join([line] * n)


#: (id, file text, words the message must hold). Each message also names bad.jsonl and,
#: where a line is at fault, its number, and ends with "; fix: ...".
BAD_TRACES = [
    # the cases
    ("input_length_2e9", _request(input_length=2_000_000_000),
     ["bad.jsonl:1: input_length=2000000000: out of range", "1048576 (2^20)",
      "as kvcheck replay"]),
    ("output_length_2e9_float", '{"input_length": 8, "output_length": 2e9}',
     ["bad.jsonl:1: output_length=2000000000.0: out of range", "1048576 (2^20)"]),
    ("arrival_step_1e15", _request(arrival_step=10**15),
     ["bad.jsonl:1: arrival_step=1000000000000000: out of range", "1048576 (2^20)",
      "idle steps one by one"]),
    ("header_num_blocks_1e12", _header(num_blocks=10**12) + "\n" + OK,
     ["bad.jsonl:1: header num_blocks=1000000000000: out of range", "[2, 1048576 (2^20)]"]),
    ("header_block_size_1e12", _header(block_size=10**12) + "\n" + OK,
     ["bad.jsonl:1: header block_size=1000000000000: out of range", "[1, 65536 (2^16)]"]),
    ("timestamp_nan", '{"input_length": 8, "output_length": 1, "timestamp": NaN}',
     ["bad.jsonl:1: timestamp=NaN: not a finite number"]),
    ("timestamp_infinity", '{"input_length": 8, "output_length": 1, "timestamp": -Infinity}',
     ["bad.jsonl:1: timestamp=-Infinity: not a finite number"]),
    ("timestamp_1e400_overflows", '{"input_length": 8, "output_length": 1, "timestamp": 1e400}',
     ["bad.jsonl:1: timestamp=1e400: not a finite number"]),
    ("timestamp_1e300", '{"input_length": 8, "output_length": 1, "timestamp": 1e300}',
     ["bad.jsonl:1: timestamp=1e+300: arrives after scheduler step 1048576 (2^20)",
      "at ms_per_step=20 (timestamps below 20971540 ms)"]),
    # numbers of the wrong kind
    ("timestamp_bool", _request(timestamp=True),
     ["bad.jsonl:1: timestamp=true: must be a finite number of milliseconds >= 0"]),
    ("count_bool", _request(output_length=True),
     ["bad.jsonl:1: output_length=true: must be an integer in [1, 1048576 (2^20)]"]),
    ("count_not_integral", _request(input_length=8.5),
     ["bad.jsonl:1: input_length=8.5: must be an integer"]),
    ("count_negative", _request(arrival_step=-3),
     ["bad.jsonl:1: arrival_step=-3: out of range: must be an integer in [0, "]),
    ("integer_of_5000_digits", '{"input_length": ' + "9" * 5000 + ', "output_length": 1}',
     ["bad.jsonl:1: input_length=an integer of 5000 digits: too long to read"]),
    ("integer_of_4000_digits", '{"input_length": 8, "output_length": ' + "9" * 4000 + "}",
     ["bad.jsonl:1: output_length=an integer of 4000 digits: out of range"]),
    ("nested_100000_deep", '{"x": ' + "[" * 100_000 + "}",
     ["bad.jsonl:1: JSON nested too deeply to read"]),
    ("header_version_bool", '{"kvcheck_trace": true}\n' + OK,
     ["bad.jsonl:1: kvcheck_trace=true; this kvcheck reads version 1"]),
    ("header_not_first", OK + "\n" + _header(),
     ["bad.jsonl:2: a kvcheck_trace header after the first line"]),
    # header bounds
    ("header_max_num_seqs_huge", _header(max_num_seqs=2**40) + "\n" + OK,
     ["header max_num_seqs=1099511627776: out of range", "[1, 1048576 (2^20)]"]),
    ("header_max_num_batched_tokens_huge", _header(max_num_batched_tokens=2**40) + "\n" + OK,
     ["header max_num_batched_tokens=1099511627776: out of range", "16777216 (2^24)"]),
    ("header_hash_block_tokens_huge", _header(hash_block_tokens=2**20) + "\n" + OK,
     ["header hash_block_tokens=1048576: out of range", "[1, 65536 (2^16)]"]),
    ("header_ms_per_step_zero", _header(ms_per_step=0) + "\n" + OK,
     ["header ms_per_step=0: out of range", "[1, 3600000]"]),
    ("header_seed_1e30", '{"kvcheck_trace": 1, "seed": 1e30}\n' + OK,
     ["header seed=1e+30: out of range", "signed 64-bit integer"]),
    ("header_pool_fraction_nan", '{"kvcheck_trace": 1, "pool_fraction": NaN}\n' + OK,
     ["bad.jsonl:1: pool_fraction=NaN: not a finite number"]),
    # request fields
    ("prompt_and_output_past_a_request", _request(input_length=MAX_REQUEST_TOKENS - 5,
                                                  output_length=10),
     [("bad.jsonl:1: 1048571 prompt + 10 output tokens; a request holds at most 1048576 "
      "(2^20) (as kvcheck replay's max_model_len)")]),
    ("prompt_token_ids_too_many", json.dumps(
        {"prompt_token_ids": [1] * (MAX_REQUEST_TOKENS + 1), "output_length": 1}),
     ["bad.jsonl:1: prompt_token_ids=a list of 1048577 items: more than 1048576 (2^20)"]),
    ("token_id_bool", json.dumps({"prompt_token_ids": [1, True], "output_length": 1}),
     ["bad.jsonl:1: prompt_token_ids[1]=true: token ids are integers in [0, 2147483647]"]),
    ("output_token_id_float", json.dumps({"prompt_token_ids": [1], "output_token_ids": [2.0]}),
     ["bad.jsonl:1: output_token_ids[0]=2.0: token ids are integers"]),
    ("hash_id_negative", _request(hash_ids=[3, -1]),
     [("bad.jsonl:1: hash_ids[1]=-1: hash ids (one per 512-token block) are integers in "
      "[0, 9223372036854775807]")]),
    ("hash_id_past_2_63", _request(hash_ids=[2**63]),
     ["bad.jsonl:1: hash_ids[0]=9223372036854775808: hash ids"]),
    ("input_length_disagrees", json.dumps({"prompt_token_ids": [1, 2], "input_length": 5,
                                           "output_length": 1}),
     ["bad.jsonl:1: input_length=5: differs from the 2 tokens of prompt_token_ids"]),
    ("output_length_disagrees", json.dumps({"prompt_token_ids": [1], "output_token_ids": [2],
                                            "output_length": 3}),
     ["bad.jsonl:1: output_length=3: differs from the 1 tokens of output_token_ids"]),
    ("no_output", '{"input_length": 8}',
     ["bad.jsonl:1: a request needs output_token_ids or output_length"]),
    ("request_id_too_long", _request(request_id="r" * 257),
     ["bad.jsonl:1: request_id='rrrr", "must be a non-empty string of at most 256 characters"]),
    ("request_id_not_a_string", _request(request_id=7),
     ["bad.jsonl:1: request_id=7: must be a non-empty string"]),
    ("after_not_a_string", _request(request_id="a") + "\n" + _request(after=["a"]),
     ["bad.jsonl:2: after=a list of 1 items: names no earlier request"]),
    # totals, refused at the line that crosses them
    ("trace_tokens_past_2_24", _many(_request(input_length=MAX_REQUEST_TOKENS - 1), 17),
     [("bad.jsonl:17: the requests up to this line hold 17825792 tokens; a trace holds at most "
      "16777216 (2^24)")]),
    ("decode_token_steps_past_2_32", _request(input_length=16, output_length=100_000),
     [("bad.jsonl:1: decoding the requests up to this line hands out 10001600000 request "
      "tokens"), "at most 4294967296 (2^32)"]),
    ("blocks_past_2_21", _header(block_size=1) + "\n"
     + _many(_request(input_length=MAX_REQUEST_TOKENS - 1), 3),
     [("bad.jsonl:4: the requests up to this line fill 3145725 blocks of 1 tokens; a trace "
      "fills at most 2097152 (2^21)")]),
    ("hash_tokens_past_2_24", _header(hash_block_tokens=65536) + "\n" + "\n".join(
        _request(input_length=1, hash_ids=[i]) for i in range(300)),
     [("bad.jsonl:258: the hash ids up to this line stand for 257 distinct blocks of 65536 "
      "tokens"), "at most 16777216 (2^24)"]),
    ("chat_turn_delays_past_2_20", _request(request_id="a") + "\n" + "\n".join(
        _request(request_id=f"b{i}", after="a", arrival_step=600_000) for i in range(2)),
     [("bad.jsonl:3: the arrival_step delays of the requests that wait for another (after) add "
      "up to 1200000 steps"), "at most 1048576 (2^20)"]),
    ("pool_from_pool_fraction_past_2_20", _header(block_size=1) + "\n"
     + _request(input_length=1_048_000) + "\n" + _request(input_length=1000),
     [("bad.jsonl: the pool sized from pool_fraction=1.0 of the working set (1049000 blocks "
      "of 1 tokens) is 1049001 blocks; a pool holds at most 1048576 (2^20)")]),
    # the file itself
    ("not_utf8", '{"input_length": 8, "output_length": 1, "note": "\udcff"}',
     ["bad.jsonl:1: not UTF-8 text (byte 0xff at column 50)"]),
]


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8", "surrogateescape") + b"\n")
    return path


@pytest.mark.parametrize(("text", "words"), [case[1:] for case in BAD_TRACES],
                         ids=[case[0] for case in BAD_TRACES])
def test_bad_trace_names_the_line_the_field_the_limit_and_the_fix(
        tmp_path: Path, text: str, words: list[str]) -> None:
    path = _write(tmp_path / "bad.jsonl", text)
    start = time.monotonic()
    with pytest.raises(TraceFileError) as info:
        load_trace_workload(path)
    message = str(info.value).replace(f"{tmp_path}{os.sep}", "")
    for word in words:
        assert word in message
    assert info.value.fix and message.endswith(f"; fix: {info.value.fix}")
    assert "\n" not in message
    assert time.monotonic() - start < 30  # well under a second idle; the margin is for load


def test_too_many_requests_is_refused_at_the_line_past_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10**6 requests (a request is at least one replay op): checked at the line that crosses
    it (the bound lowered here so that the file stays small)."""
    monkeypatch.setattr(trace_file, "MAX_TRACE_REQUESTS", 3)
    path = _write(tmp_path / "bad.jsonl", _many(OK, 4))
    with pytest.raises(TraceFileError, match=r"bad\.jsonl:4: more than 3 requests .*; fix: "
                                             r"cut the trace"):
        load_trace_workload(path)
    assert len(load_trace_workload(_write(tmp_path / "ok.jsonl", _many(OK, 3))).requests) == 3


def test_a_file_past_256_mib_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:  # sparse: no disk space, nothing to read
        f.truncate((256 << 20) + 1)
    with pytest.raises(TraceFileError, match=r"big\.jsonl: 268435457 bytes; a trace is at most "
                                             r"268435456 bytes \(256 MiB, as kvcheck replay\)"):
        load_trace_workload(path)


def test_a_line_past_16_mib_is_refused_after_reading_16_mib(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    with path.open("wb") as f:
        f.write(b'{"input_length": 8, "output_length": 1}\n')
        f.truncate(40 << 20)  # then 40 MiB of NUL bytes and no newline
    with pytest.raises(TraceFileError, match=r"long\.jsonl:2: the line is longer than 16777216 "
                                             r"bytes .*; fix: split the line"):
        load_trace_workload(path)


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="is not a regular file"):
        load_trace_workload(tmp_path)


def test_values_at_the_bounds_load(tmp_path: Path) -> None:
    """The bounds are inclusive: a request of exactly 2**20 tokens, arrival step 2**20, the
    last timestamp before step 2**20 + 1, integral floats for counts and a byte order mark
    all load."""
    ms = 20
    last_stamp = (MAX_ARRIVAL_STEP + 1) * ms - 1
    path = tmp_path / "edge.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join([
        _header(num_blocks=2**16 + 2),
        _request(input_length=MAX_REQUEST_TOKENS - 1, output_length=1.0),
        _request(arrival_step=float(MAX_ARRIVAL_STEP)),
        _request(timestamp=last_stamp + 0.5),
    ]).encode())
    w = load_trace_workload(path)
    big, late, stamped = w.requests
    assert big.num_tokens == MAX_REQUEST_TOKENS
    assert late.arrival_step == stamped.arrival_step == MAX_ARRIVAL_STEP
    _write(tmp_path / "past.jsonl", _request(timestamp=last_stamp + 1))
    with pytest.raises(TraceFileError, match="arrives after scheduler step"):
        load_trace_workload(tmp_path / "past.jsonl")


def test_chat_turn_delays_do_not_read_as_a_stalled_implementation(tmp_path: Path) -> None:
    """Four chained turns of 1500 idle steps each: the loop's step limit counts every delay
    (it used to count only the largest, and blamed the implementation for "no progress")."""
    lines = [_request(request_id="t0", input_length=1)] + [
        _request(request_id=f"t{i}", after=f"t{i - 1}", input_length=1, arrival_step=1500)
        for i in range(1, 5)]
    w = load_trace_workload(_write(tmp_path / "chat.jsonl", "\n".join(lines)))
    impl = load_impl("reference", call_timeout=None)
    manager = impl.make_manager(KVCacheSpec(num_blocks=w.num_blocks, block_size=w.block_size),
                                guard=False)
    run = run_workload(manager, w)
    assert run.finished == 5
    assert run.steps > 4 * 1500


def test_dump_refuses_a_scale_whose_trace_would_not_load_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.jsonl"
    for scale in ("1e9", "nan", "0"):
        with pytest.raises(SystemExit) as exit_info:
            main(["dump", "burst_short", "-o", str(out), "--scale", scale])
        assert exit_info.value.code == 2
        text = capsys.readouterr().err
        assert text.startswith(f"{PROG} dump: error: argument --scale: {scale} is not a finite "
                               "number in (0, 32]") and text.count("\n") == 1, text
    with pytest.raises(SystemExit):
        main(["dump", "burst_short", "-o", str(out), "--seed", str(2**63)])
    assert "is not an int in [0, 2^63-1]" in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------ the command line
#: Runs ``trace_workload.main`` on each argument in turn, in one process, then prints the
#: exit codes and the process's peak RSS (MiB).
_RUNNER = """
import contextlib, io, json, resource, sys
from kvcheck.bench.trace_workload import main
codes, outs = [], []
for path in sys.argv[1:]:
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        codes.append(main(["inspect", path]))
    outs.append(buf.getvalue())
# VmHWM is this program's own peak: getrusage's ru_maxrss survives execve on Linux, so it
# would report the peak of the (large) pytest process that started this one.
try:
    with open("/proc/self/status", encoding="ascii") as f:
        peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except OSError:
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"codes": codes, "outs": outs, "peak_mib": peak_kib // 1024}))
"""

CLI_CASES = {
    "input_length_2e9": (_request(input_length=2_000_000_000), "input_length=2000000000"),
    "output_length_2e9": (_request(output_length=2_000_000_000), "output_length=2000000000"),
    "arrival_step_1e15": (_request(arrival_step=10**15), "arrival_step=1000000000000000"),
    "num_blocks_1e12": (_header(num_blocks=10**12) + "\n" + OK, "num_blocks=1000000000000"),
    "timestamp_nan": ('{"input_length": 8, "output_length": 1, "timestamp": NaN}',
                      "timestamp=NaN"),
    "digits_5000": ('{"input_length": ' + "7" * 5000 + ', "output_length": 1}',
                    "an integer of 5000 digits"),
    "decode_work": (_request(input_length=16, output_length=10**6), "at most 4294967296"),
    "tokens": (_many(_request(input_length=MAX_REQUEST_TOKENS - 1), 17), "at most 16777216"),
}


def test_inspect_refuses_bad_traces_in_one_line_fast_and_small(tmp_path: Path) -> None:
    """Each case (what grew to 7 GB or hung before) exits 2 with one ``error:`` line naming
    the field; all of them together stay under 30 s and a small peak RSS."""
    paths = [str(_write(tmp_path / f"{name}.jsonl", text))
             for name, (text, _) in CLI_CASES.items()]
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _RUNNER, *paths], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 30
    result = json.loads(done.stdout)
    assert result["codes"] == [2] * len(CLI_CASES)
    for (name, (_, word)), out in zip(CLI_CASES.items(), result["outs"], strict=True):
        assert out.startswith(f"{PROG}: error: {tmp_path / name}.jsonl:"), out
        assert word in out and "; fix: " in out
        assert out.count("\n") == 1, out
    assert result["peak_mib"] < 400, result["peak_mib"]  # interpreter + numpy: about 60


def test_inspect_of_a_named_pipe_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """``python -m kvcheck.bench.trace_workload inspect FIFO``: refused at once (opening a
    pipe would block until something writes to it)."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "kvcheck.bench.trace_workload", "inspect",
                           str(fifo)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr == (f"{PROG}: error: trace file {fifo} is not a regular file (a "
                           "directory, named pipe or device); a request trace is a JSON Lines "
                           "file; fix: give the path of a .jsonl file\n")


# ------------------------------------------------------------------ pytest
@pytest.fixture
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs are plain sessions even under -n (pytest-benchmark disables itself
    when it sees PYTEST_XDIST_WORKER)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


@pytest.mark.usefixtures("_not_an_xdist_worker")
@pytest.mark.parametrize(("text", "words"), [
    (_request(input_length=2_000_000_000),
     [("*--kv-bench-workload: bad.jsonl:1: input_length=2000000000: out of range: must be an "
      "integer in [[]1, 1048576 (2^20)]*"), "  Fix: give input_length between 1 and 1048576"]),
    (_header(num_blocks=10**12) + "\n" + OK,
     ["*bad.jsonl:1: header num_blocks=1000000000000: out of range*",
      "  Fix: give header num_blocks between 2 and 1048576"]),
    ('{"input_length": 8, "output_length": 1, "timestamp": Infinity}',
     ["*bad.jsonl:1: timestamp=Infinity: not a finite number*",
      "  Fix: write a finite number, or drop the field"]),
], ids=["input_length_2e9", "num_blocks_1e12", "timestamp_infinity"])
def test_pytest_stops_with_a_usage_error_before_any_benchmark(
        pytester: pytest.Pytester, text: str, words: list[str]) -> None:
    _write(pytester.path / "bad.jsonl", text)
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference", "--kv-bench",
                                "-k", "scheduler", "--kv-bench-workload=trace:bad.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(words)
    assert "passed" not in result.stdout.str() and "bench_allocator" not in result.stdout.str()


def test_a_trace_within_the_bounds_still_round_trips(tmp_path: Path) -> None:
    """The checks change nothing for a good file: a dumped scenario loads back identically."""
    original = make_workload("multi_turn_chat", seed=1, scale=0.1)
    assert load_trace_workload(dump_workload(original, tmp_path / "t.jsonl")).requests == (
        original.requests)
