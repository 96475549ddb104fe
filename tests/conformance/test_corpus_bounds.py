"""Bounded recorded corpora (``kvcheck.conformance.recorded.load_corpus`` and the benchmark's
``load_recorded_workload``): a decompression bomb, header strings and numbers that cannot be
printed or recorded, values too large to print, and corpora past the benchmark's bounds are
refused before anything runs, naming the file, the trace and the limit; never a traceback,
a hang or gigabytes of memory."""

from __future__ import annotations

import copy
import gc
import lzma
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cbor2
import pytest

import kvcheck.bench.replay.recorded as recorded_bench
from kvcheck.bench.replay.recorded import load_recorded_workload
from kvcheck.conformance.bounds import MAX_REQUEST_TOKENS
from kvcheck.conformance.protocol import VLLM_PROFILES
from kvcheck.conformance.recorded import (
    FORMAT,
    FORMAT_VERSION,
    MAX_CBOR_RATIO,
    CorpusError,
    corpus_path,
    decode_corpus,
    load_corpus,
    shipped_corpus,
)


def _one_trace() -> dict[str, Any]:
    """A valid corpus of the first shipped trace (a deep copy, free to edit)."""
    shipped = shipped_corpus("vllm-0.33")
    trace = copy.deepcopy(shipped["traces"][0])
    return {"format": FORMAT, "format_version": FORMAT_VERSION,
            "header": {**shipped["header"], "traces": 1, "steps": len(trace["steps"])},
            "traces": [trace]}


def _xz(corpus: object) -> bytes:
    return lzma.compress(cbor2.dumps(corpus))


def _bomb(n: int = 8 << 20) -> bytes:
    """A CBOR array of ``n`` empty arrays, xz-compressed: ~1.4 KB for 8 MiB (decoded, it
    would take about 600 MB and 8 s; 512 MiB of it, 37 GB)."""
    return lzma.compress(b"\x9b" + n.to_bytes(8, "big") + b"\x80" * n)


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path: Path) -> None:
    data = _bomb()
    start = time.monotonic()
    with pytest.raises(CorpusError, match=r"mem: decompresses to more than 4194304 bytes \(a "
                                          r"corpus decompresses to at most 32x its file's \d+ "
                                          r"bytes, or 4194304 bytes, .*decompression bomb"):
        decode_corpus(data, "mem")
    path = tmp_path / "bomb.cbor.xz"
    path.write_bytes(data)
    with pytest.raises(CorpusError, match=r"bomb\.cbor\.xz: decompresses to more than"):
        load_corpus(path)
    assert time.monotonic() - start < 20  # under a second idle; decoding it took minutes


def test_the_shipped_corpora_are_far_below_the_ratio_bound() -> None:
    for profile in VLLM_PROFILES:
        data = corpus_path(profile).read_bytes()
        assert len(lzma.decompress(data)) < MAX_CBOR_RATIO / 2 * len(data)
        load_corpus(corpus_path(profile))



@pytest.mark.parametrize("collecting", [True, False])
def test_decoding_leaves_the_collector_as_it_found_it(collecting: bool) -> None:
    """The decode runs with the collector paused (a corpus is ~300k containers and no
    garbage); it is on again afterwards, after a refused corpus too, and stays off for a
    caller that had turned it off."""
    corpus = _one_trace()
    broken = copy.deepcopy(corpus)
    broken["traces"][0]["steps"][3]["answer"] = "no"
    was = gc.isenabled()
    if not collecting:
        gc.disable()
    try:
        data = _xz(corpus)
        ran: list[object] = []  # collections during the decode (thousands of containers)
        gc.callbacks.append(lambda phase, info: ran.append(info))
        assert decode_corpus(data, "mem") == corpus
        assert ran == []
        with pytest.raises(CorpusError, match=r"steps\[3\] \(step #4\): answer 'no'"):
            decode_corpus(_xz(broken), "mem")
        assert gc.isenabled() is collecting
    finally:
        gc.callbacks.pop()
        if was:
            gc.enable()


def _refused(corpus: dict[str, Any], match: str) -> None:
    with pytest.raises(CorpusError, match=match) as info:
        decode_corpus(_xz(corpus), "mem")
    assert "\n" not in str(info.value) and len(str(info.value)) < 600


@pytest.mark.parametrize(("key", "value", "match"), [
    ("impl", "vllm\n\x1b[2Jfake verdict", (r"mem: header\.impl='vllm\\n\\x1b\[2Jfake verdict': "
     r"holds control or format characters \(U\+000A \(Cc\), U\+001B \(Cc\)\)")),
    ("impl_version", "0.33\u202e", r"header\.impl_version=.*U\+202E \(Cf\)"),
    ("target", "x" * 1001, (r"mem: header\.target: 1001 characters; a header string has at most "
     r"1000")),
    ("seed", 10**5000, (r"mem: header\.seed=an integer of 5001 digits: must be in "
     r"\[-2\^63, 2\^63\)")),
    ("seed", 2**63, r"header\.seed=9223372036854775808: must be in"),
    ("steps", 10**5000, r"mem: the header counts an integer of 5001 digits steps"),
    ("kvcheck_version", ["0.1"] * 10**5, (r"mem: header\.kvcheck_version=\['0\.1', .*: expected "
     r"str$")),
], ids=["impl_control_characters", "impl_version_bidi_override", "target_too_long",
        "seed_5000_digits", "seed_past_int64", "steps_5000_digits", "version_huge_list"])
