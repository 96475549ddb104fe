"""Declared sizes and caching at finish (issue 24 items 3 and 4).

* Scripted tests run at the block and pool sizes an implementation declares
  (``kvcheck.conformance.sizes``): a design supporting only 256-token blocks gets every
  scripted generic test run at 256 (not skipped as not applicable), a larger declared size
  where the size matters, and pools within ``num_blocks_range``; under the vLLM profiles and
  for designs declaring no sizes the sizes written in the tests stay. Each test records the
  block sizes it ran at (``kv_block_sizes``).
* ``caches_running_requests``: ``finish_kv`` (``tests/designs``) caches a request's blocks
  only in ``free()``; it conforms to generic without the capability, and declaring it makes
  the lookups of running requests' blocks apply and fail it.

Each run is the shipped suite in-process (``inline_run``), on ``finish_kv`` with its
``IMPL_INFO`` replaced for the run.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

import kvcheck.conformance
from kvcheck.conformance.protocol import ImplInfo
from kvcheck.conformance.sizes import (
    BLOCK_SIZES_PROPERTY,
    DeclaredSizes,
    note_spec,
    recording_block_sizes,
    tokens,
)
from kvcheck.results.schema import load_records

DESIGNS = Path(__file__).resolve().parents[1] / "designs"  # finish_kv.py
SUITE = Path(kvcheck.conformance.__file__).parent

#: The scripted generic tests that apply to finish_kv (manager, prefix_caching,
#: ref_counts, free_queue_order): each must run and pass at its declared block sizes.
SCRIPTED = [
    "test_allocation.py::test_first_allocation",
    "test_allocation.py::test_initial_free_count",
    "test_allocation.py::test_capacity_exact_fit_then_none",
    "test_allocation.py::test_all_or_nothing",
    "test_allocation.py::test_returns_only_new_blocks",
    "test_allocation.py::test_decode_within_block_allocates_nothing",
    "test_allocation.py::test_chunked_prefill_matches",
    "test_allocation.py::test_ref_counts_follow_sharing",
    "test_prefix_caching.py::test_hit_cap_is_num_tokens_minus_one",
    "test_prefix_caching.py::test_partial_block_never_hits",
    "test_prefix_caching.py::test_shared_prefix_is_shared",
    "test_prefix_caching.py::test_hits_hold_the_requested_prefix",
    "test_prefix_caching.py::test_decode_blocks_become_hits",
    "test_prefix_caching.py::test_preempted_request_readmitted_from_cache",
    "test_eviction.py::test_lazy_eviction_freed_block_still_hits",
    "test_hashing.py::test_token_ids_are_not_truncated",
    "test_invariants.py::test_laws_hold_through_a_full_drain",
    "test_invariants.py::test_failed_allocation_leaks_nothing",
    "test_slot_mapping.py::test_flashinfer_csr_cross_check",
]
#: Those where the block size itself matters: also run at the next larger declared size.
SIZE_MATTERS = {
    "test_allocation.py::test_decode_within_block_allocates_nothing",
    "test_prefix_caching.py::test_hit_cap_is_num_tokens_minus_one",
    "test_prefix_caching.py::test_partial_block_never_hits",
    "test_slot_mapping.py::test_flashinfer_csr_cross_check",
}
#: The tests that look up a running request's blocks and fail a design caching at finish
#: that declares caches_running_requests anyway.
RUNNING_HITS = {
    "test_allocation.py::test_ref_counts_follow_sharing",
    "test_prefix_caching.py::test_partial_block_never_hits",
    "test_prefix_caching.py::test_shared_prefix_is_shared",
    "test_prefix_caching.py::test_hits_hold_the_requested_prefix",
    "test_prefix_caching.py::test_decode_blocks_become_hits",
}


def _base(nodeid: str) -> str:
    """``.../conformance/test_x.py::test_y[impl-param]`` -> ``test_x.py::test_y``."""
    path, _, name = nodeid.partition("::")
    return f"{Path(path).name}::{name.split('[')[0]}"


@pytest.fixture
def finish_cache(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``finish_kv``, importable for ``--kv-impl`` (its ``IMPL_INFO`` is set per test
    with ``monkeypatch``, and put back afterwards)."""
    monkeypatch.syspath_prepend(str(DESIGNS))
    return importlib.import_module("finish_kv")


