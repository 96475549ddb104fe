"""Proof that the conformance suite has teeth: the shipped suite runs on mutants of the
reference (``mut_*.py`` here, one realistic bug each) and must fail each of them, in every area
that owns the bug; the unmodified reference (and the mutant wiring with no bug) must pass.

How the suite is run: ``pytester`` in-process (``inline_run``), as a user runs it, from an empty
directory with ``--kv-impl``, ``--kv-report`` and ``-p no:cacheprovider``. For speed a mutant
run is given only the suite modules of the areas it must fail (``EXPECTED``), uses
``--kv-max-examples=15`` and a Hypothesis profile without the shrink phase (a failing property
test would otherwise spend most of a minute shrinking; we only need the verdict), and skips
the rest of an area once one of its tests has failed (one failure is the verdict; the tests
skipped are mostly the slow random workloads); in-process runs also skip the child pytest
that counts the whole suite for a partial run's verdict. Mutants do not declare ``kernels``
(those tests would be skipped anyway), and keeping torch out of the in-process runs avoids
re-importing it after pytester's ``sys.modules`` restore. The control (``ctl_wiring``) runs
the whole suite but the kernels under the same settings; the reference runs go through
``runpytest_subprocess`` with default settings, kernels included under vllm-0.33: a clean
process, exactly what ``pytest --kv-impl=reference --kv-profile=...`` does.

``scripts/mutate.py`` complements these hand-written bugs with machine-made ones (operator
mutants of ``reference_impl/``); docs/mutation.md has the score.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from inner_runs import NoShrinkProfile
from kv_helpers import make_ref

import kvcheck.adapters.reference
import kvcheck.conformance
from kvcheck.results.schema import load_records

pytest_plugins = ["pytester"]

MUTANTS_DIR = Path(__file__).resolve().parent
SUITE_DIR = Path(kvcheck.conformance.__file__).resolve().parent
MUTANT_MAX_EXAMPLES = 15

#: mutant -> the conformance areas (suite module names) that must each fail at least one test.
#: The area that owns the bug, plus ``differential`` where the bug shows in nearly every random
#: workload (it then fails at any example count); other areas failing too is fine.
#: Free-order bugs show only when a workload frees a running request holding the right kind of
#: block, which the random workloads do in few examples: ``differential`` catches them under
#: about 80% of seeds, so it is not required of them. Which examples a derandomized run draws
#: is not fixed either: Hypothesis mixes in literals from every non-test module imported so far
#: (its "local constants"), so it depends on what else this process collected and ran.
EXPECTED: dict[str, set[str]] = {
    "mut_forward_free_order": {"eviction"},
    "mut_all_to_tail": {"eviction", "block_pool", "recorded"},
    "mut_hash_not_chained": {"hashing", "differential"},
    "mut_salt_every_block": {"hashing"},
    "mut_hit_cap_num_tokens": {"prefix_caching"},
    "mut_partial_block_cached": {"eviction"},
    "mut_evict_keeps_map_entry": {"block_pool", "eviction"},
    "mut_refcnt_leak_failed_alloc": {"allocation", "invariants"},
    "mut_touch_keeps_in_queue": {"prefix_caching", "block_pool"},
    "mut_block_to_two_requests": {"allocation", "prefix_caching"},
    "mut_null_block_handed_out": {"allocation"},
    "mut_slot_off_by_one": {"slot_mapping", "differential"},
    "mut_slot_wrong_block": {"slot_mapping", "differential"},
    "mut_events_no_parent": {"events"},
    "mut_none_hash_random": {"hashing", "differential"},
    "mut_lookup_touches": {"prefix_caching", "invariants"},
    "mut_allocate_returns_hits": {"allocation"},
    "mut_reset_while_in_use": {"prefix_caching"},
    # block.py
    "mut_removed_hash_wrong_end": {"events"},
    # block_hash_map.py
    "mut_map_returns_newest": {"block_pool", "prefix_caching"},
    "mut_map_pop_drops_key": {"edge_cases", "invariants"},
    # free_block_queue.py
    "mut_prepend_reversed": {"block_pool", "eviction"},
    "mut_popleft_n_stale_link": {"allocation", "invariants", "differential"},
    # events.py
    "mut_event_parent_field_renamed": {"events"},
    # extra_keys.py
    "mut_mm_item_end_inclusive": {"edge_cases"},
    "mut_extra_keys_mm_before_lora": {"hashing"},
    "mut_event_mm_offset_dropped": {"events"},
    # hashing.py
    "mut_xxhash_64bit": {"hashing"},
    "mut_seed_hashed_as_bytes": {"hashing", "differential"},
    # block_hasher.py
    "mut_block_tokens_as_list": {"hashing", "differential"},
    "mut_partial_block_hashed": {"hashing", "differential"},
    # Under generic only the scripted extra_key_kinds test catches it at the default settings
    # (tests/conformance/test_extra_key_kinds_gating.py).
    "mut_lora_left_out_of_key": {"hashing", "extra_key_kinds"},
    # request.py
    "mut_decode_tokens_not_hashed": {"prefix_caching", "hashing", "differential"},
    # profiles.py
    "mut_profile_033_random_root": {"hashing"},
    # block_table.py
    "mut_slot_bound_exclusive": {"slot_mapping", "differential"},
    # page_table.py
    "mut_csr_pages_floor": {"batch_metadata"},
    # invariants.py
    "mut_invariants_count_shared_twice": {"invariants", "prefix_caching"},
    # kv_cache_manager.py
    "mut_lookahead_cached_in_chunked_prefill": {"edge_cases"},
    "mut_free_hits_not_counted": {"allocation"},
    "mut_free_keeps_cached_count": {"prefix_caching", "differential"},
    "mut_skip_read_ignored": {"prefix_caching"},
    "mut_pop_before_touch": {"allocation", "prefix_caching"},
    # KV from outside the pool (external_kv, evict_blocks).
    "mut_ext_delay_caches": {"external_kv"},
    "mut_ext_one_phase": {"external_kv"},
    "mut_ext_evict_frees_held": {"external_kv"},
    "mut_ext_recache_from_start": {"external_kv"},
    "mut_ext_capacity_ignores_external": {"external_kv"},
    "mut_ext_window_skip_ignored": {"external_kv"},
    # block_pool.py
    "mut_cache_dedups_keys": {"prefix_caching", "events"},
    "mut_reset_no_cleared_event": {"events"},
    "mut_event_tokens_from_start": {"events"},
    # take_event_batch (the wire, tests/mutants/_wire_mutant_base.py): one per consumer bug
    # of spec kv-events-wire.md §5.
    "mut_wire_tagged_arrays": {"events_wire"},
    "mut_wire_removed_only_with_last_copy": {"events_wire"},
    "mut_wire_stored_once_per_hash": {"events_wire"},
    "mut_wire_sparse_tokens_trimmed": {"events_wire"},
    "mut_wire_int_hash_first_bytes": {"events_wire"},
    # The offload tier (offload_manager.py, offload_lru.py, offload_arc.py;
    # tests/mutants/_offload_mutant_base.py): one per rule of spec kv-connector-and-offload.md §3.
    "mut_off_evicts_pinned": {"offload"},
    "mut_off_pending_readable": {"offload"},
    "mut_off_partial_store": {"offload"},
    "mut_off_evicts_offered": {"offload"},
    "mut_off_lru_head_first": {"offload"},
    "mut_off_arc_promotes_twice": {"offload"},
}

class _SkipRestOfFailedArea:
    """Inner-run plugin: once a test of a suite module (an area) has failed, skip that
    module's remaining tests. The verdict per area needs one failure; the rest would only
    cost time (the random workloads of each area are its slowest tests)."""

    def __init__(self) -> None:
        self.failed: set[str] = set()

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid.split("::")[0] in self.failed:
            pytest.skip("mutant run: this area already has a failed test")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid.split("::")[0])


def _mutant_names() -> list[str]:
    return sorted(p.stem for p in MUTANTS_DIR.glob("mut_*.py"))


def _record(path: Path) -> dict[str, Any]:
    records = load_records(path)
    assert len(records) == 1, f"expected one record in {path}, got {len(records)}"
    return records[0]


def _failing_areas(record: dict[str, Any]) -> dict[str, int]:
    """area -> number of failed or errored tests."""
    return {area: c["failed"] + c["error"] for area, c in record["areas"].items()
            if c["failed"] + c["error"]}


def test_every_mutant_declares_its_areas() -> None:
    """Each mut_*.py file has an EXPECTED entry and vice versa; areas are suite modules."""
    assert set(_mutant_names()) == set(EXPECTED), (
        f"mut_*.py files {_mutant_names()} vs EXPECTED {sorted(EXPECTED)}")
    areas = {p.stem.removeprefix("test_") for p in SUITE_DIR.glob("test_*.py")}
    unknown = {m: a - areas for m, a in EXPECTED.items() if a - areas}
    assert not unknown, f"EXPECTED names areas with no suite module: {unknown}"


def _run_suite(pytester: pytest.Pytester, impl: str, *args: str, subprocess: bool = False,
               plugins: tuple[object, ...] = ()) -> tuple[pytest.RunResult, dict[str, Any]]:
    """Run the shipped suite on ``impl`` (in-process, or in a fresh interpreter for
    ``subprocess``); returns the run and its ``--kv-report`` record."""
    pytester.syspathinsert(MUTANTS_DIR)  # the mutants import as top-level modules
    report = pytester.path / "r.jsonl"
    argv = [f"--kv-impl={impl}", f"--kv-report={report}", "-p", "no:cacheprovider", *args]
    if subprocess:
        result = pytester.runpytest_subprocess(*argv)
    else:
        with pytest.MonkeyPatch.context() as patch:
            _no_inventory_subprocess(patch)
            result = pytester.runpytest_inprocess(*argv,
                                                  plugins=[NoShrinkProfile(), *plugins])
    assert report.exists(), (
        f"no --kv-report record from the {impl} run (exit {result.ret}):\n"
        + "\n".join(result.outlines[-40:]))
    return result, _record(report)


def _no_inventory_subprocess(patch: pytest.MonkeyPatch) -> None:
    """Stub the child pytest that collects the whole suite at the end of a partial run (for
    the completeness verdict; ~3 s each, most of an in-process run). These runs are partial
    on purpose and only their failing areas are read, so the verdict's "applicable" count is
    left unknown. Patched wherever the plugin imported it, so a module move does not undo it."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kvcheck.plugin") and hasattr(module, "inventory_subprocess"):
            patch.setattr(module, "inventory_subprocess", lambda *args, **kwargs: None)


