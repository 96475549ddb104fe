"""The --kv-bench plugin seen from the command line (pytester): options, usage errors, the
shipped suite at a tiny scale, the printed tables, the result records and pytest-benchmark's
JSON."""

from __future__ import annotations

import json
import os

import numpy as np  # noqa: F401  (see below)
import pytest

import kvcheck.adapters.reference
import kvcheck.bench.bench_allocator
from kvcheck.results.schema import load_records

# pytester's in-process runs drop the modules they imported when they end; numpy and torch
# refuse to be imported twice in one process, so what the benchmarks import is imported here.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton's first import
    import triton  # noqa: F401

    import kvcheck.bench.kernels.measure
    import kvcheck.gpu_kernels.conformance
    import kvcheck.gpu_kernels.reference  # noqa: F401

    HAS_TORCH, HAS_CUDA = True, torch.cuda.is_available()
except ImportError:
    HAS_TORCH = HAS_CUDA = False



@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process runs are plain pytest sessions even when this file runs under -n:
    pytest-benchmark disables itself when it sees PYTEST_XDIST_WORKER."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


TINY = ("-p", "no:cacheprovider", "--kv-impl=reference", "--kv-bench", "--kv-bench-scale=0.03",
        "--kv-bench-rounds=1", "--kv-bench-warmup=0")


def test_help_lists_every_option(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*kvcheck benchmarks (needs pytest-benchmark)*",
        "*--kv-bench *run kvcheck's benchmarks*",
        "*--kv-bench-scale=F*",
        "*--kv-bench-seed=N*",
        "*--kv-bench-rounds=N*",
        "*--kv-bench-warmup=N*",
        "*--kv-bench-device=*",
        "*--kv-bench-l2=*",
        "*--kv-bench-peak-gbps=GBPS*",
        "*--kv-bench-workload=NAME|trace:PATH*",
        "*--kv-bench-report=PATH*",
    ])


@pytest.mark.parametrize(("args", "message"), [
    (("--kv-bench-scale=0",), "*--kv-bench-scale: 0 is not a finite number in (0, 64]*"),
    (("--kv-bench-rounds=0",), "*--kv-bench-rounds: 0 is not an int in ?1, 10000? (*"),
    (("--kv-bench", "-p", "no:benchmark"), "*--kv-bench needs pytest-benchmark*"),
    (("--kv-bench", "-n", "2"), "*--kv-bench runs benchmarks one at a time*"),
    (("--kv-bench", "--kv-bench-workload=nope"),
     ("*--kv-bench-workload: unknown workload 'nope': give a built-in scenario (*) or "
     "trace:PATH*")),
    (("--kv-bench", "--kv-bench-workload=trace:missing.jsonl"),
     "*--kv-bench-workload: trace file missing.jsonl does not exist*"),
    (("--kv-bench", "--kv-bench-workload=trace:"), "*no file after 'trace:'*"),
    (("--kv-bench", "--kv-bench-workload=trace:missing.cbor.xz"),
     "*--kv-bench-workload: missing.cbor.xz: cannot read the corpus*"),
])
def test_bad_invocations_are_usage_errors(pytester: pytest.Pytester, args, message) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_without_kv_bench_the_conformance_suite_is_collected(pytester: pytest.Pytester) -> None:
    """The bench plugin leaves `pytest --kv-impl=X` (no --kv-bench) alone."""
    result = pytester.runpytest("-p", "no:cacheprovider", "--kv-impl=reference",
                                "--collect-only", "-q")
    assert "test_allocation.py" in result.stdout.str()
    assert "bench_allocator.py" not in result.stdout.str()


