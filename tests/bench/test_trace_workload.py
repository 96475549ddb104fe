"""Trace files as workloads (``--kv-bench-workload=trace:PATH``): the three request shapes,
the header, exact round trips of the built-in scenarios, and every kind of bad file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcheck.bench.replay.scheduler import run_workload
from kvcheck.bench.trace_workload import main
from kvcheck.bench.workload.request_trace import dump_workload, load_trace_workload
from kvcheck.bench.workload.scenarios import make_workload, trace_profile
from kvcheck.bench.workload.source import trace_path
from kvcheck.bench.workload.trace_file import TraceFileError
from kvcheck.conformance.loader import load_impl
from kvcheck.conformance.protocol import KVCacheSpec


def _write(path: Path, *objects: object) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


def _replay(workload):  # type: ignore[no-untyped-def]
    impl = load_impl("reference", call_timeout=None)
    spec = KVCacheSpec(num_blocks=workload.num_blocks, block_size=workload.block_size)
    return run_workload(impl.make_manager(spec, guard=False), workload)


@pytest.mark.parametrize("scenario", ["multi_turn_chat", "eviction_pressure"])
def test_a_dumped_scenario_loads_back_and_replays_identically(tmp_path: Path,
                                                              scenario: str) -> None:
    """dump -> load gives the same requests (chat turns' ``after`` included) and limits, and
    the scheduler loop produces the same counts on it (eviction_pressure: a 25 % pool and its
    preemptions survive the trip through ``num_blocks``)."""
    original = make_workload(scenario, seed=3, scale=0.25)
    loaded = load_trace_workload(dump_workload(original, tmp_path / "t.jsonl"))
    assert loaded.requests == original.requests
    assert (loaded.num_blocks, loaded.max_num_seqs, loaded.max_num_batched_tokens,
            loaded.block_size, loaded.working_set_blocks) == (
        original.num_blocks, original.max_num_seqs, original.max_num_batched_tokens,
        original.block_size, original.working_set_blocks)
    assert loaded.scenario == "trace:t.jsonl"
    a, b = _replay(original), _replay(loaded)
    assert (a.scheduled_tokens, a.hit_tokens, a.preemptions, a.steps, a.finished) == (
        b.scheduled_tokens, b.hit_tokens, b.preemptions, b.steps, b.finished)


def test_mooncake_hash_ids_share_content_and_hit_in_the_cache(tmp_path: Path) -> None:
    """Equal hash ids are equal 512-token blocks: B shares A's first two (1024 tokens), so
    64 of B's 96 full 16-token blocks repeat A's, and the replay hits exactly 1024 tokens.
    Timestamps become steps at 20 ms per step."""
    path = _write(tmp_path / "mooncake.jsonl",
                  {"timestamp": 0, "input_length": 1500, "output_length": 2,
                   "hash_ids": [1, 2, 3]},
                  {"timestamp": 1000, "input_length": 1536, "output_length": 3,
                   "hash_ids": [1, 2, 4]})
    w = load_trace_workload(path)
    a, b = w.requests
    assert (len(a.prompt_token_ids), len(b.prompt_token_ids)) == (1500, 1536)
    assert a.prompt_token_ids[:1024] == b.prompt_token_ids[:1024]
    assert a.prompt_token_ids[1024:1040] != b.prompt_token_ids[1024:1040]
    assert (a.arrival_step, b.arrival_step) == (0, 50)
    assert (len(a.output_token_ids), len(b.output_token_ids)) == (2, 3)
    assert trace_profile(w.requests, 16)["shared_prefix_fraction"] == pytest.approx(64 / 189)
    run = _replay(w)
    assert run.hit_tokens == 1024
    assert run.queried_tokens == 1500 + 1536
    assert run.finished == 2


def test_header_sets_the_pool_limits_and_hash_block(tmp_path: Path) -> None:
    """Header options reach the workload; hash ids cover ``hash_block_tokens`` tokens; short
    id lists are padded with private tokens; lengths-only lines share nothing."""
    path = _write(tmp_path / "t.jsonl",
                  {"kvcheck_trace": 1, "block_size": 32, "num_blocks": 40,
                   "max_num_seqs": 4, "max_num_batched_tokens": 256, "hash_block_tokens": 64,
                   "ms_per_step": 100, "seed": 5},
                  {"request_id": "x", "timestamp": 250, "input_length": 100,
                   "output_length": 1, "hash_ids": [9]},
                  {"request_id": "y", "input_length": 100, "output_length": 1,
                   "hash_ids": [9]},
                  {"request_id": "z", "arrival_step": 7, "input_length": 100,
                   "output_length": 4, "after": "x"})
    w = load_trace_workload(path)
    x, y, z = w.requests
    assert (w.block_size, w.num_blocks, w.max_num_seqs, w.max_num_batched_tokens,
            w.seed) == (32, 40, 4, 256, 5)
    assert x.prompt_token_ids[:64] == y.prompt_token_ids[:64]
    assert x.prompt_token_ids[64:] != y.prompt_token_ids[64:]  # private padding
    assert z.prompt_token_ids[:64] != x.prompt_token_ids[:64]  # no hash ids: private
    assert (x.arrival_step, y.arrival_step, z.arrival_step, z.after) == (2, 0, 7, "x")
    # Another seed draws other tokens for the same hash id.
    other = _write(tmp_path / "u.jsonl", {"kvcheck_trace": 1, "hash_block_tokens": 64},
                   {"input_length": 64, "output_length": 1, "hash_ids": [9]})
    assert load_trace_workload(other).requests[0].prompt_token_ids != x.prompt_token_ids[:64]


def test_pool_fraction_sizes_the_pool_from_the_working_set(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", {"kvcheck_trace": 1, "pool_fraction": 0.5},
                  *({"input_length": 320, "output_length": 1} for _ in range(10)))
    w = load_trace_workload(path)
    assert w.working_set_blocks == 10 * 20
    assert w.num_blocks == 1 + 100


@pytest.mark.parametrize(("lines", "message"), [
    ([], "no request lines"),
    (["not json"], ":1: not JSON"),
    ([[1, 2]], ":1: expected a JSON object per line, got list"),
    ([{"output_length": 3}], ":1: a request needs prompt_token_ids, or input_length"),
    ([{"input_length": 0, "output_length": 3}],
     "input_length=0: out of range: must be an integer in [1,"),
    ([{"input_length": 8, "output_length": 0}], "samples at least one token"),
    ([{"prompt_token_ids": [1, -2], "output_length": 1}],
     "prompt_token_ids[1]=-2: token ids are integers in [0, 2147483647]"),
    ([{"prompt_token_ids": [1, 2**31], "output_length": 1}],
     "prompt_token_ids[1]=2147483648: token ids are integers"),
    ([{"prompt_token_ids": [], "output_length": 1}], "prompt_token_ids is empty"),
    ([{"prompt_token_ids": [1], "output_token_ids": []}], "output_token_ids is empty"),
    ([{"input_length": 8, "output_length": 1, "hash_ids": "12"}], "hash_ids='12': must be a list"),
    ([{"input_length": 8, "output_length": 1, "timestamp": -1}],
     "timestamp=-1: must be a finite number"),
    ([{"input_length": 8, "output_length": 1, "arrival_step": 1.5}],
     "arrival_step=1.5: must be an integer"),
    ([{"request_id": "a", "input_length": 8, "output_length": 1},
      {"request_id": "a", "input_length": 8, "output_length": 1}], ":2: request_id 'a' is used"),
    ([{"request_id": "a", "input_length": 8, "output_length": 1, "after": "b"}],
     "after='b': names no earlier request"),
    ([{"kvcheck_trace": 2}, {"input_length": 8, "output_length": 1}], "reads version 1"),
    ([{"kvcheck_trace": 1, "blocksize": 16}, {"input_length": 8, "output_length": 1}],
     "unknown header option(s) blocksize"),
    ([{"kvcheck_trace": 1, "block_size": 0}, {"input_length": 8, "output_length": 1}],
     "header block_size=0: out of range: must be an integer in [1, 65536"),
    ([{"kvcheck_trace": 1, "pool_fraction": 1.5}, {"input_length": 8, "output_length": 1}],
     "header pool_fraction=1.5: must lie in (0, 1]"),
    ([{"kvcheck_trace": 1, "num_blocks": 3}, {"input_length": 64, "output_length": 1}],
     ("num_blocks=3 cannot hold the largest request (5 blocks of 16 tokens plus the null "
     "block); raise it to at least 6")),  # 64 prompt + 1 output tokens
])
def test_bad_files_name_the_line_and_the_fix(tmp_path: Path, lines: list[object],
                                             message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    with pytest.raises(TraceFileError) as info:
        load_trace_workload(path)
    assert message in str(info.value)
    assert "bad.jsonl" in str(info.value)


def test_missing_file_and_empty_value(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError, match="does not exist; --kv-bench-workload=trace:PATH"):
        load_trace_workload(tmp_path / "nope.jsonl")
    with pytest.raises(TraceFileError, match="no file after 'trace:'"):
        trace_path("trace:")
    assert trace_path("trace:a/b.jsonl") == Path("a/b.jsonl")


def test_command_line_dump_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    out = tmp_path / "ssp.jsonl"
    assert main(["dump", "shared_system_prompt", "--scale", "0.1", "-o", str(out)]) == 0
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "trace:ssp.jsonl: 13 requests" in text
    assert "shared-prefix fraction of full prompt blocks: 0.8" in text
    assert main(["inspect", str(tmp_path / "missing.jsonl")]) == 2
    assert "python -m kvcheck.bench.trace_workload: error: trace file" in capsys.readouterr().err


def test_stability_script_takes_trace_files(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m kvcheck.bench.stability --scenarios trace:...`` times a request trace at
    both levels and a recorded corpus at the protocol level (it has no scheduler loop to
    split, which ``--layers`` says)."""
    from kvcheck.bench import stability
    from kvcheck.conformance.recorded import (
        FORMAT,
        FORMAT_VERSION,
        encode_corpus,
        shipped_corpus,
        write_corpus,
    )

    trace = dump_workload(make_workload("burst_short", scale=0.05), tmp_path / "b.jsonl")
    shipped = shipped_corpus("vllm-0.10")
    traces = shipped["traces"][:1]
    corpus = write_corpus(tmp_path / "one.cbor.xz", encode_corpus(
        {"format": FORMAT, "format_version": FORMAT_VERSION,
         "header": {**shipped["header"], "traces": 1, "steps": len(traces[0]["steps"])},
         "traces": traces}))
    assert stability.main(["--level", "both", "--scenarios", f"trace:{trace}",
                           f"trace:{corpus}", "--hash-algos", "--rounds", "2", "--warmup",
                           "0", "--runs", "1", "--layers", "--tolerance", "100"]) == 0
    out = capsys.readouterr().out
    assert "scheduler/trace:b.jsonl " in out and "scheduler/trace:b.jsonl @manager" in out
    assert "scheduler/trace:one.cbor.xz " in out
    assert "scheduler/trace:one.cbor.xz @manager" not in out
    assert "trace:one.cbor.xz      (a recorded corpus: no scheduler loop to split)" in out