@pytest.mark.parametrize("mutant", _mutant_names())
def test_suite_catches_mutant(pytester: pytest.Pytester, mutant: str) -> None:
    """The suite's modules of the areas EXPECTED names fail the mutant (exit 1), each one."""
    areas = [str(SUITE_DIR / f"test_{area}.py") for area in sorted(EXPECTED[mutant])]
    result, record = _run_suite(
        pytester, mutant, f"--kv-max-examples={MUTANT_MAX_EXAMPLES}", *areas,
        plugins=(_SkipRestOfFailedArea(),))
    failing = _failing_areas(record)
    print(f"{mutant}: failing areas {failing}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, (
        f"{mutant}: the suite exited {result.ret!r}, expected 1 (tests failed); failing "
        f"areas {failing}\n" + "\n".join(result.outlines[-30:]))
    assert record["conforms"] is False, record["verdict"]
    missed = sorted(EXPECTED[mutant] - set(failing))
    assert not missed, (
        f"{mutant}: no failed test in area(s) {missed}; failing areas: {failing}")
    if EXPECTED[mutant] == {"events_wire"} and mutant != "mut_wire_tagged_arrays":
        # The repro replays each step's drain too, where the stream's batches end (the
        # tagged-array mutant raises in its first take_event_batch: the traceback shows it).
        assert any("m.take_event_batch(0.0)  # -> <" in line for line in result.outlines), (
            "\n".join(result.outlines[-30:]))


