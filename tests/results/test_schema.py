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
        (lambda r: r.update(schema_version=3), "schema_version 3 is newer than this kvcheck"),
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
    with pytest.raises(RecordError, match=r"^where: .*") as info:
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
    with pytest.raises(RecordError, match=r"empty\.jsonl: no records"):
        load_records(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(RecordError, match=r"bin\.jsonl: not a UTF-8 text file"):
        load_records(tmp_path / "bin.jsonl")
    with pytest.raises(RecordError, match=r"nope\.jsonl: cannot read"):
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
    impl = SimpleNamespace(name="mine", target="pkg.mod",
                           module=SimpleNamespace(__name__="pkg.mod"),
                           info=SimpleNamespace(version="2.0", commit="abc",
                                                capabilities=frozenset({"manager"})))
    record = make_benchmark_record(impl, [make_metric("t", "us", "lower", [1.0, 2.0])],
                                   profile="vllm-0.33", suite_version="1.0", seed=3,
                                   extra={"benchmarks": []})
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


# ------------------------------------------------------------------ schema version 2
def _incomplete(rec: SimpleNamespace) -> dict:
    return rec.conformance("mine", incomplete=(1, 2, "1 deselected (-k)"))


def test_version_1_conformance_record_loads_as_legacy(rec: SimpleNamespace) -> None:
    """A schema-1 record (no completeness fields) loads: complete, completeness unknown."""
    from kvcheck.results.schema import completeness_known, is_legacy

    old = rec.conformance("mine", legacy=True)
    assert "complete" not in old and old["schema_version"] == 1
    (loaded,) = load_records(rec.write("old.jsonl", old))
    assert loaded["schema_version"] == 1
    assert loaded["complete"] is True and loaded["completeness"] is None
    assert loaded["conforms"] is True and loaded["verdict"] == "mine conforms to vllm-0.33"
    assert is_legacy(loaded) and not completeness_known(loaded)
    assert "complete" not in old  # the input dict is not modified


def test_version_1_benchmark_record_loads_unchanged(rec: SimpleNamespace) -> None:
    old = rec.benchmark("mine", [rec.metric("t", [1.0, 2.0, 3.0])])
    old["schema_version"] = 1
    assert load_records(rec.write("old.jsonl", old)) == [old]


def test_version_2_records_keep_their_fields(rec: SimpleNamespace) -> None:
    from kvcheck.results.schema import completeness_known, is_legacy

    (loaded,) = load_records(rec.write("r.jsonl", _incomplete(rec)))
    assert loaded["complete"] is False and loaded["conforms"] is False
    assert loaded["completeness"] == {"applicable": 2, "ran": 1,
                                      "reasons": ["1 deselected (-k)"], "interrupted": False}
    assert completeness_known(loaded) and not is_legacy(loaded)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(conforms=True),
         "field 'conforms' is true but 'complete' is false; an incomplete run cannot conform"),
        (lambda r: r.pop("complete"), "missing field 'complete'"),
        (lambda r: r.pop("completeness"), "missing field 'completeness'"),
        (lambda r: r.update(completeness=None), ("field 'completeness' must be dict, got "
                                                "NoneType")),
        (lambda r: r.update(complete="no"), "field 'complete' must be bool, got str"),
        (lambda r: r["completeness"].update(ran=3), ("field 'ran' (3) cannot exceed "
                                                    "'applicable' (2)")),
        (lambda r: r["completeness"].update(ran=-1), "field 'ran' must be >= 0, got -1"),
        (lambda r: r["completeness"].update(applicable=True), "field 'applicable' must be int"),
        (lambda r: r["completeness"].update(reasons="deselected"),
         "field 'reasons' must be list, got str"),
        (lambda r: r["completeness"].update(reasons=[1]), "'reasons' must be a list of str"),
        (lambda r: r["completeness"].update(reasons=[]),
         "'reasons' must say why the run is incomplete"),
        (lambda r: r["completeness"].pop("interrupted"), "missing field 'interrupted'"),
        (lambda r: r["completeness"].pop("applicable"), "missing field 'applicable'"),
        (lambda r: r.update(complete=True, conforms=True, completeness={
            "applicable": None, "ran": 0, "reasons": [], "interrupted": False}),
         "field 'complete' is true but completeness says otherwise (ran 0 of None"),
        (lambda r: r.update(complete=True),
         "field 'complete' is true but completeness says otherwise (ran 1 of 2"),
    ],
)
def test_invalid_completeness_is_rejected(rec: SimpleNamespace, mutate, message: str) -> None:
    record = _incomplete(rec)
    mutate(record)
    with pytest.raises(RecordError, match=r"^where: ") as info:
        validate_record(record, "where")
    assert message in str(info.value)


