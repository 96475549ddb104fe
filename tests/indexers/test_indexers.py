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
from kvcheck.reference_impl.errors import IndexerInputError
from kvcheck.reference_impl.events import BlockStored
from kvcheck.reference_impl.kv_indexer import KVIndexer

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
    "mut_idx_partial_key_refused": {"test_partial_block_key_is_not_a_block"},
    "mut_idx_hashed_at_block_size": {"test_partial_block_key_is_not_a_block"},
    "mut_idx_partial_key_counted_as_block": {
        "test_partial_block_key_is_not_a_block",
        "test_partial_block_key_left_alone_is_not_a_block"},
    "mut_idx_mamba_keyed_as_attention": {"test_mamba_hashes_are_not_attention_hits"},
    "mut_idx_lookahead_ignored": {"test_lookahead_keys_cover_the_tokens_after_the_block",
                                  "test_random_clusters"},
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


def _stored(block_size: int, group: int = 0) -> BlockStored:
    return BlockStored(block_hashes=(b"\x01" * 8,), parent_block_hash=None,
                       token_ids=tuple(range(block_size)), block_size=block_size,
                       lora_id=None, group_idx=group)


def test_reference_refuses_a_match_group_of_another_kind() -> None:
    """A match group whose stores name a Mamba (or any non-attention) kind is a misconfigured
    router: its keys say a state is cached, not the prefix's attention blocks. The batch is
    refused, naming the kind and the fix, and the index is left as it was."""
    index = KVIndexer(4, int_hashes=True)
    with pytest.raises(IndexerInputError, match=r"'mamba' group.*Fix: configure match_group"):
        index.apply("w0", 0, [_stored(4)], group_kinds={0: "mamba", 1: "full_attention"})
    assert index.workers == {}
    index.apply("w0", 0, [_stored(4), _stored(4, group=1)],
                group_kinds={0: "full_attention", 1: "mamba"})
    assert set(index.workers["w0"].copies) == {(0, b"\x01" * 8), (1, b"\x01" * 8)}


@pytest.mark.parametrize(("block_size", "accepted"), [(4, True), (2, False), (16, False)])
def test_reference_takes_only_the_hash_blocks_one_hash_stores(block_size: int,
                                                              accepted: bool) -> None:
    """With blocks of 8 and a hash block of 4, a one-hash store of 4 tokens in the match
    group is a partial-block key (kept, never a block); a store of any other size is of
    other blocks, refused as before (dynamo PR #1233)."""
    index = KVIndexer(8, hash_block_size=4, int_hashes=True)
    if accepted:
        index.apply("w0", 0, [_stored(block_size)])
        assert index.workers["w0"].copies == {(0, b"\x01" * 8): 1}
    else:
        with pytest.raises(IndexerInputError, match=f"block_size {block_size}"):
            index.apply("w0", 0, [_stored(block_size)])
