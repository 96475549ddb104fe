"""KVCacheManager, full attention (docs/semantics.md#allocation; vLLM's test_prefix_caching)."""

from __future__ import annotations

import pytest
from kv_helpers import make_manager, schedule

from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.invariants import check_manager_invariants
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager


def queue_ids(mgr) -> list[int]:  # type: ignore[no-untyped-def]
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


def test_hit_cap_is_num_tokens_minus_one(profile: str) -> None:
    """A block-aligned 48-token prompt hits at most 2 of its 3 cached blocks (32 tokens)."""
    mgr = make_manager(profile, 20)
    r0 = mgr.make_request("0", list(range(48)))
    assert schedule(mgr, r0) == [1, 2, 3]
    r1 = mgr.make_request("1", list(range(48)))
    (hits,), num = mgr.get_computed_blocks(r1)
    assert [b.block_id for b in hits] == [1, 2] and num == 32
    # 49 tokens: the cap is 48, so all three blocks hit.
    r2 = mgr.make_request("2", [*range(48), 7])
    (hits,), num = mgr.get_computed_blocks(r2)
    assert [b.block_id for b in hits] == [1, 2, 3] and num == 48


def test_block_aligned_prompt_recaches_its_last_block(profile: str) -> None:
    """docs/semantics.md#caching-full-blocks: the recomputed last block is re-cached (no dedup)."""
    mgr = make_manager(profile, 20)
    r0 = mgr.make_request("0", list(range(32)))
    schedule(mgr, r0)
    r1 = mgr.make_request("1", list(range(32)))
    assert schedule(mgr, r1) == [3]
    assert mgr.get_block_ids("1") == ([1, 3],)
    key = mgr.block_pool.blocks[2].block_hash
    assert key is not None and mgr.block_pool.blocks[3].block_hash == key
    assert [b.block_id for b in mgr.block_pool.cached_block_hash_to_block.blocks_of(key)] == [2, 3]
    check_manager_invariants(mgr)


def test_get_computed_blocks_has_no_side_effects(profile: str) -> None:
    """Lookup changes neither ref counts nor the free queue."""
    mgr = make_manager(profile, 10)
    r0 = mgr.make_request("0", list(range(40)))
    schedule(mgr, r0)
    mgr.free(r0)
    before = (queue_ids(mgr), [b.ref_cnt for b in mgr.block_pool.blocks])
    (hits,), _ = mgr.get_computed_blocks(mgr.make_request("1", list(range(40))))
    assert [b.block_id for b in hits] == [1, 2]
    assert (queue_ids(mgr), [b.ref_cnt for b in mgr.block_pool.blocks]) == before


def test_lazy_removal_hit_on_free_block_leaves_queue(profile: str) -> None:
    """A hit on a freed cached block removes it from the queue; free count == queue length."""
    mgr = make_manager(profile, 10)
    r0 = mgr.make_request("0", list(range(40)))
    schedule(mgr, r0)
    mgr.free(r0)
    assert mgr.num_free_blocks == 9
    r1 = mgr.make_request("1", list(range(40)))
    schedule(mgr, r1)
    assert mgr.get_block_ids("1")[0][:2] == [1, 2]
    assert 1 not in queue_ids(mgr) and 2 not in queue_ids(mgr)
    assert mgr.num_free_blocks == len(queue_ids(mgr)) == 6
    check_manager_invariants(mgr)


def test_evicted_block_reused_as_partial_has_no_hash(profile: str) -> None:
    """test_hash_block_correct_reuse: eviction clears the hash before the block is reused."""
    mgr = make_manager(profile, 2)  # one usable block
    r0 = mgr.make_request("0", list(range(16)))
    schedule(mgr, r0)
    assert mgr.block_pool.blocks[1].block_hash is not None
    mgr.free(r0)
    r1 = mgr.make_request("1", list(range(100, 107)))
    assert schedule(mgr, r1) == [1]
    assert mgr.block_pool.blocks[1].block_hash is None
    assert len(mgr.block_pool.cached_block_hash_to_block) == 0


