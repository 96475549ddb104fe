"""The record schema: what loads, what is rejected (naming the field), the benchmark-record
helpers and atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.results.environment import collect_environment, software_versions
from kvcheck.results.io import write_records
from kvcheck.results.schema import (
    RecordError,
    load_records,
    make_benchmark_record,
    make_metric,
    metric_key,
    validate_record,
)


def test_valid_records_round_trip(rec: SimpleNamespace, tmp_path: Path) -> None:
    records = [rec.conformance(), rec.benchmark("mine", [rec.metric("t", [1, 2, 3])])]
    path = write_records(tmp_path / "r.jsonl", records)
    assert load_records(path) == records


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(schema_version=2), "schema_version 2 is newer than this kvcheck"),
        (lambda r: r.update(schema_version=0), "field 'schema_version' must be >= 1"),
        (lambda r: r.pop("implementation"), "missing field 'implementation'"),
        (lambda r: r["implementation"].update(version=3), "field 'version' must be str"),
        (lambda r: r.update(kind="bench"), "field 'kind' must be one of"),
        (lambda r: r.update(timestamp="yesterday"), "field 'timestamp' must be an ISO 8601"),
        (lambda r: r["environment"].pop("hardware_key"), "missing field 'hardware_key'"),
        (lambda r: r["outcomes"].update({"t.py::x": "green"}), "outcomes['t.py::x']"),
        (lambda r: r.update(conforms="yes"), "field 'conforms' must be bool"),
        (lambda r: r.update(metrics=[{"name": "t", "unit": "us", "direction": "down",
                                      "value": 1}]), "field 'direction' must be one of"),
        (lambda r: r.update(metrics=[{"name": "t", "unit": "us",
                                      "direction": "lower_is_better", "value": 1,
                                      "samples": [1, "2"]}]), "samples[1] is '2'"),
        (lambda r: r.update(metrics=[{"name": "t", "unit": "us",
                                      "direction": "lower_is_better", "value": 1}] * 2),
         "metrics[1] repeats metric 't'"),
    ],
)
def test_invalid_records_name_the_field(rec: SimpleNamespace, mutate, message: str) -> None:
    record = rec.conformance()
    mutate(record)
    with pytest.raises(RecordError, match="^where: .*") as info:
        validate_record(record, "where")
    assert message in str(info.value)


def test_benchmark_record_needs_a_metric(rec: SimpleNamespace) -> None:
    with pytest.raises(RecordError, match="'metrics' must hold at least one metric"):
        validate_record(rec.benchmark("mine", []))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"schema_version": 1, "kind": ', "r.jsonl:2: not valid JSON"),
        ("[1, 2]", "r.jsonl:2: a record must be a JSON object, got list"),
        ('{"schema_version": NaN}', "r.jsonl:2: not valid JSON (NaN is not allowed"),
    ],
)
def test_corrupted_lines_name_file_and_line(rec: SimpleNamespace, text: str,
                                            message: str) -> None:
    path = rec.write("r.jsonl", rec.conformance())
    path.write_text(path.read_text() + text + "\n")
    with pytest.raises(RecordError) as info:
        load_records(path)
    assert message in str(info.value)


def test_nan_sample_is_rejected(rec: SimpleNamespace, tmp_path: Path) -> None:
    line = json.dumps(rec.benchmark("m", [rec.metric("t", [1.0, 2.0, 3.0])]))
    path = tmp_path / "r.jsonl"
    path.write_text(line.replace("2.0", "NaN") + "\n")
    with pytest.raises(RecordError, match="NaN is not allowed"):
        load_records(path)


def test_empty_binary_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(RecordError, match="empty.jsonl: no records"):
        load_records(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(RecordError, match="bin.jsonl: not a UTF-8 text file"):
        load_records(tmp_path / "bin.jsonl")
    with pytest.raises(RecordError, match="nope.jsonl: cannot read"):
        load_records(tmp_path / "nope.jsonl")


def test_make_metric_defaults_to_median_and_quartiles() -> None:
    """Samples 1..5: median 3; inclusive quartiles 2 and 4."""
    m = make_metric("us_per_call", "us", "lower", [5, 1, 4, 2, 3], case="alloc/b16")
    assert (m["value"], m["stat"], m["lower"], m["upper"]) == (3.0, "median", 2.0, 4.0)
    assert m["direction"] == "lower_is_better" and m["samples"] == [5.0, 1.0, 4.0, 2.0, 3.0]
    assert metric_key(m) == "alloc/b16/us_per_call"
    assert metric_key(make_metric("gbps", "GB/s", "higher", value=900.0)) == "gbps"
    with pytest.raises(RecordError, match="give a value or at least one sample"):
        make_metric("t", "us", "lower")
    with pytest.raises(RecordError, match="'direction' must be one of"):
        make_metric("t", "us", "sideways", [1.0])


def test_make_benchmark_record_is_valid_and_carries_the_environment() -> None:
    impl = SimpleNamespace(name="mine", target="pkg.mod", module=SimpleNamespace(__name__="pkg.mod"),
                           info=SimpleNamespace(version="2.0", commit="abc",
                                                capabilities=frozenset({"manager"})))
    record = make_benchmark_record(impl, [make_metric("t", "us", "lower", [1.0, 2.0])],
                                   profile="vllm-0.33", seed=3, extra={"benchmarks": []})
    assert record["kind"] == "benchmark" and record["seed"] == 3
    assert record["implementation"] == {"name": "mine", "version": "2.0", "target": "pkg.mod",
                                        "module": "pkg.mod", "commit": "abc",
                                        "capabilities": ["manager"]}
    assert record["environment"]["hardware_key"].startswith(("cpu:", "gpu:"))
    assert validate_record(json.loads(json.dumps(record))) == record


def test_environment_has_the_software_fields() -> None:
    env = collect_environment()
    assert {"hardware_key", "gpu_model", "driver", "cuda", "torch", "triton", "python"} <= set(env)
    assert software_versions({"packages": {"torch": "2.1"}, "python": "3.10.1"}) == {
        "driver": None, "cuda": None, "torch": "2.1", "triton": None, "python": "3.10.1"}


def test_write_is_atomic_and_validates_first(rec: SimpleNamespace, tmp_path: Path) -> None:
    path = write_records(tmp_path / "r.jsonl", [rec.conformance()])
    before = path.read_text()
    bad = rec.conformance()
    bad["kind"] = "nope"
    with pytest.raises(RecordError):
        write_records(path, [bad])
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["r.jsonl"]  # no temporary file left behind


def test_no_pickle_in_results_package() -> None:
    import kvcheck.results as pkg

    folder = Path(pkg.__file__).parent
    for source in folder.glob("*.py"):
        text = source.read_text()
        assert "import pickle" not in text and "pickle.load" not in text, source.name


def test_written_files_get_normal_permissions(tmp_path: Path) -> None:
    """Not mkstemp's 0600: records and pages are published. A replaced file keeps its mode."""
    from kvcheck.results.io import write_atomic

    mask = os.umask(0o022)
    try:
        path = write_atomic(tmp_path / "new.txt", "a")
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)
        write_atomic(path, "b")
        assert path.stat().st_mode & 0o777 == 0o640 and path.read_text() == "b"
    finally:
        os.umask(mask)
