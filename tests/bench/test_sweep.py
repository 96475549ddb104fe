"""The scaling sweep: axes, traces, the paired measurement and its result records."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types

import pytest

from kvcheck.bench import sweep
from kvcheck.bench.workload.scenarios import DEFAULT_BLOCK_SIZE
from kvcheck.conformance.loader import load_impl
from kvcheck.errors import KVCheckInputError
from kvcheck.results.schema import load_records, validate_record


@pytest.fixture(scope="module")
def reference():
    return load_impl("reference", call_timeout=None)


def _other(reference):
    """A second handle on the reference's code under another name and module (a paired
    sweep, as with any other implementation)."""
    module = types.ModuleType("kvcheck_sweep_other")
    module.__dict__.update(vars(reference.module))
    info = dataclasses.replace(reference.info, name="other")
    return types.SimpleNamespace(name="other", module=module, info=info,
                                 make_manager=reference.make_manager, target="other")


def test_axes_cover_the_issue_ranges_and_increase() -> None:
    assert sweep.AXES["pool_blocks"][0] == 1024 and sweep.AXES["pool_blocks"][-1] == 65536
    assert sweep.AXES["concurrency"][0] == 8 and sweep.AXES["concurrency"][-1] == 512
    assert sweep.AXES["prompt_tokens"][0] == 128 and sweep.AXES["prompt_tokens"][-1] == 8192
    for table in (sweep.AXES, sweep.QUICK_AXES):
        for axis, values in table.items():
            assert list(values) == sorted(set(values)), axis
            assert all(v & (v - 1) == 0 for v in values), f"{axis}: powers of two"
            assert sweep.BASE[axis] in values, f"{axis}: the base point is on the axis"


def test_every_full_sweep_point_fits_its_pool() -> None:
    """Every point's running requests fit in its pool at once (the base point was chosen so):
    ``concurrency * blocks per request`` below the usable pool."""
    for axis, values in sweep.AXES.items():
        for value in values:
            p = {**sweep.BASE, axis: value}
            per_request = math.ceil((p["prompt_tokens"] + sweep.OUTPUT_TOKENS)
                                    / DEFAULT_BLOCK_SIZE)
            assert p["concurrency"] * per_request < p["pool_blocks"] - 1, (axis, value)


def test_sweep_workload_is_deterministic_and_shaped() -> None:
    point = {"pool_blocks": 2048, "concurrency": 8, "prompt_tokens": 64}
    a, b = sweep.sweep_workload(point, seed=3), sweep.sweep_workload(point, seed=3)
    assert a.digest() == b.digest()
    assert sweep.sweep_workload(point, seed=4).digest() != a.digest()
    assert a.num_blocks == 2048 and a.max_num_seqs == 8
    assert len(a.requests) == 64  # max(2 * 8, 64)
    assert len(sweep.sweep_workload(point, quick=True).requests) == 16
    assert all(len(r.prompt_token_ids) == 64 and len(r.output_token_ids) == sweep.OUTPUT_TOKENS
               for r in a.requests)
    with pytest.raises(KVCheckInputError, match="does not fit"):
        sweep.sweep_workload({**point, "pool_blocks": 4})
    with pytest.raises(KVCheckInputError, match="concurrency"):
        sweep.sweep_workload({**point, "concurrency": 0})


def test_run_sweep_rejects_bad_axes(reference) -> None:
    with pytest.raises(KVCheckInputError, match="unknown sweep axis"):
        sweep.run_sweep(reference, reference, {"blocks": (1, 2)})
    with pytest.raises(KVCheckInputError, match="increase"):
        sweep.run_sweep(reference, reference, {"concurrency": (16, 8)})


TINY_BASE = {"pool_blocks": 1024, "concurrency": 4, "prompt_tokens": 32}


def test_tiny_paired_sweep_records(reference) -> None:
    other = _other(reference)
    axes = {"concurrency": (2, 4), "prompt_tokens": (16, 64)}
    seen = []
    points = sweep.run_sweep(other, reference, axes, TINY_BASE, rounds=2, warmup=0,
                             quick=True, progress=seen.append)
    assert [(p.axis, p.value) for p in points] == [("concurrency", 2), ("concurrency", 4),
                                                  ("prompt_tokens", 16), ("prompt_tokens", 64)]
    assert seen == points
    for p in points:
        assert set(p.samples) == {"impl", "ref"}
        for side in ("impl", "ref"):
            for name, _ in sweep.METRICS:
                assert len(p.samples[side][name]) == 2
                assert all(v > 0 for v in p.samples[side][name])
        assert p.ratios["ns_per_scheduled_token"] is not None
        assert p.produced["preemptions"] == 0
        assert p.params == {**TINY_BASE, p.axis: p.value}
    # Longer prompts schedule more tokens; more running requests, no fewer calls per step.
    assert points[3].produced["scheduled_tokens"] > points[2].produced["scheduled_tokens"]
    records = sweep.point_records(points, other, reference, seed=0, level="protocol",
                                  base=TINY_BASE, environment={"hardware_key": "cpu:test"})
    assert len(records) == 2 * len(points)  # one per point and subject
    for record in records:
        validate_record(record)
        assert record["kind"] == "benchmark"
        assert {m["name"] for m in record["metrics"]} == {n for n, _ in sweep.METRICS}
        for m in record["metrics"]:
            assert m["direction"] == "lower_is_better"
            assert m["case"] == f"sweep/{m['extra']['sweep_axis']}={m['extra']['sweep_value']}"
            assert m["extra"]["sweep_base"] == TINY_BASE
    impl_metric = records[0]["metrics"][0]
    assert records[0]["implementation"]["name"] == "other"
    assert "ratio_to_reference" in impl_metric["extra"]
    assert len(impl_metric["extra"]["paired_ratios"]) == 2
    assert records[1]["implementation"]["name"] == "reference"
    assert "ratio_to_reference" not in records[1]["metrics"][0]["extra"]


def test_the_base_point_is_measured_once(reference) -> None:
    axes = {"concurrency": (TINY_BASE["concurrency"],),
            "prompt_tokens": (TINY_BASE["prompt_tokens"],)}
    points = sweep.run_sweep(reference, reference, axes, TINY_BASE, rounds=1, warmup=0,
                             quick=True)
    assert [(p.axis, p.value) for p in points] == [(a, v[0]) for a, v in axes.items()]
    assert points[0].samples is points[1].samples
    assert points[1].case == f"sweep/prompt_tokens={TINY_BASE['prompt_tokens']}"


def test_quick_cli_writes_records(tmp_path, capsys, monkeypatch) -> None:
    """``--quick --axis ...`` end to end (A/A: one subject), with the report written."""
    monkeypatch.setattr(sweep, "QUICK_AXES", {**sweep.QUICK_AXES,
                                              "prompt_tokens": (128, 256)})
    out = tmp_path / "sweep.jsonl"
    assert sweep.main(["--quick", "--axis", "prompt_tokens", "--rounds", "1", "--warmup",
                       "0", "--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prompt_tokens" in text and "ns/token" in text
    records = load_records(out)
    assert len(records) == 2
    values = [r["metrics"][0]["extra"]["sweep_value"] for r in records]
    assert values == [128, 256]
    assert all(r["implementation"]["name"] == "reference" for r in records)
    json.dumps(records)  # plain JSON


def test_manager_level_without_hook_says_so(capsys, monkeypatch) -> None:
    ref_module = sys.modules["kvcheck.adapters.reference"]
    monkeypatch.delattr(ref_module, "make_native_manager", raising=False)
    assert sweep.main(["--quick", "--level", "manager"]) == 2
    assert "manager level not reported" in capsys.readouterr().err
