"""BlockPool: map semantics, events, eviction, reset and misuse (docs/semantics.md#blockpool)."""

from __future__ import annotations

import pytest
from kv_helpers import make_manager, schedule

from kvcheck.reference_impl.block import KVCacheBlock, make_block_hash_with_group_id
from kvcheck.reference_impl.block_hash_map import BlockHashToBlockMap
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcheck.reference_impl.invariants import check_invariants
from kvcheck.reference_impl.request import LoRARequest


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_null_block_is_block_zero_and_never_handed_out(profile: str) -> None:
    pool = BlockPool(5, profile=profile)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4
    assert [b.block_id for b in pool.get_new_blocks(4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="Cannot get 1 free blocks from the pool"):
        pool.get_new_blocks(1)


def test_usage() -> None:
    pool = BlockPool(5)
    assert pool.get_usage() == 0.0
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)
    assert BlockPool(1).get_usage() == 0.0


def test_map_first_inserted_wins_and_pop_by_id() -> None:
    """BlockHashToBlockMap: several blocks per key, lookup = first inserted, wrong-id pop is a
    no-op, an emptied key disappears (test_block_lookup_cache_*, test_maybe_evict_cached_block)."""
    m = BlockHashToBlockMap()
    key = make_block_hash_with_group_id(b"h" * 32, 0)
    b3, b5 = KVCacheBlock(3), KVCacheBlock(5)
    assert m.get_one_block(key) is None
    m.insert(key, b3)
    m.insert(key, b5)
    m.insert(key, b3)  # idempotent
    assert len(m) == 1 and m.get_one_block(key) is b3
    assert m.pop(key, 7) is None and m.blocks_of(key) == [b3, b5]
    assert m.pop(key, 3) is b3 and m.get_one_block(key) is b5
    assert m.pop(key, 5) is b5 and key not in m and len(m) == 0


def test_group_ids_make_distinct_keys() -> None:
    """The same hash in two groups gives two keys; a lookup needs every group to hit."""
    pool = BlockPool(10)
    mgr = make_manager("vllm-0.33", 10, block_size=4)
    req = mgr.make_request("r", [1, 2, 3, 4])
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, b[:1], 0, 1, 4, kv_cache_group_id=0)
    assert pool.get_cached_block(req.block_hashes[0], [0]) == [b[0]]
    assert pool.get_cached_block(req.block_hashes[0], [0, 1]) is None
    pool.cache_full_blocks(req, b[1:], 0, 1, 4, kv_cache_group_id=1)
    assert pool.get_cached_block(req.block_hashes[0], [0, 1]) == [b[0], b[1]]
    assert b[1].block_hash == req.block_hashes[0] + b"\x00\x00\x00\x01"
    assert len(pool.cached_block_hash_to_block) == 2


def test_double_free_and_duplicate_in_one_call_are_refused(profile: str) -> None:
    """vLLM drives ref_cnt to -1 (vllm#42571); the reference raises and changes nothing."""
    pool = BlockPool(6, profile=profile)
    blocks = pool.get_new_blocks(2)
    with pytest.raises(KVCacheMisuseError, match="listed twice"):
        pool.free_blocks([blocks[0], blocks[0]])
    assert [b.ref_cnt for b in blocks] == [1, 1]
    pool.free_blocks(blocks)
    snapshot = queue_ids(pool)
    with pytest.raises(KVCacheMisuseError, match="double free: block 2 has ref_cnt 0"):
        pool.free_blocks([blocks[1], blocks[0]])
    assert queue_ids(pool) == snapshot and [b.ref_cnt for b in blocks] == [0, 0]
    check_invariants(pool)


def test_touch_and_free_of_null_block_per_profile() -> None:
    """0.33 skips the null block entirely; 0.10.2 counts its ref_cnt but never enqueues it."""
    for profile, expected in (("vllm-0.33", 0), ("vllm-0.10", 1)):
        pool = BlockPool(4, profile=profile)
        pool.touch([pool.null_block])
        assert pool.null_block.ref_cnt == expected
        pool.free_blocks([pool.null_block])
        assert pool.null_block.ref_cnt == 0
        assert pool.null_block.block_id not in queue_ids(pool)


def test_shared_block_reaches_queue_only_at_zero(profile: str) -> None:
    pool = BlockPool(4, profile=profile)
    (b,) = pool.get_new_blocks(1)
    pool.touch([b])
    assert b.ref_cnt == 2
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and 1 not in queue_ids(pool)
    pool.free_blocks([b])
    assert 1 in queue_ids(pool)