def test_own_hits_are_not_evicted_by_own_allocation(profile: str) -> None:
    """test_computed_blocks_not_evicted: touch happens before new blocks are popped."""
    mgr = make_manager(profile, 3)
    r0 = mgr.make_request("0", list(range(16)))
    assert schedule(mgr, r0) == [1]
    r1 = mgr.make_request("1", list(range(16, 32)))
    assert schedule(mgr, r1) == [2]
    mgr.free(r0)
    mgr.free(r1)
    assert queue_ids(mgr) == [1, 2]
    r2 = mgr.make_request("2", list(range(32)))
    hits, num = mgr.get_computed_blocks(r2)
    assert [b.block_id for b in hits[0]] == [1] and num == 16
    new = mgr.allocate_slots(r2, 16, num, hits)
    assert new is not None and [b.block_id for b in new[0]] == [2]
    assert mgr.get_block_ids("2") == ([1, 2],)


def test_caching_disabled_no_hits_and_none_when_short(profile: str) -> None:
    mgr = make_manager(profile, 4, enable_caching=False)
    r0 = mgr.make_request("0", list(range(40)))
    assert schedule(mgr, r0) == [1, 2, 3]
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)
    r1 = mgr.make_request("1", list(range(40)))
    assert mgr.get_computed_blocks(r1) == (([],), 0)
    assert mgr.allocate_slots(r1, 40) is None
    assert mgr.get_blocks("1") == ([],) and not mgr.coordinator.is_running("1")
    check_manager_invariants(mgr)


def test_failed_allocation_changes_nothing(profile: str) -> None:
    """docs/semantics.md#allocation, all or nothing: None leaves every
    ref_cnt and queue position as it was, hits included."""
    mgr = make_manager(profile, 6)
    r0 = mgr.make_request("0", list(range(48)))
    schedule(mgr, r0)  # blocks 1..3
    mgr.free(r0)
    r1 = mgr.make_request("1", list(range(48)) + list(range(500, 564)))  # 3 hits + 4 new
    hits, num = mgr.get_computed_blocks(r1)
    assert num == 48
    state = (queue_ids(mgr), [b.ref_cnt for b in mgr.block_pool.blocks],
             len(mgr.block_pool.cached_block_hash_to_block))
    assert mgr.allocate_slots(r1, r1.num_tokens - num, num, hits) is None
    assert (queue_ids(mgr), [b.ref_cnt for b in mgr.block_pool.blocks],
            len(mgr.block_pool.cached_block_hash_to_block)) == state
    group = mgr.coordinator.single_type_managers[0]
    assert "1" not in group.req_to_blocks and "1" not in group.num_cached_block
    check_manager_invariants(mgr)


def test_free_hits_count_against_capacity(profile: str) -> None:
    """Touching a free hit consumes a free block, so it counts in get_num_blocks_to_allocate."""
    mgr = make_manager(profile, 5)  # 4 usable
    r0 = mgr.make_request("0", list(range(32)))
    schedule(mgr, r0)
    mgr.free(r0)
    # 2 hit blocks (both free) + 2 new = 4 free blocks consumed: fits exactly.
    r1 = mgr.make_request("1", list(range(32)) + list(range(900, 932)))
    assert schedule(mgr, r1) is not None
    assert mgr.num_free_blocks == 0


def test_skip_reading_prefix_cache_still_writes(profile: str) -> None:
    """test_prefill_plp: no hits for a prompt-logprobs request, but its blocks are cached
    with the same hashes under different ids."""
    mgr = make_manager(profile, 20)
    r0 = mgr.make_request("0", list(range(40)))
    schedule(mgr, r0)
    r1 = mgr.make_request("1", list(range(40)), skip_reading_prefix_cache=True)
    assert mgr.get_computed_blocks(r1) == (([],), 0)
    assert schedule(mgr, r1) == [4, 5, 6]
    assert r1.block_hashes == r0.block_hashes
    pool = mgr.block_pool
    assert pool.blocks[4].block_hash == pool.blocks[1].block_hash
    assert pool.blocks[5].block_hash == pool.blocks[2].block_hash
    # A normal request still hits the first-inserted blocks.
    (hits,), _ = mgr.get_computed_blocks(mgr.make_request("2", list(range(40))))
    assert [b.block_id for b in hits] == [1, 2]
    check_manager_invariants(mgr)