def _run(pytester: pytest.Pytester, module: ModuleType, info: ImplInfo,
         monkeypatch: pytest.MonkeyPatch, *args: str) -> pytest.HookRecorder:
    monkeypatch.setattr(module, "IMPL_INFO", info)
    return pytester.inline_run("--kv-impl=finish_kv", "--kv-profile=generic",
                               "-p", "no:cacheprovider", "--kv-report=r.jsonl", *args)


def _calls(rec: pytest.HookRecorder) -> dict[str, pytest.TestReport]:
    """Node id -> the report that decided each test (its call, or the setup that skipped)."""
    out: dict[str, pytest.TestReport] = {}
    for report in rec.getreports("pytest_runtest_logreport"):
        if report.when == "call" or (report.when == "setup" and report.skipped):
            out[report.nodeid] = report
    return out


# ---------------------------------------------------------------- the whole suite at 256
@pytest.mark.parametrize(("block_sizes", "pools", "max_examples", "larger"), [
    ((256,), None, "40", None),
    ((256, 512, 768), (32, 64), "8", 512),
], ids=["only-256", "256-512-768-pools-32-64"])
def test_scripted_tests_run_at_the_declared_block_sizes(
        pytester: pytest.Pytester, finish_cache: ModuleType, monkeypatch: pytest.MonkeyPatch,
        block_sizes: tuple[int, ...], pools: tuple[int, int] | None, max_examples: str,
        larger: int | None) -> None:
    """A design declaring only large blocks (and a pool range) conforms to generic at its
    own sizes: every scripted test that applies ran and passed (none skipped as declining a
    size: the factory declines any other), at 256 and, where the size matters, at 512 too;
    the record says it conforms."""
    info = finish_cache.make_impl_info(block_sizes, pools)
    rec = _run(pytester, finish_cache, info, monkeypatch, f"--kv-max-examples={max_examples}")
    calls = _calls(rec)
    declined = {n: r.longrepr for n, r in calls.items() if r.skipped and "declines" in str(
        r.longrepr)}
    assert not declined, f"tests skipped at a size the design does not declare: {declined}"
    failed = {n: str(r.longrepr)[-600:] for n, r in calls.items() if r.failed}
    assert not failed, failed
    ran: dict[str, list[list[int]]] = {}
    for nodeid, report in calls.items():
        if report.passed:
            ran.setdefault(_base(nodeid), []).append(
                dict(report.user_properties)[BLOCK_SIZES_PROPERTY])
    missing = [t for t in SCRIPTED if t not in ran]
    assert not missing, f"scripted tests that did not run and pass: {missing}"
    for test in SCRIPTED:
        want = [256, larger] if larger and test in SIZE_MATTERS else [256]
        assert all(sizes == want for sizes in ran[test]), (test, ran[test], want)
    # The random workloads too drew only declared sizes.
    (workload,) = ran["test_invariants.py::test_laws_hold_under_random_workloads"]
    assert workload and set(workload) <= set(block_sizes), workload
    (record,) = load_records(pytester.path / "r.jsonl")
    assert record["conforms"] is True, record["verdict"]
    assert "finish_kv conforms to generic" in record["verdict"], record["verdict"]
    assert {record["outcomes"][n] for n in calls if _base(n) in SCRIPTED} == {"passed"}