def test_tiny_run_prints_tables_and_writes_records(pytester: pytest.Pytester) -> None:
    """`pytest --kv-impl=reference --kv-bench` on a tiny scale: the allocator benchmarks pass,
    kernel benchmarks skip with the reason (no CUDA here), tables are printed, no conformance
    verdict appears, and both result files carry the figures."""
    result = pytester.runpytest(*TINY, "--kv-bench-report=out/records.jsonl",
                                "--benchmark-json=pb.json", "-k", "not kernels or store_kv_cache")
    # Skipped: the kernel benchmarks (no CUDA), the indexer's (an index benchmark) and the
    # wire round trip (an exec: engine's).
    result.assert_outcomes(passed=17, skipped=None if HAS_CUDA else 12)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*kvcheck bench: scheduler loop through the adapter protocol*",
        "*implementation*scenario*tokens/s*x ref*alloc calls/s*us/call p50*p99*prefix hit*",
        "*reference*shared_system_prompt*1.00x*",
        "*reference*eviction_pressure*",
        "*kvcheck bench: hashing, slot_mapping, event_wire, event_decode, indexer, offload*",
        "*event_wire[[]eviction_pressure[]]*events_encoded_per_s*events/s*1.00x*",
        "*event_decode[[]eviction_pressure[]]*payloads_decoded_per_s*batches/s*1.00x*",
        "*hashing[[]sha256_cbor[]]*hash_blocks_per_s*blocks/s*1.00x*",
        "*slot_mapping*vectorized_slot_mapping_tokens_per_s*",
        "*result records written to out/records.jsonl*",
    ])
    assert "kvcheck conformance" not in out and "verdict:" not in out
    if not HAS_CUDA:
        assert "skipped: no CUDA device: kernel benchmarks time CUDA kernels" in out

    records = load_records(pytester.path / "out" / "records.jsonl")
    (record,) = records
    assert record["kind"] == "benchmark" and record["implementation"]["name"] == "reference"
    metric = next(m for m in record["metrics"]
                  if m["case"] == "scheduler/burst_short" and m["name"] == "allocate_slots_us_p99")
    assert metric["unit"] == "us" and metric["direction"] == "lower_is_better"
    assert len(metric["samples"]) == 1 and metric["extra"]["ratio_to_reference"] == 1.0
    assert record["environment"]["torch"] is not None or not HAS_TORCH
    assert "kvcheck_commit" in record["environment"]
    names = {(m["case"], m["name"]) for m in record["metrics"]}
    assert ("hashing/xxhash", "hash_blocks_per_s") in names
    assert ("event_wire/eviction_pressure", "payload_bytes_per_s") in names
    assert record["extra"]["options"]["scale"] == 0.03

    data = json.loads((pytester.path / "pb.json").read_text())
    assert data["machine_info"]["kvcheck"]["hardware_key"] == record["environment"][
        "hardware_key"]
    bench = next(b for b in data["benchmarks"] if b["name"].endswith("burst_short]"))
    assert bench["extra_info"]["scheduled_tokens_per_s_unit"] == "tokens/s"
    assert bench["extra_info"]["digest"]
    assert bench["options"]["timer"].endswith("allocator_time")


def test_trace_workloads_replace_the_scenarios(pytester: pytest.Pytester) -> None:
    """--kv-bench-workload: a request trace file, a recorded corpus (two traces of the shipped
    vLLM 0.33 one) and a scenario name become test_scheduler's cases, in that order; each
    record names its case ``trace:<file name>`` and carries what the trace produced."""
    from kvcheck.bench.workload.request_trace import dump_workload
    from kvcheck.bench.workload.scenarios import make_workload
    from kvcheck.conformance.recorded import (
        FORMAT,
        FORMAT_VERSION,
        encode_corpus,
        shipped_corpus,
        write_corpus,
    )

    dump_workload(make_workload("shared_system_prompt", scale=0.05), pytester.path / "ssp.jsonl")
    shipped = shipped_corpus("vllm-0.33")
    traces = shipped["traces"][:2]
    header = {**shipped["header"], "traces": 2, "steps": sum(len(t["steps"]) for t in traces)}
    write_corpus(pytester.path / "two.cbor.xz", encode_corpus(
        {"format": FORMAT, "format_version": FORMAT_VERSION, "header": header,
         "traces": traces}))
    result = pytester.runpytest(*TINY, "--kv-bench-workload=trace:ssp.jsonl",
                                "--kv-bench-workload=trace:two.cbor.xz",
                                "--kv-bench-workload=burst_short", "-k", "test_scheduler",
                                "--kv-bench-report=r.jsonl", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "*test_scheduler?reference-trace:ssp.jsonl? PASSED*",
        "*test_scheduler?reference-trace:two.cbor.xz? PASSED*",
        "*test_scheduler?reference-burst_short? PASSED*",
        "*trace:ssp.jsonl: prompt tokens*shared prefix*hit rate*preemptions*",
    ])
    (record,) = load_records(pytester.path / "r.jsonl")
    cases = {m["case"] for m in record["metrics"]}
    assert {"scheduler/trace:ssp.jsonl", "scheduler/trace:two.cbor.xz",
            "scheduler/burst_short"} <= cases
    bench = {b["case"]: b for b in record["extra"]["benchmarks"]}
    assert bench["trace:ssp.jsonl"]["info"]["produced"]["shared_prefix_fraction"] > 0.5
    assert bench["trace:two.cbor.xz"]["info"]["traces_run"] == 2


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch (the kernels extra)")
def test_cpu_device_times_the_torch_references(pytester: pytest.Pytester) -> None:
    """--kv-bench-device=cpu: the torch references run, labelled cpu, with the copy peak;
    every other provider skips with the reason."""
    result = pytester.runpytest(*TINY, "--kv-bench-device=cpu", "-k", "kernels",
                                "--kv-bench-report=k.jsonl")
    result.assert_outcomes(passed=3, skipped=12)
    result.stdout.fnmatch_lines([
        "*kvcheck bench: kernels on the CPU (torch references, host-timed)*",
        "*store_kv_cache*decode-b16*torch_ref*cpu*",
        "*paged_attention_decode*torch_ref*cpu*",
        "*measured copy peak*GB/s*",
        "*12 skipped: --kv-bench-device=cpu times only the torch references*",
    ])
    (record,) = load_records(pytester.path / "k.jsonl")
    assert record["implementation"]["name"] == "torch_ref"
    assert {m["name"] for m in record["metrics"]} == {"time_us", "gbps", "pct_copy_peak"}
    assert record["extra"]["kernel_device"]["device"] == "cpu"
