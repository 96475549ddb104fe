"""`kvcheck gate` decisions on synthetic records: real regressions, noise, new failures,
hardware mismatches, corrupted input, thresholds, floors and waivers."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcheck.plugin.cli import main

# 11 samples each, completely separated: the exact one-sided p is 1 / C(22, 11) = 1.4e-6.
BASE = [10.0 + 0.1 * i for i in range(11)]          # median 10.5
SLOWER = [11.2 + 0.1 * i for i in range(11)]        # median 11.7: (11.7 - 10.5) / 10.5 = 11.4%


def gate(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = main(["gate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def bench_pair(rec: SimpleNamespace, base_metrics: list, cur_metrics: list,
               **cur_kw: str) -> tuple[Path, Path]:
    return (rec.write("base.jsonl", rec.benchmark("mine", base_metrics)),
            rec.write("cur.jsonl", rec.benchmark("mine", cur_metrics,
                                                 timestamp="2026-01-02T00:00:00+00:00",
                                                 **cur_kw)))


def test_real_regression_fails(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("us_per_call", BASE, case="alloc")],
                           [rec.metric("us_per_call", SLOWER, case="alloc")])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert ("Metric 'alloc/us_per_call' of mine has failed PercentageRegressionCheck: "
            "11.4 > 5.0 (10.5 us -> 11.7 us; p=1.4e-06 < 0.01)") in out
    assert "REGRESSION" in out and "+11.4%" in out
    assert "kvcheck gate: FAILED, 1 regression (0 conformance, 1 metric)" in out


def test_noise_only_passes(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """The headline value is 10% worse, but the samples are the same values reshuffled: not
    significant, so not a regression."""
    shuffled = BASE[5:] + BASE[:5]
    base, cur = bench_pair(rec, [rec.metric("t", BASE, value=10.0)],
                           [rec.metric("t", shuffled, value=11.0)])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0
    assert "noise" in out and ">= alpha 0.01" in out
    assert "kvcheck gate: passed (1 record group(s) compared)" in out


def test_new_conformance_failure_fails(rec: SimpleNamespace,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Test ids written from different working directories still match."""
    base = rec.write("base.jsonl", rec.conformance("mine", {
        "conformance/test_eviction.py::test_lru[mine]": "passed",
        "conformance/test_hashing.py::test_chain[mine]": "failed",
        "conformance/test_hashing.py::test_seed[mine]": "passed"}))
    cur = rec.write("cur.jsonl", rec.conformance("mine", {
        "../lib/site-packages/kvcheck/conformance/test_eviction.py::test_lru[mine]": "failed",
        "../lib/site-packages/kvcheck/conformance/test_hashing.py::test_chain[mine]": "passed",
        "../lib/site-packages/kvcheck/conformance/test_hashing.py::test_seed[mine]": "skipped",
        "../lib/site-packages/kvcheck/conformance/test_hashing.py::test_new[mine]": "failed"}))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert ("Test 'test_eviction.py::test_lru[mine]' of mine has failed ConformanceCheck: "
            "passed -> failed") in out
    assert "fixed" in out and "no longer passes" in out and "new test failing" in out
    # The current record does not conform: its two failing tests fail it on their own too.
    assert ("The current record of mine (conformance, vllm-0.33) does not conform: 2 tests "
            "failed or errored: 'test_eviction.py::test_lru[mine]', "
            "'test_hashing.py::test_new[mine]'.") in out
    assert "2 regressions (1 conformance, 0 metric, 1 non-conforming record)" in out