def test_decode_hashes_block_when_full(profile: str) -> None:
    """test_decode: appending inside a preallocated block allocates nothing; a block is hashed
    by the allocate_slots that covers its last token; the new tail stays unhashed."""
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(20)))
    assert schedule(mgr, req) == [1, 2]
    pool = mgr.block_pool
    assert pool.blocks[2].block_hash is None
    for i in range(12):  # tokens 20..31 fill block 2 exactly
        req.append_output_token_ids(1000 + i)
        assert schedule(mgr, req, 1) == []
    assert pool.blocks[2].block_hash is not None
    req.append_output_token_ids(2000)
    assert schedule(mgr, req, 1) == [3]
    assert pool.blocks[3].block_hash is None
    check_manager_invariants(mgr)


def test_last_block_freed_unhashed_when_final_token_fills_it() -> None:
    """docs/semantics.md#caching-full-blocks: no allocate_slots follows the final token, so the
    block goes back unhashed: to the head in 0.33."""
    mgr = make_manager("vllm-0.33", 10)
    req = mgr.make_request("0", list(range(20)))
    schedule(mgr, req)
    for i in range(11):
        req.append_output_token_ids(i)
        schedule(mgr, req, 1)
    req.append_output_token_ids(99)  # the 32nd token; the request finishes here
    assert mgr.block_pool.blocks[2].block_hash is None
    mgr.free(req)
    assert queue_ids(mgr)[0] == 2 and queue_ids(mgr)[-1] == 1


def test_lookahead_slots_are_allocated_but_never_cached(profile: str) -> None:
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(16)))
    new = mgr.allocate_slots(req, 16, num_lookahead_tokens=4)
    assert new is not None and [b.block_id for b in new[0]] == [1, 2]
    assert mgr.block_pool.blocks[1].block_hash is not None
    assert mgr.block_pool.blocks[2].block_hash is None


def test_max_model_len_caps_slots(profile: str) -> None:
    mgr = make_manager(profile, 10, max_model_len=20)
    req = mgr.make_request("0", list(range(16)))
    new = mgr.allocate_slots(req, 16, num_lookahead_tokens=10)
    assert new is not None and len(new[0]) == 2  # 20 slots, not 26


def test_zero_new_tokens(profile: str) -> None:
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(10)))
    with pytest.raises(ValueError, match="num_new_tokens"):
        mgr.allocate_slots(req, 0)


def test_zero_new_tokens_with_hits_allowed_only_in_033() -> None:
    for profile, allowed in (("vllm-0.33", True), ("vllm-0.10", False)):
        mgr = make_manager(profile, 10)
        r0 = mgr.make_request("0", list(range(33)))
        schedule(mgr, r0)
        r1 = mgr.make_request("1", list(range(33)))
        hits, num = mgr.get_computed_blocks(r1)
        if allowed:
            assert mgr.allocate_slots(r1, 0, num, hits) == ([],)
        else:
            with pytest.raises(ValueError, match="num_new_tokens must be greater than 0"):
                mgr.allocate_slots(r1, 0, num, hits)


def test_misuse_is_rejected_without_state_change(profile: str) -> None:
    """Negative counts, a hit/token mismatch and hits for a running request raise clearly."""
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(40)))
    with pytest.raises(KVCacheMisuseError, match="num_new_tokens must be >= 0"):
        mgr.allocate_slots(req, -1)
    with pytest.raises(KVCacheMisuseError, match="num_lookahead_tokens"):
        mgr.allocate_slots(req, 4, num_lookahead_tokens=-2)
    schedule(mgr, req)
    other = mgr.make_request("1", list(range(40)))
    hits, num = mgr.get_computed_blocks(other)
    with pytest.raises(KVCacheMisuseError, match="num_new_computed_tokens"):
        mgr.allocate_slots(other, 8, num + 1, hits)
    with pytest.raises(KVCacheMisuseError, match="holds no blocks yet"):
        mgr.allocate_slots(req, 1, num, hits)
    check_manager_invariants(mgr)