def test_header_fields_that_cannot_be_printed_or_recorded(key: str, value: object,
                                                          match: str) -> None:
    corpus = _one_trace()
    corpus["header"][key] = value
    _refused(corpus, match)


def test_values_too_long_to_print_are_named_not_a_traceback() -> None:
    """A state field holding a 5000-digit integer (``str()`` of it raises ValueError) and a
    state map with keys of mixed types (``sorted()`` of them raises TypeError)."""
    corpus = _one_trace()
    corpus["traces"][0]["steps"][1]["state"]["free"] = -(10**5000)
    _refused(corpus, r"steps\[1\] \(step #2\): state field 'free' is malformed: \(a value "
                     r"holding an integer too long to print\)")
    corpus = _one_trace()
    corpus["traces"][0]["steps"][1]["state"] = {1: 2, "free": 3}
    _refused(corpus, r"steps\[1\] \(step #2\): state \['1', 'free'\]: a map of the trace's "
                     r"fields")


# ------------------------------------------------------------------ as a benchmark
def _decode_heavy() -> dict[str, Any]:
    """A corpus ``load_corpus`` accepts (every op within kvcheck replay's bounds) whose replay
    would copy 2**32 request tokens into views: a request of 2**20 tokens then 4100 decode
    ops of 0 tokens (each re-snapshots the whole request)."""
    corpus = _one_trace()
    add = {"op": "add", "rid": "r", "prompt": [1]}
    ops = [add, {"op": "schedule", "rid": "r", "num_tokens": 1},
           {"op": "decode", "rid": "r", "num_tokens": MAX_REQUEST_TOKENS - 1}] + [
        {"op": "decode", "rid": "r", "num_tokens": 0}] * 4100
    trace = corpus["traces"][0]
    trace["fields"] = []
    trace["steps"] = [{"op": op, "answer": {}, "state": {}} for op in ops]
    corpus["header"]["steps"] = len(ops)
    return corpus


def test_a_corpus_past_the_decode_bound_is_refused_as_a_benchmark(tmp_path: Path) -> None:
    path = tmp_path / "heavy.cbor.xz"
    path.write_bytes(_xz(_decode_heavy()))
    assert load_corpus(path)["header"]["steps"] == 4103  # fine as a corpus ...
    with pytest.raises(CorpusError, match=r"heavy\.cbor\.xz: traces\[0\] \(t00-\S+\): "
                                          r"replaying the traces up to this one hands out \d+ "
                                          r"request tokens .*at most 4294967296 \(2\^32\)"):
        load_recorded_workload(path)  # ... not as a benchmark


def test_a_corpus_past_the_step_bound_is_refused_as_a_benchmark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10**6 steps in all (every round replays them; the bound lowered here so that the
    file stays small): refused at the trace that crosses it."""
    path = tmp_path / "two.cbor.xz"
    corpus = _one_trace()
    corpus["traces"].append(copy.deepcopy(corpus["traces"][0]))
    corpus["traces"][1]["name"] = "second"
    corpus["header"].update(traces=2, steps=2 * corpus["header"]["steps"])
    path.write_bytes(_xz(corpus))
    steps = len(corpus["traces"][0]["steps"])
    monkeypatch.setattr(recorded_bench, "MAX_OPS", steps + 1)
    with pytest.raises(CorpusError, match=rf"two\.cbor\.xz: traces\[1\] \(second\): the traces "
                                          rf"up to this one hold {2 * steps} steps; a corpus "
                                          rf"replayed as a benchmark holds at most {steps + 1}"):
        load_recorded_workload(path)
    monkeypatch.setattr(recorded_bench, "MAX_OPS", 2 * steps)
    assert len(load_recorded_workload(path)["traces"]) == 2


def test_inspect_and_pytest_refuse_a_bomb_before_any_benchmark(
        tmp_path: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    bomb = pytester.path / "bomb.cbor.xz"
    bomb.write_bytes(_bomb())
    done = subprocess.run([sys.executable, "-m", "kvcheck.bench.trace_workload", "inspect",
                           str(bomb)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"python -m kvcheck.bench.trace_workload: error: {bomb}: "
                                  "decompresses to more than 4194304 bytes")
    assert done.stderr.count("\n") == 1
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference", "--kv-bench",
                                "-k", "scheduler", "--kv-bench-workload=trace:bomb.cbor.xz")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("*--kv-bench-workload: bomb.cbor.xz: decompresses to more "
                                 "than 4194304 bytes*")])
    assert "passed" not in result.stdout.str()


def test_a_named_pipe_named_as_a_corpus_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """``inspect PIPE.cbor.xz`` (and ``--kv-bench-workload=trace:PIPE.cbor.xz``, ``kvcheck
    record --check PIPE``): refused at once, where reading would block until a writer came."""
    fifo = tmp_path / "pipe.cbor.xz"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "kvcheck.bench.trace_workload", "inspect",
                           str(fifo)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stderr == (f"python -m kvcheck.bench.trace_workload: error: {fifo}: not a "
                           "regular file (a directory, named pipe or device); a corpus is a "
                           ".cbor.xz file kvcheck record writes\n")
    with pytest.raises(CorpusError, match="not a regular file"):
        load_corpus(tmp_path)
