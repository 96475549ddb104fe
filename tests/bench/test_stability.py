"""The stability script (``python -m kvcheck.bench.stability``): adaptive pair counts and
its result records."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.bench.stability import adaptive_rounds, main
from kvcheck.results.schema import load_records


@pytest.mark.parametrize(("rounds", "pair_s", "min_time", "cap", "want"), [
    (7, 0.5, 2.0, 60, 7),      # long pairs: --rounds already covers min_time
    (7, 0.02, 2.0, 60, 60),    # 20 ms pairs: 100 wanted, capped at 60
    (7, 0.1, 2.0, 60, 20),     # 2.0 / 0.1
    (7, 0.1, 2.0, 5, 7),       # a cap below --rounds never lowers it
    (7, 0.0, 2.0, 60, 7),      # nothing measured: --rounds
])
def test_adaptive_rounds(rounds: int, pair_s: float, min_time: float, cap: int,
                         want: int) -> None:
    assert adaptive_rounds(rounds, pair_s, min_time, cap) == want


def test_short_cases_get_more_pairs_and_records_carry_every_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An A/A run of one short scenario and one hashing case: more pairs than --rounds
    (min_time), two runs, and a record whose metrics pool both runs' samples and carry each
    run's paired ratio and the move between them."""
    report = tmp_path / "s.jsonl"
    # --min-time 3600: the --max-rounds cap is reached however loaded the machine is
    assert main(["--scenarios", "burst_short", "--hash-algos", "xxhash", "--scale", "0.05",
                 "--rounds", "2", "--warmup", "1", "--min-time", "3600", "--max-rounds", "4",
                 "--tolerance", "100", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "scheduler/burst_short" in out and "hashing/xxhash" in out
    assert f"wrote 1 records to {report}" in out
    (record,) = load_records(report)  # A/A: the reference is the implementation
    assert record["kind"] == "benchmark" and record["implementation"]["name"] == "reference"
    by_case = {m["case"]: m for m in record["metrics"]}
    assert set(by_case) == {"scheduler/burst_short", "hashing/xxhash"}
    for metric in by_case.values():
        runs = metric["extra"]["runs"]
        assert len(runs) == 2
        assert [r["pairs"] for r in runs] == [4, 4], metric  # min_time wants more: the cap
        assert len(metric["samples"]) == sum(r["pairs"] for r in runs)
        assert metric["extra"]["moved"] == pytest.approx(
            abs(runs[1]["ratio"] / runs[0]["ratio"] - 1))
        assert len(metric["extra"]["paired_ratios"]) == len(metric["samples"])
    assert record["extra"]["stability"]["min_time_s"] == 3600
    assert record["environment"]["hardware_key"]


def test_bad_input_is_refused_before_measuring(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "dir.jsonl").mkdir()
    prefix = "python -m kvcheck.bench.stability: error: "
    for argv, message in (
            (["--report", str(tmp_path / "dir.jsonl")], f"--report {tmp_path / 'dir.jsonl'}: "),
            (["--scenarios", "trace:missing.jsonl"], "trace file missing.jsonl does not exist"),
            (["--impl", "no_such_module_xyz"], "--impl no_such_module_xyz: cannot import")):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(prefix + message) and err.count("\n") == 1, err


def test_protocol_layer_share_is_paired_against_the_manager_level(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The reference has the manager-level hook: its protocol layer is measured by pairing
    the two levels (a share with an interval around it), and ``--layers`` prints it."""
    from kvcheck.bench.stability import protocol_layer_share
    from kvcheck.bench.workload.scenarios import make_workload
    from kvcheck.conformance.loader import load_impl

    reference = load_impl("reference", call_timeout=None)
    share = protocol_layer_share(reference, make_workload("burst_short", scale=0.05),
                                 rounds=3, warmup=1, min_time=0)
    assert share is not None
    median, low, high = share
    assert low <= median <= high
    assert -0.9 < median < 5  # a share of the engine's time, not a raw ratio or a time
    assert main(["--runs", "0", "--layers", "--scenarios", "burst_short", "--scale", "0.05",
                 "--rounds", "3", "--min-time", "0"]) == 0
    out = capsys.readouterr().out
    assert "protocol, paired" in out
    line = next(x for x in out.splitlines() if x.startswith("burst_short"))
    assert line.count("%") == 5  # harness, protocol (proxy), paired median and interval


def test_protocol_layer_share_needs_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kvcheck.bench.replay import native
    from kvcheck.bench.stability import protocol_layer_share
    from kvcheck.bench.workload.scenarios import make_workload
    from kvcheck.conformance.loader import load_impl

    reference = load_impl("reference", call_timeout=None)
    monkeypatch.delattr(sys.modules["kvcheck.adapters.reference"], native.NATIVE_HOOK,
                        raising=False)
    assert protocol_layer_share(reference, make_workload("burst_short", scale=0.05)) is None
