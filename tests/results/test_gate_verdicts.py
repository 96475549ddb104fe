"""`kvcheck gate` and a current record's own verdict (issue 23): a conformance record that
does not conform, or is incomplete, never passes the gate, whatever the baseline's hardware
key or kind; conformance outcomes are compared across hardware keys; a baseline of another
record kind is a usage error (exit 2); a gate that compared nothing fails unless
--allow-empty. Records are built with the schema's own builders and ``write_records``."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcheck.plugin.cli import main
from kvcheck.results.io import write_records
from kvcheck.results.schema import (
    make_benchmark_record,
    make_conformance_record,
    make_metric,
    validate_record,
)

IMPL = {"name": "mine", "version": "1.0", "commit": None}
LRU = "conformance/test_eviction.py::test_lru[mine]"
CHAIN = "conformance/test_hashing.py::test_chain[mine]"
LRU_ID, CHAIN_ID = "test_eviction.py::test_lru[mine]", "test_hashing.py::test_chain[mine]"
EARLIER, LATER = "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"
CPU, GPU, CALLGRIND = "cpu:Test CPU x4", "gpu:NVIDIA H100 80GB HBM3", "callgrind:x86_64"
COUNTED = Path(__file__).resolve().parents[2] / "results/records/reference-counted.jsonl"
SAMPLES = [10.0 + 0.1 * i for i in range(11)]


def conformance(rec: SimpleNamespace, outcomes: dict[str, str], *, hardware_key: str = CPU,
                incomplete: bool = False, name: str = "mine", profile: str = "vllm-0.33",
                timestamp: str = LATER) -> dict[str, Any]:
    """A schema-valid conformance record whose verdict follows the plugin's rules: a failed
    or errored test means ``conforms: false``; ``incomplete``: one more applicable test than
    ran (deselected)."""
    areas: dict[str, dict[str, int]] = {}
    for test_id, outcome in outcomes.items():
        area = test_id.split("::")[0].rsplit("/", 1)[-1][len("test_"):-len(".py")]
        row = areas.setdefault(area, dict.fromkeys(
            ("passed", "failed", "skipped", "xfailed", "xpassed", "error"), 0))
        row[outcome] += 1
    failing = any(outcome in ("failed", "error") for outcome in outcomes.values())
    ran = len(outcomes)
    completeness = {"applicable": ran + incomplete, "ran": ran,
                    "reasons": ["1 deselected (-k, -m, --deselect or --lf)"] if incomplete else [],
                    "interrupted": False}
    verdict = (f"{name} does NOT conform to {profile}" if failing else
               f"{name}: incomplete: ran {ran} of {ran + 1}" if incomplete else
               f"{name} conforms to {profile}")
    return make_conformance_record(
        implementation={**IMPL, "name": name}, profile=profile, seed=None, outcomes=outcomes,
        areas=areas, verdict=verdict, conforms=not failing and not incomplete,
        complete=not incomplete, completeness=completeness, suite_version="0.1.0",
        environment=rec.environment(hardware_key), timestamp=timestamp)


def benchmark(rec: SimpleNamespace, samples: list[float], *, hardware_key: str = CPU,
              name: str = "mine", timestamp: str = LATER) -> dict[str, Any]:
    return make_benchmark_record({**IMPL, "name": name},
                                 [make_metric("t", "us", "lower", samples)], profile="vllm-0.33",
                                 suite_version="0.1.0", environment=rec.environment(hardware_key),
                                 timestamp=timestamp)


def write(tmp_path: Path, filename: str, *records: dict[str, Any]) -> Path:
    return write_records(tmp_path / filename, records)


def gate(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = main(["gate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


PASSING = {LRU: "passed", CHAIN: "passed"}
CURRENT = {  # what the current record holds, per case of the matrix
    "conforming": (PASSING, False),
    "non-conforming": ({LRU: "failed", CHAIN: "passed"}, False),
    "incomplete": (PASSING, True),  # every test it ran passed; one applicable test did not run
}
KEYS = {"same hardware key": CPU, "other hardware key": GPU, "counting-method key": CALLGRIND}


@pytest.mark.parametrize(("key", "baseline_kind", "current", "allow_empty"), list(
    itertools.product(KEYS, ("conformance", "benchmark", "none"), CURRENT, (False, True))))
def test_a_failing_record_never_passes_whatever_the_baseline(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str,
        baseline_kind: str, current: str, allow_empty: bool) -> None:
    """The matrix of issue 23. The current record is on the CPU key; the baseline is a
    conformance record, a benchmark record or nothing comparable (a record of another
    profile) on the given key. A non-conforming or incomplete record fails (exit != 0) in
    every case; a conforming complete one passes exactly when something was compared, or
    with --allow-empty when nothing was (a baseline of another kind is exit 2 regardless)."""
    hardware_key = KEYS[key]
    if baseline_kind == "conformance":
        base = conformance(rec, PASSING, hardware_key=hardware_key, timestamp=EARLIER)
    elif baseline_kind == "benchmark":
        base = benchmark(rec, SAMPLES, hardware_key=hardware_key, timestamp=EARLIER)
    else:
        base = conformance(rec, PASSING, hardware_key=hardware_key, profile="vllm-0.10",
                           timestamp=EARLIER)
    outcomes, incomplete = CURRENT[current]
    b = write(tmp_path, "base.jsonl", base)
    c = write(tmp_path, "cur.jsonl", conformance(rec, outcomes, incomplete=incomplete))
    rc, out, err = gate(capsys, "--baseline", b, "--current", c,
                        *(["--allow-empty"] if allow_empty else []))
    if baseline_kind == "benchmark":
        assert rc == 2 and out == ""
        assert err.startswith("kvcheck gate: the baseline holds only benchmark records (")
        assert "base.jsonl: benchmark" in err and "cur.jsonl: conformance" in err
        return
    assert "Traceback" not in out + err and err == ""
    if current == "conforming":
        assert rc == (0 if baseline_kind == "conformance" or allow_empty else 1)
    else:
        assert rc == 1
    if current == "non-conforming":
        assert ("The current record of mine (conformance, vllm-0.33) does not conform: 1 test "
                f"failed or errored: '{LRU_ID}'. Fix it, or accept each with a --waivers line "
                "naming its test id") in out
        if baseline_kind == "conformance":  # the per-test regression line is kept
            assert (f"Test '{LRU_ID}' of mine has failed ConformanceCheck: passed -> failed"
                    in out)
    if current == "incomplete":
        assert ("The current record of mine (conformance, vllm-0.33) is incomplete: ran 2 of 3 "
                "applicable tests") in out
    if baseline_kind == "conformance":
        assert "nothing was compared" not in out.lower()
        across = "test outcomes compared with the baseline measured on" in out
        assert across == (hardware_key != CPU)
    elif allow_empty:
        assert ("warning: nothing was compared: no current record has a comparable baseline"
                in out)
        assert "its own verdict was checked for mine (conformance, vllm-0.33)" in out
    else:
        assert "Nothing was compared: no current record has a comparable baseline" in out
        assert "or accept a gate without a baseline with --allow-empty" in out


def test_the_baseline_on_the_same_hardware_key_is_preferred(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two baseline records could pair: the CPU one (LRU passed) and a later GPU one (LRU
    failed). A CPU run pairs with the CPU one, so LRU's failure is a regression; a run on a
    third key pairs with the latest, the GPU one."""
    b = write(tmp_path, "base.jsonl",
              conformance(rec, PASSING, hardware_key=CPU, timestamp=EARLIER),
              conformance(rec, {LRU: "failed", CHAIN: "passed"}, hardware_key=GPU,
                          timestamp=LATER))
    failing = {LRU: "failed", CHAIN: "passed"}
    c = write(tmp_path, "cur.jsonl", conformance(rec, failing, hardware_key=CPU))
    rc, out, _ = gate(capsys, "--baseline", b, "--current", c)
    assert rc == 1
    assert f"Test '{LRU_ID}' of mine has failed ConformanceCheck: passed -> failed" in out
    assert "measured on" not in out
    c = write(tmp_path, "cur.jsonl", conformance(rec, failing, hardware_key="cpu:Other x8"))
    rc, out, _ = gate(capsys, "--baseline", b, "--current", c)
    assert rc == 1 and "has failed ConformanceCheck" not in out  # failed in that one too
    assert ("warning: mine (conformance, vllm-0.33) on hardware 'cpu:Other x8': test outcomes "
            "compared with the baseline measured on 'gpu:NVIDIA H100 80GB HBM3'") in out
    assert "does not conform: 1 test failed or errored" in out