def test_hardware_mismatch_is_no_baseline(rec: SimpleNamespace,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Timings of another machine are no baseline; a gate that compared nothing then fails
    (issue 23) unless --allow-empty accepts it."""
    base = rec.write("base.jsonl", rec.benchmark("mine", [rec.metric("t", BASE)]))
    cur = rec.write("cur.jsonl", rec.benchmark("mine", [rec.metric("t", [x * 3 for x in BASE])],
                                               hardware_key=rec.GPU))
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert ("warning: no baseline for mine (benchmark, vllm-0.33) on hardware "
            "'gpu:NVIDIA H100 80GB HBM3': the baseline was measured on 'cpu:Test CPU x4'") in out
    assert "Nothing was compared: no current record has a comparable baseline" in out
    assert "kvcheck gate: FAILED, nothing compared (--allow-empty accepts this)" in out
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--allow-empty")
    assert rc == 0 and "kvcheck gate: passed with nothing compared (--allow-empty)" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema_version": 1, "kind": "conf', "cur.jsonl:1: not valid JSON"),
        ('{"schema_version": 7}', "cur.jsonl:1: schema_version 7 is newer than this kvcheck"),
        ("", "cur.jsonl: no records"),
    ],
)
def test_corrupted_input_is_exit_2(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str],
                                   content: str, message: str) -> None:
    base = rec.write("base.jsonl", rec.conformance())
    cur = rec.write("cur.jsonl")
    cur.write_text(content)
    rc, out, err = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 2 and message in err and err.startswith("kvcheck gate: ")
    assert "Traceback" not in err + out


def test_missing_field_is_exit_2_naming_it(rec: SimpleNamespace,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    record = rec.conformance()
    del record["environment"]["hardware_key"]
    rc, _, err = gate(capsys, "--baseline", rec.write("b.jsonl", record),
                      "--current", rec.write("c.jsonl", rec.conformance()))
    assert rc == 2 and "b.jsonl:1: environment: missing field 'hardware_key'" in err


def test_floor_ignores_small_absolute_changes(rec: SimpleNamespace,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """0.1 us -> 0.22 us is 120% worse and significant, but under a 0.5 us floor."""
    small = [0.1 + 0.001 * i for i in range(11)]
    base, cur = bench_pair(rec, [rec.metric("t", small)],
                           [rec.metric("t", [x + 0.12 for x in small])])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--floor", "us:0.5")
    assert rc == 0 and "below floor" in out
    assert gate(capsys, "--baseline", base, "--current", cur)[0] == 1


def test_per_metric_thresholds(rec: SimpleNamespace, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """Both metrics are 11.4% worse; only the one with the strict threshold fails."""
    base, cur = bench_pair(
        rec, [rec.metric("t", BASE, case="alloc"), rec.metric("t", BASE, case="free")],
        [rec.metric("t", SLOWER, case="alloc"), rec.metric("t", SLOWER, case="free")])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur,
                      "--threshold", "alloc/t:5%", "--threshold", "15%")
    assert rc == 1 and "'alloc/t' of mine has failed" in out and out.count("has failed") == 1
    # The same from a thresholds file; a later, less specific rule does not override it.
    rules = tmp_path / "thresholds.txt"
    rules.write_text("threshold alloc/t:5%   # allocation is the hot path\nthreshold t:20%\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--thresholds-file", rules)
    assert rc == 1 and out.count("has failed") == 1


def test_absolute_threshold(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("t", BASE)], [rec.metric("t", SLOWER)])
    assert gate(capsys, "--baseline", base, "--current", cur, "--threshold", "us:2")[0] == 0
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--threshold", "us:0.5")
    assert rc == 1 and "has failed DifferenceRegressionCheck: 1.2 > 0.5" in out


def test_higher_is_better(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str]) -> None:
    """Throughput 105 -> 93 ops/s is a regression; 105 -> 117 an improvement."""
    ops = [100.0 + i for i in range(11)]                           # median 105
    down = [x - 12 for x in ops]
    up = [x + 12 for x in ops]

    def m(samples: list[float]) -> dict:
        return rec.metric("ops", samples, unit="ops/s", direction="higher_is_better")

    base, cur = bench_pair(rec, [m(ops)], [m(down)])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1 and "PercentageRegressionCheck: 11.4 > 5.0" in out
    base, cur = bench_pair(rec, [m(ops)], [m(up)])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0 and "improved" in out and "-11.4%" in out


def test_waivers(rec: SimpleNamespace, tmp_path: Path,
                 capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("t", BASE, case="alloc")],
                           [rec.metric("t", SLOWER, case="alloc")])
    waivers = tmp_path / "waivers.txt"
    waivers.write_text("# accepted regressions\nalloc/*   # new eviction policy, see #12\n"
                       "test_gone.py::test_x  # stale\n")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 0
    assert ("Metric 'alloc/t' of mine has failed PercentageRegressionCheck: 11.4 > 5.0 "
            "(10.5 us -> 11.7 us; p=1.4e-06 < 0.01) [waived: new eviction policy, see #12]") in out
    assert "kvcheck gate: passed (1 record group(s) compared, 1 waived)" in out
    assert "warning: waiver 'test_gone.py::test_x'" in out and "matched no regression" in out
    waivers.write_text("alloc/t\n")
    rc, _, err = gate(capsys, "--baseline", base, "--current", cur, "--waivers", waivers)
    assert rc == 2 and "waivers.txt:1: waiver 'alloc/t' has no reason" in err


@pytest.mark.parametrize(
    ("base_samples", "cur_samples", "note"),
    [
        ((), (), "no samples: treated as exact"),
        ((3.0, 3.0, 3.0), (4.0, 4.0, 4.0), "no spread in either run: treated as exact"),
    ],
)
def test_exact_metrics_are_judged_on_magnitude(rec: SimpleNamespace, base_samples: tuple,
                                               cur_samples: tuple, note: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A deterministic figure (preemption count, hit rate) that changed has changed: no test
    is needed, even with 3 rounds (whose smallest possible p is 1/20)."""
    base, cur = bench_pair(rec, [rec.metric("preemptions", base_samples, value=3.0,
                                            unit="count")],
                           [rec.metric("preemptions", cur_samples, value=4.0, unit="count")])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1
    assert f"PercentageRegressionCheck: 33.3 > 5.0 (3 count -> 4 count; {note})" in out


def test_too_few_noisy_samples_are_untestable(rec: SimpleNamespace,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """3 noisy rounds against 3, 20% worse: p can never go below 1/20 = 0.05, so the change
    cannot be significant at 0.01: reported and warned about, not failed; a higher alpha
    makes it gateable."""
    base, cur = bench_pair(rec, [rec.metric("t", [10.0, 10.1, 10.2])],
                           [rec.metric("t", [12.0, 12.1, 12.2])])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0 and "untestable" in out
    assert ("1 metric(s) got worse beyond their threshold but have too few samples to be "
            "significant at alpha 0.01 (n=3/3 samples cannot reach p < 0.01 (smallest possible "
            "p 0.05))") in out
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--alpha", "0.06")
    assert rc == 1 and "(10.1 us -> 12.1 us; p=0.05 < 0.06)" in out


def test_unchanged_metrics_are_hidden_unless_verbose(rec: SimpleNamespace,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("a", BASE), rec.metric("b", BASE)],
                           [rec.metric("a", BASE), rec.metric("b", SLOWER)])
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 1 and "│ mine           │ b " in out and "│ mine           │ a " not in out
    assert "1 metric(s) within their thresholds not shown (--verbose shows them)" in out
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur, "--verbose")
    assert "│ mine           │ a " in out