# ---------------------------------------------------------------- caching at finish
def test_declaring_caches_running_requests_fails_a_design_caching_at_finish(
        pytester: pytest.Pytester, finish_cache: ModuleType,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared without the behaviour, the capability turns the lookups of running
    requests' blocks on, and the design fails exactly those tests, each for the hit it did
    not give; the same files pass without the declaration."""
    # -k, not paths: a path subset would cost a subprocess taking the suite's inventory.
    files = ["-k", "test_allocation or test_prefix_caching"]
    info = finish_cache.make_impl_info(extra=frozenset({"caches_running_requests"}))
    calls = _calls(_run(pytester, finish_cache, info, monkeypatch, *files))
    failed = {_base(n): str(r.longrepr) for n, r in calls.items() if r.failed}
    assert set(failed) == RUNNING_HITS, sorted(failed)
    assert "should hit" in failed["test_prefix_caching.py::test_decode_blocks_become_hits"]
    assert "should share a's first 3 blocks" in failed[
        "test_prefix_caching.py::test_shared_prefix_is_shared"]
    assert "b hit 0 tokens" in failed["test_prefix_caching.py::test_partial_block_never_hits"]

    calls = _calls(_run(pytester, finish_cache, finish_cache.make_impl_info(), monkeypatch,
                        *files))
    assert not [n for n, r in calls.items() if r.failed]
    assert {_base(n) for n, r in calls.items() if r.passed} >= RUNNING_HITS


# ---------------------------------------------------------------- the vLLM sizes stay
@pytest.mark.parametrize("profile", ["vllm-0.33", "generic"])  # vllm-0.10: as vllm-0.33
def test_reference_keeps_the_sizes_written_in_the_tests(pytester: pytest.Pytester,
                                                        profile: str) -> None:
    """The reference declares no sizes: under every profile each test runs at exactly the
    size it is written for (16 for the hit cap, 4 elsewhere), with no larger size added."""
    rec = pytester.inline_run(
        "--kv-impl=reference", f"--kv-profile={profile}", "-p", "no:cacheprovider",
        "-k", "hit_cap or partial_block_never or decode_within_block or slot_mapping_matches")
    calls = _calls(rec)
    sizes = {n: dict(r.user_properties)[BLOCK_SIZES_PROPERTY] for n, r in calls.items()
             if r.passed}
    assert len(sizes) == 6 and len(calls) == 6, {n: r.outcome for n, r in calls.items()}
    for nodeid, used in sizes.items():
        assert used == ([16] if "hit_cap" in nodeid else [4]), (nodeid, used)


# ---------------------------------------------------------------- the size rules
def test_sizes_under_vllm_profiles_and_without_declarations_are_the_usual_ones() -> None:
    declared = ImplInfo("x", "1", block_sizes=(256, 512), num_blocks_range=(32, 64))
    for sizes in (DeclaredSizes.of(declared, "vllm-0.33"), DeclaredSizes.of(declared,
                                                                            "vllm-0.10"),
                  DeclaredSizes.of(ImplInfo("y", "1"), "generic")):
        assert sizes.block_size(4) == 4 and sizes.block_size(16) == 16
        assert sizes.block_sizes_for(4) == [4] and sizes.num_blocks(6) == 6


def test_declared_sizes_under_generic() -> None:
    """The usual size when declared, else the smallest declared; the next larger declared
    size where the size matters; pools clamped into the range."""
    large = DeclaredSizes.of(ImplInfo("x", "1", block_sizes=(768, 256, 512),
                                      num_blocks_range=(32, 64)), "generic")
    assert large.block_size(4) == large.block_size(16) == 256
    assert large.block_sizes_for(4) == [256, 512]
    assert [large.num_blocks(n) for n in (2, 40, 100)] == [32, 40, 64]
    spec = large.spec(num_blocks=6, block_size=4, profile="generic", enable_caching=False)
    assert (spec.num_blocks, spec.block_size, spec.enable_caching) == (32, 256, False)
    nano = DeclaredSizes.of(ImplInfo("n", "1", block_sizes=(2, 4, 8, 16, 32)), "generic")
    assert nano.block_size(4) == 4 and nano.block_sizes_for(4) == [4, 8]
    assert nano.block_sizes_for(16) == [16, 32]
    top = DeclaredSizes.of(ImplInfo("t", "1", block_sizes=(256,)), "generic")
    assert top.block_sizes_for(16) == [256]  # no larger size declared: one run
    assert tokens(3, 256) == 768 and tokens(3, 16, -1) == 47 and tokens(0, 4, 3) == 3


def test_recordings_collect_the_sizes_of_the_specs_built_inside_them() -> None:
    """Each recording gets the block sizes noted while it is the innermost one (removed by
    identity: an equal recording left open stays)."""
    spec = DeclaredSizes().spec(num_blocks=4, block_size=16, profile="generic")
    note_spec(spec)  # no recording open: nothing to do
    with recording_block_sizes() as outer:
        with recording_block_sizes() as inner:
            note_spec(spec)
        with recording_block_sizes():
            pass
        note_spec(DeclaredSizes().spec(num_blocks=4, block_size=4, profile="generic"))
    assert (inner, outer) == ({16}, {4})