@pytest.fixture
def failing_twice(rec: SimpleNamespace, tmp_path: Path) -> tuple[Path, Path]:
    """CHAIN already failed in the baseline; LRU fails now for the first time."""
    base = write(tmp_path, "base.jsonl",
                 conformance(rec, {LRU: "passed", CHAIN: "failed"}, timestamp=EARLIER))
    cur = write(tmp_path, "cur.jsonl", conformance(rec, {LRU: "failed", CHAIN: "error"}))
    return base, cur


def test_waivers_covering_every_failure_let_a_non_conforming_record_pass(
        failing_twice: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = failing_twice
    waivers = tmp_path / "waivers.txt"
    waivers.write_text(f"{LRU_ID}  # new eviction policy, #412\n"
                       f"{CHAIN_ID}  # known hashing bug, #400\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 0
    assert ("The current record of mine (conformance, vllm-0.33) does not conform: 2 tests "
            "failed or errored [waived: each of its 2 failing tests matched a --waivers line]"
            ) in out
    assert ("kvcheck gate: passed (1 record group(s) compared, 1 waived, 1 non-conforming "
            "record accepted by waivers)") in out
    assert "matched no regression" not in out
    waivers.write_text("test_*[mine]  # the whole suite is being rewritten, #420\n")
    assert gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)[0] == 0


def test_a_partial_waiver_does_not(failing_twice: tuple[Path, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The new failure is waived; the test that already failed in the baseline is not, and
    fails the gate: an old failure is still a failure."""
    base, cur = failing_twice
    waivers = tmp_path / "waivers.txt"
    waivers.write_text(f"{LRU_ID}  # new eviction policy, #412\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 1
    assert ("The current record of mine (conformance, vllm-0.33) does not conform: 2 tests "
            f"failed or errored, 1 not waived: '{CHAIN_ID}'. Fix it, or accept each with a "
            "--waivers line naming its test id (a test that failed in the baseline too needs "
            "one)") in out
    assert "[waived: new eviction policy, #412]" in out
    assert "kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, 1 non-conforming" in out


def test_many_failing_tests_are_counted_and_the_first_five_named(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = [f"conformance/test_eviction.py::test_{i:02d}[mine]" for i in range(7)]
    cur = write(tmp_path, "cur.jsonl", conformance(rec, dict.fromkeys(ids, "failed")))
    rc, out, _ = gate(capsys, "--current", cur, "--allow-empty")
    assert rc == 1
    assert ("does not conform: 7 tests failed or errored: 'test_eviction.py::test_00[mine]', "
            "'test_eviction.py::test_01[mine]', 'test_eviction.py::test_02[mine]', "
            "'test_eviction.py::test_03[mine]', 'test_eviction.py::test_04[mine]' and 2 more. "
            "Fix them") in out


def test_a_record_that_does_not_conform_without_a_failing_test_fails(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every test skipped: complete, nothing checked, conforms: false. No test to waive."""
    base = write(tmp_path, "base.jsonl", conformance(rec, PASSING, timestamp=EARLIER))
    record = conformance(rec, {LRU: "skipped", CHAIN: "skipped"})
    record.update(conforms=False, verdict="mine: nothing was checked (every test skipped)")
    cur = write(tmp_path, "cur.jsonl", record)
    waivers = tmp_path / "waivers.txt"
    waivers.write_text("*  # accept everything\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 1
    assert ("does not conform: its verdict is 'mine: nothing was checked (every test skipped)' "
            "although no test failed or errored, so there is no test to waive") in out


def test_allow_empty_without_a_baseline(rec: SimpleNamespace, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """No --baseline at all (a base branch without a record): the record's own verdict is
    checked; a conforming one passes only with --allow-empty, a failing one never."""
    ok = write(tmp_path, "ok.jsonl", conformance(rec, PASSING))
    rc, out, _ = gate(capsys, "--current", ok)
    assert rc == 1
    assert ("Nothing was compared: no --baseline was given; its own verdict was checked for "
            "mine (conformance, vllm-0.33), but without a baseline no regression can be seen. "
            "Pass the base run's records with --baseline") in out
    assert ("kvcheck gate: FAILED, nothing compared (--allow-empty accepts this): 1 conformance "
            "record judged on its own verdict") in out
    rc, out, _ = gate(capsys, "--current", ok, "--allow-empty")
    assert rc == 0
    assert "warning: nothing was compared: no --baseline was given" in out
    assert ("kvcheck gate: passed with nothing compared (--allow-empty): 1 conformance record "
            "judged on its own verdict") in out
    bad = write(tmp_path, "bad.jsonl", conformance(rec, {LRU: "failed", CHAIN: "passed"}))
    rc, out, _ = gate(capsys, "--current", bad, "--allow-empty")
    assert rc == 1 and "does not conform: 1 test failed or errored" in out
    bench = write(tmp_path, "bench.jsonl", benchmark(rec, SAMPLES))
    rc, out, _ = gate(capsys, "--current", bench)
    assert rc == 1 and "Nothing was compared: no --baseline was given." in out
    assert "own verdict" not in out


def test_a_baseline_of_another_kind_is_exit_2(rec: SimpleNamespace, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bench = write(tmp_path, "bench.jsonl", benchmark(rec, SAMPLES, timestamp=EARLIER))
    conf = write(tmp_path, "conf.jsonl", conformance(rec, {LRU: "failed", CHAIN: "passed"}))
    md = tmp_path / "gate.md"
    rc, out, err = gate(capsys, "--baseline", bench, "--current", conf, "--markdown", md,
                        "--allow-empty")
    assert rc == 2 and out == "" and not md.exists()
    assert err == (
        f"kvcheck gate: the baseline holds only benchmark records ({bench}: benchmark) and the "
        f"current files only conformance records ({conf}: conformance): a gate compares "
        "records of one kind, so nothing could be compared. Fix: pass the base run's "
        "conformance record with --baseline (conformance: pytest --kv-impl=X "
        "--kv-report=FILE), or gate the current run's benchmark record (--current) against "
        "this baseline\n")
    # The other way round names the benchmark report option.
    rc, _, err = gate(capsys, "--baseline", conf, "--current", bench)
    assert rc == 2 and "--kv-bench --kv-bench-report=FILE" in err


def test_a_baseline_of_another_kind_for_one_implementation_is_exit_2(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The files share a kind (another implementation's conformance record), but the
    baseline's records of 'mine' are only benchmarks."""
    base = write(tmp_path, "base.jsonl", benchmark(rec, SAMPLES, timestamp=EARLIER),
                 conformance(rec, PASSING, name="theirs", timestamp=EARLIER))
    cur = write(tmp_path, "cur.jsonl", conformance(rec, PASSING))
    rc, out, err = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 2 and out == ""
    assert err.startswith(f"kvcheck gate: the current records of 'mine' are conformance "
                          f"({cur}: conformance) but the baseline's records of it are only "
                          f"benchmark ({base}: benchmark): a gate compares records of one "
                          "kind. Fix: pass the base run's conformance record with --baseline")


def test_one_kind_without_a_baseline_is_no_usage_error(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The base run wrote a conformance record but no benchmark: the conformance records are
    compared (across hardware keys), the benchmark has no baseline, and that is a warning."""
    base = write(tmp_path, "base.jsonl", conformance(rec, PASSING, hardware_key=GPU,
                                                     timestamp=EARLIER))
    cur = write(tmp_path, "cur.jsonl", conformance(rec, PASSING), benchmark(rec, SAMPLES))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0
    assert ("warning: no baseline for mine (benchmark, vllm-0.33): the baseline has no such "
            "records") in out
    assert "kvcheck gate: passed (1 record group(s) compared)" in out


def test_metrics_of_a_conformance_pair_across_hardware_are_not_compared(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Outcomes do not depend on the machine, timings do: a metric three times slower on
    another key is not gated, and the warning says so."""
    def with_metric(record: dict[str, Any], samples: list[float]) -> dict[str, Any]:
        record["metrics"] = [make_metric("t", "us", "lower", samples)]
        return validate_record(record, "test record")

    base = write(tmp_path, "base.jsonl", with_metric(
        conformance(rec, PASSING, hardware_key=GPU, timestamp=EARLIER), SAMPLES))
    cur = write(tmp_path, "cur.jsonl", with_metric(conformance(rec, PASSING),
                                                   [3 * x for x in SAMPLES]))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0 and "PercentageRegressionCheck" not in out
    assert "(outcomes do not depend on hardware); its metrics were not compared" in out


def test_markdown_report_names_the_failing_tests(
        rec: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cur = write(tmp_path, "cur.jsonl", conformance(rec, {LRU: "failed", CHAIN: "passed"}))
    md = tmp_path / "gate.md"
    assert gate(capsys, "--current", cur, "--markdown", md)[0] == 1
    text = md.read_text()
    assert text.startswith("### kvcheck gate: FAILED, 1 regression (0 conformance, 0 metric, "
                           "1 non-conforming record); nothing compared")
    assert ("- The current record of mine (conformance, vllm-0.33) does not conform: 1 test "
            "failed or errored: &#x27;test_eviction.py::test_lru[mine]&#x27;.") in text
    assert "- Nothing was compared: no --baseline was given" in text


def test_ci_counted_gate_still_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """.ci/run gates a fresh count against results/records/reference-counted.jsonl; the
    committed record against itself is what that gate sees when nothing moved."""
    rc, out, _ = gate(capsys, "--baseline", COUNTED, "--current", COUNTED)
    assert rc == 0 and "kvcheck gate: passed (1 record group(s) compared)" in out