def test_mutant_wiring_without_a_bug_passes(pytester: pytest.Pytester) -> None:
    """ctl_wiring (the mutant wiring, no bug) passes under the mutant-run settings, so each
    mutant's failures come from its bug alone."""
    result, record = _run_suite(
        pytester, "ctl_wiring", f"--kv-max-examples={MUTANT_MAX_EXAMPLES}",
        f"--ignore={SUITE_DIR / 'test_kernels.py'}")
    assert not _failing_areas(record) and result.ret == pytest.ExitCode.OK, (
        record["verdict"] + "\n" + "\n".join(result.outlines[-30:]))


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.10"])
def test_reference_passes_whole_suite(pytester: pytest.Pytester, profile: str) -> None:
    """The unmodified reference passes every test of the shipped suite at the mutant runs'
    example count (the baseline each mutant's failures are read against; the default 40
    examples are the main job's: README command 1, and CI's run under every profile), and
    the run prints its header and per-area table. The kernel area runs under vllm-0.33
    only: kernel numerics do not depend on a release (``test_kernels.py``), and the area is
    most of a run's time, interpreted; under vllm-0.10 the reference without kernels runs
    (``kv_helpers.make_ref``: a complete run, the kernel area not applicable)."""
    impl = "reference" if profile == "vllm-0.33" else make_ref(pytester).split("=", 1)[1]
    result, record = _run_suite(pytester, impl, f"--kv-profile={profile}",
                                f"--kv-max-examples={MUTANT_MAX_EXAMPLES}", subprocess=True)
    bad = {t: o for t, o in record["outcomes"].items() if o in ("failed", "error")}
    assert not bad and result.ret == pytest.ExitCode.OK, (
        f"reference under {profile}: {bad}\n" + "\n".join(result.outlines[-30:]))
    assert record["conforms"] is True and record["profile"] == profile, record["verdict"]
    assert record["complete"] is True and record["completeness"]["ran"] > 200
    if profile != "vllm-0.33":
        return
    # No test paths: the shipped suite ran; the header, the table and the verdict.
    result.stdout.fnmatch_lines([
        "kvcheck: reference * (kvcheck.adapters.reference) profile=vllm-0.33 seed=derandomized*",
        ("*capabilities: admission_gates, async_scheduling, batch_metadata, block_hashes, "
         "block_pool, block_zeroing, boundary_state_offloads, caching_off, "
         "chunked_local_attention, cross_attention, dcp, eagle, eagle_groups, event_wire, "
         "events*"),
        "*kvcheck conformance: reference*",
        "*allocation*",
        "*eviction*",
        "*kernels*58*",
        "verdict: reference conforms to vllm-0.33*",
    ])