def test_unknown_applicable_count_is_allowed_in_an_incomplete_record(
        rec: SimpleNamespace) -> None:
    """A run whose collection never completed cannot say how many tests apply."""
    record = _incomplete(rec)
    record["completeness"] = {"applicable": None, "ran": 0, "interrupted": True,
                              "reasons": ["the test collection never completed", "interrupted"]}
    (loaded,) = load_records(rec.write("r.jsonl", record))
    assert loaded["completeness"]["applicable"] is None


def test_a_loaded_file_with_conforms_but_incomplete_is_exit_2(
        rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    from kvcheck.plugin.cli import main

    bad = _incomplete(rec)
    bad["conforms"] = True
    path = rec.write("bad.jsonl", bad)
    assert main(["leaderboard", str(path)]) == 2
    assert ("bad.jsonl:1: field 'conforms' is true but 'complete' is false"
            in capsys.readouterr().err)


_IMPL = {"name": "mine", "version": "2.0", "commit": "abc", "capabilities": ["manager"],
         "target": "pkg.mod", "module": "pkg.mod"}
_ENV = {"hardware_key": "cpu:Test CPU x4", "python": "3.11.7"}


def _conformance_kwargs(**changes: object) -> dict:
    kwargs: dict = {
        "implementation": _IMPL, "profile": "generic", "seed": 7,
        "outcomes": {"conformance/test_x.py::test_a[mine]": "passed",
                  "conformance/test_x.py::test_b[mine]": "skipped"},
        "areas": {"x": {"passed": 1, "failed": 0, "skipped": 1, "xfailed": 0, "xpassed": 0,
                     "error": 0}},
        "verdict": "mine conforms to generic", "conforms": True, "complete": True,
        "completeness": {"applicable": 1, "ran": 1, "reasons": (), "interrupted": False},
        "environment": _ENV, "suite_version": "9.9"}
    kwargs.update(changes)
    return kwargs


def test_make_conformance_record_builds_every_field(tmp_path: Path) -> None:
    from kvcheck import __version__
    from kvcheck.results.schema import make_conformance_record

    record = make_conformance_record(**_conformance_kwargs(), timestamp="2026-05-01T00:00:00Z")
    assert record == {
        "schema_version": 2, "kind": "conformance", "timestamp": "2026-05-01T00:00:00Z",
        "suite_version": "9.9", "kvcheck_version": __version__, "implementation": _IMPL,
        "profile": "generic", "seed": 7,
        "outcomes": {"conformance/test_x.py::test_a[mine]": "passed",
                     "conformance/test_x.py::test_b[mine]": "skipped"},
        "areas": {"x": {"passed": 1, "failed": 0, "skipped": 1, "xfailed": 0, "xpassed": 0,
                        "error": 0}},
        "verdict": "mine conforms to generic", "conforms": True, "complete": True,
        "completeness": {"applicable": 1, "ran": 1, "reasons": [], "interrupted": False},
        "metrics": [], "environment": _ENV,
    }
    path = write_records(tmp_path / "r.jsonl", [record])
    assert load_records(path) == [record]


def test_make_conformance_record_validates() -> None:
    from kvcheck.results.schema import make_conformance_record

    incomplete = {"applicable": 3, "ran": 1, "reasons": ["-x stopped the run"],
                  "interrupted": False}
    with pytest.raises(RecordError, match="conformance record of 'mine': field 'conforms' is "
                                          "true but 'complete' is false"):
        make_conformance_record(**_conformance_kwargs(complete=False, completeness=incomplete))
    with pytest.raises(RecordError, match=r"outcomes\['conformance/test_x.py::test_a\[mine\]'\]"):
        make_conformance_record(**_conformance_kwargs(
            outcomes={"conformance/test_x.py::test_a[mine]": "ok"}))
    with pytest.raises(RecordError, match="implementation: field 'version' must be str"):
        make_conformance_record(**_conformance_kwargs(implementation={"name": "m",
                                                                      "version": 1}))
    with pytest.raises(TypeError, match="positional"):  # keyword-only: no positional mix-ups
        make_conformance_record(_IMPL)  # type: ignore[misc]
    ok = make_conformance_record(**_conformance_kwargs(conforms=False, complete=False,
                                                       completeness=incomplete))
    assert ok["complete"] is False and ok["completeness"]["ran"] == 1


def test_both_kinds_share_the_envelope() -> None:
    from kvcheck.results.schema import make_conformance_record

    common = {"implementation": _IMPL, "profile": "generic", "seed": 7, "environment": _ENV,
              "suite_version": "9.9", "timestamp": "2026-05-01T00:00:00+00:00"}
    conf = make_conformance_record(**{**_conformance_kwargs(), **common})
    bench = make_benchmark_record(common["implementation"],
                                  [make_metric("t", "us", "lower", value=1.0)],
                                  **{k: v for k, v in common.items() if k != "implementation"})
    shared = ("schema_version", "timestamp", "suite_version", "kvcheck_version",
              "implementation", "profile", "seed", "environment")
    assert {k: conf[k] for k in shared} == {k: bench[k] for k in shared}
    assert bench["schema_version"] == 2 and bench["kind"] == "benchmark"