def test_free_unknown_request_is_a_noop(profile: str) -> None:
    mgr = make_manager(profile, 4)
    mgr.free("never-seen")
    assert mgr.num_free_blocks == 3


def test_reset_prefix_cache(profile: str) -> None:
    """Fails while in use (map intact); after freeing succeeds, queue order unchanged."""
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(40)))
    schedule(mgr, req)
    assert mgr.reset_prefix_cache() is False
    assert len(mgr.block_pool.cached_block_hash_to_block) == 2
    mgr.free(req)
    order = queue_ids(mgr)
    assert mgr.reset_prefix_cache() is True
    assert len(mgr.block_pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)
    assert queue_ids(mgr) == order
    assert mgr.get_computed_blocks(mgr.make_request("1", list(range(40)))) == (([],), 0)


def test_num_common_prefix_blocks_per_profile() -> None:
    for profile, expected in (("vllm-0.33", 0), ("vllm-0.10", 2)):
        mgr = make_manager(profile, 10)
        a = mgr.make_request("a", list(range(40)))
        b = mgr.make_request("b", list(range(40)))
        schedule(mgr, a)
        schedule(mgr, b)
        assert mgr.get_num_common_prefix_blocks("a", 2) == [expected]


def test_preempted_request_is_reallocated_from_hits(profile: str) -> None:
    """Free (preemption) then re-admit: the request's own cached blocks are hits again."""
    mgr = make_manager(profile, 10)
    req = mgr.make_request("0", list(range(40)))
    schedule(mgr, req)
    mgr.free(req)
    req.num_computed_tokens = 0
    assert schedule(mgr, req) is not None
    assert mgr.get_block_ids("0")[0][:2] == [1, 2]
    check_manager_invariants(mgr)


def test_constructor_takes_block_size_or_specs() -> None:
    """One full-attention group from block_size, or one spec per group; never both/neither."""
    with pytest.raises(KVCacheMisuseError, match="exactly one of block_size"):
        KVCacheManager(8)
    with pytest.raises(KVCacheMisuseError, match="exactly one of block_size"):
        KVCacheManager(8, 4, kv_cache_specs=[FullAttentionSpec(4)])
    with pytest.raises(KVCacheMisuseError, match="block_size must be an int >= 1"):
        KVCacheManager(8, 0)
    one = KVCacheManager(8, 4)
    assert one.kv_cache_specs == (FullAttentionSpec(4),) and one.num_kv_cache_groups == 1
    assert (one.scheduler_block_size, one.hash_block_size, one.block_size) == (4, 4, 4)


def test_hits_must_come_one_list_per_group(profile: str) -> None:
    """A flat list of hit blocks, hit tokens without hit blocks, and hits for a request that
    already holds blocks (even with none cached yet) are refused with the fix named."""
    mgr = make_manager(profile, 10)
    r0 = mgr.make_request("0", list(range(40)))
    schedule(mgr, r0)
    r1 = mgr.make_request("1", list(range(40)))
    (hits,), num = mgr.get_computed_blocks(r1)
    with pytest.raises(KVCacheMisuseError, match="one list of blocks per KV-cache group"):
        mgr.allocate_slots(r1, 8, num, hits)  # flat, not (hits,)
    with pytest.raises(KVCacheMisuseError, match="2 hit lists for 1 groups"):
        mgr.allocate_slots(r1, 8, num, [hits, hits])
    with pytest.raises(KVCacheMisuseError, match="num_new_computed_tokens=16 but group 0"):
        mgr.allocate_slots(r1, 8, 16)
    short = mgr.make_request("2", list(range(5)))  # holds one partial block, caches none
    assert schedule(mgr, short) == [4]
    with pytest.raises(KVCacheMisuseError, match="holds no blocks yet"):
        mgr.allocate_slots(short, 1, num, (hits,))
    check_manager_invariants(mgr)