def test_evict_blocks_drops_keys_regardless_of_ref_cnt() -> None:
    """0.33 evict_blocks: keys go, queue order stays, ref_cnt untouched; bad ids raise."""
    mgr = make_manager("vllm-0.33", 10)
    req = mgr.make_request("0", list(range(40)))
    schedule(mgr, req)
    pool = mgr.block_pool
    order = queue_ids(pool)
    pool.evict_blocks([1])
    assert pool.blocks[1].block_hash is None and pool.blocks[1].ref_cnt == 1
    assert len(pool.cached_block_hash_to_block) == 1 and queue_ids(pool) == order
    with pytest.raises(ValueError, match=r"block ids \[10\] outside \[0, 10\)"):
        pool.evict_blocks([2, 10])
    assert pool.blocks[2].block_hash is not None
    check_invariants(pool)


def test_events_stored_removed_cleared() -> None:
    """One BlockStored per cache call (tokens == bs * n, logical parent chain); reallocation
    without a lookup gives n BlockRemoved then one BlockStored; reset gives AllBlocksCleared."""
    mgr = make_manager("vllm-0.33", 5, block_size=4, enable_kv_cache_events=True)
    lora = LoRARequest("adapter", 7, "/p/a")
    req = mgr.make_request("0", list(range(10)), lora_request=lora)
    schedule(mgr, req)
    (stored,) = mgr.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == tuple(req.block_hashes[:2])
    assert stored.parent_block_hash is None
    assert stored.token_ids == tuple(range(8)) and stored.block_size == 4
    assert stored.lora_id == 7 and stored.lora_name == "adapter" and stored.group_idx == 0
    # One untagged extra-key tuple per block: the bare LoRA name.
    assert stored.extra_keys == (("adapter",), ("adapter",))
    assert mgr.take_events() == []
    # Decode two tokens: block 3 becomes full, cached with the logical parent block_hashes[1].
    req.append_output_token_ids([10, 11])
    schedule(mgr, req, 2)
    (stored2,) = mgr.take_events()
    assert stored2.parent_block_hash == req.block_hashes[1]
    assert stored2.block_hashes == (req.block_hashes[2],)
    assert stored2.token_ids == (8, 9, 10, 11)
    mgr.free(req)
    # Same content without a lookup (skip flag) takes all 4 blocks: the 3 cached ones are
    # evicted (one BlockRemoved each, in pop order 3, 2, 1), then one BlockStored.
    other = mgr.make_request("1", list(range(16)), lora_request=lora,
                             skip_reading_prefix_cache=True)
    assert schedule(mgr, other) == [4, 3, 2, 1]
    events = mgr.take_events()
    assert [type(e) for e in events] == [BlockRemoved] * 3 + [BlockStored]
    assert [e.block_hashes for e in events[:3]] == [(req.block_hashes[i],) for i in (2, 1, 0)]
    assert events[3].block_hashes == tuple(other.block_hashes)
    mgr.free(other)
    assert mgr.reset_prefix_cache()
    assert mgr.take_events() == [AllBlocksCleared()]


def test_events_disabled_records_nothing() -> None:
    mgr = make_manager("vllm-0.33", 5, block_size=4)
    schedule(mgr, mgr.make_request("0", list(range(10))))
    assert mgr.take_events() == []


def test_reset_with_caching_off_returns_true_and_clears() -> None:
    """docs/semantics.md#reset: with caching off, reset still succeeds once every block is free."""
    mgr = make_manager("vllm-0.33", 5, enable_caching=False, enable_kv_cache_events=True)
    req = mgr.make_request("0", list(range(20)))
    schedule(mgr, req)
    assert mgr.reset_prefix_cache() is False
    mgr.free(req)
    assert mgr.reset_prefix_cache() is True
    assert mgr.take_events() == [AllBlocksCleared()]


def test_event_parent_physical_in_010() -> None:
    """0.10.2 takes the parent from the physical previous block (same value when it is cached)."""
    mgr = make_manager("vllm-0.10", 5, block_size=4, enable_kv_cache_events=True)
    req = mgr.make_request("0", list(range(6)))
    schedule(mgr, req)
    mgr.take_events()
    req.append_output_token_ids([6, 7])
    schedule(mgr, req, 2)
    (stored,) = mgr.take_events()
    assert stored.parent_block_hash == req.block_hashes[0]
    assert stored.extra_keys is None and stored.lora_name is None
