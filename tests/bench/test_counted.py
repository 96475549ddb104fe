"""Counting instructions inside the measured region (kvcheck.bench.counted).

The counted tests run a small scheduler case under callgrind (~50x slower than natively, so
the region is a few requests) and skip without valgrind, naming the package to install.
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kvcheck.bench import counted
from kvcheck.bench.count_spread import SLOWED_TARGET
from kvcheck.bench.counted import CaseCount, CountedCase, CountingUnavailable
from kvcheck.bench.measure.allocator import SchedulerBench
from kvcheck.bench.workload.scenarios import make_workload
from kvcheck.conformance.loader import load_impl
from kvcheck.errors import KVCheckFailure
from kvcheck.results.schema import load_records

CASE = CountedCase("scheduler", "burst_short", scale=0.02)

needs_valgrind = pytest.mark.skipif(
    counted.unavailable_reason() is not None,
    reason="valgrind is not installed, so instructions cannot be counted "
           "(apt-get install valgrind)")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference_counts() -> list[CaseCount]:
    """The same case counted twice, side by side (a loaded machine, as in CI)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [c for group in pool.map(lambda _: counted.count_group([CASE]), range(2))
                for c in group]


def test_without_valgrind_counting_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counted.shutil, "which", lambda name: None)
    assert "apt-get install valgrind" in (counted.unavailable_reason() or "")
    with pytest.raises(CountingUnavailable, match="apt-get install valgrind"):
        counted.count_group([CASE])
    assert counted.main(["--bench", "scheduler"]) == 2


def test_total_is_read_from_callgrinds_summary(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("# callgrind format\nevents: Ir\nsummary: 1234567\nfn=x\n0 5\n"
                   "totals: 1234567\n", encoding="utf-8")
    assert counted._parse_total(out) == 1234567
    out.write_text("events: Ir\n", encoding="utf-8")
    with pytest.raises(KVCheckFailure, match="no summary line"):
        counted._parse_total(out)


def test_a_nested_call_tracing_inside_the_region_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested call would switch collection off inside the region: the child refuses it."""
    region = counted._Region()
    monkeypatch.setattr(sys, "call_tracing", region.guard)
    region.armed = True
    assert region.call(lambda x: x + 1, (1,)) == 2 and region.calls == 1
    with pytest.raises(KVCheckFailure, match=r"called sys\.call_tracing inside a counted call"):
        region.call(lambda: sys.call_tracing(len, ((),)), ())
    region.armed = False
    assert sys.call_tracing(len, ((1, 2),)) == 2  # outside the region it is the real one


@needs_valgrind
def test_two_counts_agree_and_cover_every_measured_call(
        reference_counts: list[CaseCount]) -> None:
    first, second = reference_counts
    assert abs(first.instructions - second.instructions) <= 0.005 * first.instructions
    # The measured calls of one round, from a native replay of the same workload.
    bench = SchedulerBench(load_impl("reference"), make_workload(
        CASE.case, seed=CASE.seed, scale=CASE.scale))
    args, _ = bench.setup()
    bench.run(*args)
    run = bench.results[-1]
    calls = len(run.allocate_ns) + len(run.lookup_ns) + len(run.free_ns)
    assert first.calls == calls
    # Python-level allocator calls cost thousands of instructions each, far from zero
    # (nothing collected) and far from a whole interpreter start-up (~1e9).
    assert 1_000 * calls < first.instructions < 1e6 * calls


@needs_valgrind
def test_an_extra_list_copy_per_allocate_slots_is_counted(
        reference_counts: list[CaseCount]) -> None:
    (slowed,) = counted.count_group([CASE], SLOWED_TARGET)
    assert slowed.calls == reference_counts[0].calls
    assert slowed.instructions > 1.01 * reference_counts[0].instructions


def _documented_counts() -> dict[str, int]:
    """Run 1's count of each case in docs/deterministic-cost.md's spread table, and the
    reference column of its demonstration table (``scheduler/`` added)."""
    text = (ROOT / "docs" / "deterministic-cost.md").read_text(encoding="utf-8")
    counts: dict[str, int] = {}
    for case, count in re.findall(r"^\| ((?:scheduler|hashing|slot_mapping)/[^|]+?) \| "
                                  r"([\d,]+) \|", text, re.MULTILINE):
        counts[case] = int(count.replace(",", ""))
    for case, count in re.findall(r"^\| ([a-z_]+) \| ([\d,]+) \| [\d,]+ \| \+", text, re.MULTILINE):
        assert counts[f"scheduler/{case}"] == int(count.replace(",", "")), case
    return counts


def test_the_documented_counts_follow_the_committed_baseline() -> None:
    """docs/deterministic-cost.md's tables were measured on the code of the committed baseline
    (results/records/reference-counted.jsonl): a change that moves the baseline by more than
    the gate's 1% must re-measure them (``kvcheck bench spread``)."""
    documented = _documented_counts()
    (record,) = load_records(ROOT / "results" / "records" / "reference-counted.jsonl")
    baseline = {m["case"]: m["value"] for m in record["metrics"]
                if m.get("name") == "instructions"}
    assert set(baseline) <= set(documented), sorted(set(baseline) - set(documented))
    moved = {case: f"{documented[case]:,} documented, {value:,.0f} in the baseline"
             for case, value in baseline.items()
             if abs(documented[case] - value) > 0.01 * value}
    assert not moved, moved