def test_software_difference_is_a_warning(rec: SimpleNamespace,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("t", BASE)], [rec.metric("t", BASE)],
                           torch="2.14.0")
    rc, out, _ = gate(capsys, "--baseline", base, "--current", cur)
    assert rc == 0 and "software differs from the baseline: torch 2.13.0 -> 2.14.0" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold", "mean:five%"], "--threshold 'mean:five%': expected [SELECTOR:]N[%]"),
        (["--floor", "us:5%"], "a floor is absolute"),
        (["--alpha", "1.5"], "--alpha 1.5: must be between 0 and 1"),
        (["--waivers", "/nonexistent/w.txt"], "--waivers /nonexistent/w.txt: cannot read"),
    ],
)
def test_bad_options_are_exit_2(rec: SimpleNamespace, capsys: pytest.CaptureFixture[str],
                                args: list[str], message: str) -> None:
    path = rec.write("r.jsonl", rec.conformance())
    rc, _, err = gate(capsys, "--baseline", path, "--current", path, *args)
    assert rc == 2 and message in err


def test_markdown_report(rec: SimpleNamespace, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    base, cur = bench_pair(rec, [rec.metric("t", BASE, case="a|b")],
                           [rec.metric("t", SLOWER, case="a|b")])
    out_md = tmp_path / "gate.md"
    assert gate(capsys, "--baseline", base, "--current", cur, "--markdown", out_md)[0] == 1
    text = out_md.read_text()
    assert text.startswith("### kvcheck gate: FAILED, 1 regression")
    assert "| mine | a\\|b/t | 10.5 us | 11.7 us | +11.4% | 5% |" in text
    assert "**REGRESSION**" in text


def test_identical_runs_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """The committed reference record gated against itself."""
    record = Path(__file__).resolve().parents[2] / "results/records/reference-vllm-0.33.jsonl"
    rc, out, _ = gate(capsys, "--baseline", record, "--current", record)
    assert rc == 0 and "kvcheck gate: passed" in out
