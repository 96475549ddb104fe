"""The ``indexer`` area has teeth and is fair: kvcheck's reference index, an independent
radix-tree index (``radix_indexer.py``, written from docs/indexers.md alone) and an index in
JavaScript (``js_index.mjs``, a Node.js process speaking the wire protocol:
``--kv-indexer='exec:node js_index.mjs'``) pass it under every profile; each mutant of the
reference index (``mut_idx_*.py``, one router bug each) fails it, in the scripted test named
after its bug.

Runs are in-process (``inner_runs.run_area``) on the area's module only, without shrinking.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
from inner_runs import run_area

import kvcheck.conformance

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
AREA = Path(kvcheck.conformance.__file__).resolve().parent / "test_indexer.py"
PROFILES = ("vllm-0.33", "vllm-0.10", "generic")

#: mutant -> the area's test functions it must fail (each its bug's scripted test; others
#: failing too is fine).
EXPECTED: dict[str, set[str]] = {
    "mut_idx_all_cleared_ignored": {"test_all_blocks_cleared_empties_only_its_worker"},
    "mut_idx_removed_on_every_worker": {"test_removal_touches_only_its_sender"},
    "mut_idx_arrival_order": {"test_replayed_store_never_lands_after_a_later_removal"},
    "mut_idx_applied_twice": {"test_replay_overlapping_the_live_stream_is_applied_once",
                              "test_duplicated_delivery_is_applied_once"},
    "mut_idx_gap_not_detected": {"test_replay_overlapping_the_live_stream_is_applied_once"},
    "mut_idx_restart_keeps_index": {"test_sequence_reset_clears_the_worker"},
    "mut_idx_lora_not_hashed": {"test_lora_and_base_model_do_not_share_blocks"},
    "mut_idx_block_size_unchecked": {"test_block_size_mismatch_is_refused"},
    "mut_idx_partial_block_counted": {"test_partial_block_is_never_a_prefix_block"},
    "mut_idx_removed_drops_every_copy": {"test_removal_of_one_copy_keeps_the_other"},
    "mut_idx_group_ignored": {"test_sliding_window_group_keeps_its_own_keys"},
    "mut_idx_unknown_removal_raises": {"test_removal_of_an_unknown_hash_is_ignored"},
    "mut_idx_removed_worker_kept": {"test_removed_worker_is_never_named"},
    "mut_idx_medium_ignored": {"test_other_media_are_not_the_gpu_cache"},
}


def test_every_mutant_is_listed() -> None:
    assert sorted(p.stem for p in HERE.glob("mut_idx_*.py")) == sorted(EXPECTED)


#: The JavaScript index over the wire (docs/wire-protocol.md).
JS_INDEX = f"exec:node {shlex.quote(str(HERE / 'js_index.mjs'))}"
INDEXERS = ["reference", "radix_indexer", pytest.param(JS_INDEX, id="js_index", marks=(
    pytest.mark.skipif(shutil.which("node") is None,
                       reason="Node.js is not installed (js_index.mjs runs on it)")))]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("indexer", INDEXERS)
def test_indexers_pass_the_area(pytester: pytest.Pytester, indexer: str, profile: str) -> None:
    # 10 random clusters per test: the eight-worker one alone took most of a run at 25 (nine
    # runs here); the reference index runs at the default count under every profile in .ci/run.
    outcome = run_area(pytester, AREA, indexer, f"--kv-profile={profile}",
                       "--kv-max-examples=10", path=HERE, option="--kv-indexer")
    assert not outcome.failed, f"{indexer} under {profile} failed {sorted(outcome.failed)}"
    core = {"test_random_clusters", "test_eight_workers", "test_sequence_reset_clears_the_worker",
            "test_replayed_store_never_lands_after_a_later_removal",
            "test_lora_and_base_model_do_not_share_blocks"}
    assert core <= outcome.passed, sorted(core - outcome.passed)


@pytest.mark.parametrize("mutant", sorted(EXPECTED))
def test_each_mutant_fails_its_bugs_test(pytester: pytest.Pytester, mutant: str) -> None:
    expected = EXPECTED[mutant]
    outcome = run_area(pytester, AREA, mutant, "--kv-max-examples=5",
                       "-k", " or ".join(sorted(expected)), path=HERE, option="--kv-indexer")
    assert expected <= outcome.failed, (
        f"{mutant} passed {sorted(expected - outcome.failed)}: the area no longer catches it")
