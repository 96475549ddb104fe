"""BlockPool level (capability ``block_pool``), for projects that patch only vLLM's BlockPool:
the pool traces T1-T5 of docs/semantics.md#golden-traces, expected queues copied from there."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from kvcheck.conformance.protocol import VLLM_PROFILES, BlockPoolAdapter, KVCacheSpec, RequestView

if TYPE_CHECKING:
    from kvcheck.conformance.loader import ImplHandle

pytestmark = [pytest.mark.kv_capability("block_pool"),
              pytest.mark.kv_profiles(*VLLM_PROFILES)]

GOLDEN = {
    "vllm-0.33": {
        "t1_queue": [3, 2, 1, 4, 5, 6, 7, 8, 9], "t1_next": [3, 2, 1],
        "t2_after_a": [3, 6, 7, 8, 9, 2, 1], "t2_after_b": [5, 3, 6, 7, 8, 9, 2, 1, 4],
        "t3_touch": [5, 3, 6, 7, 8, 9, 2, 4], "t3_free": [5, 3, 6, 7, 8, 9, 2, 4, 1],
    },
    "vllm-0.10": {
        "t1_queue": [4, 5, 6, 7, 8, 9, 3, 2, 1], "t1_next": [4, 5, 6],
        "t2_after_a": [6, 7, 8, 9, 3, 2, 1], "t2_after_b": [6, 7, 8, 9, 3, 2, 1, 5, 4],
        "t3_touch": [6, 7, 8, 9, 3, 2, 5, 4], "t3_free": [6, 7, 8, 9, 3, 2, 5, 4, 1],
    },
}


def _pool(kv_impl: ImplHandle, kv_profile: str, caching: bool = True) -> BlockPoolAdapter:
    return kv_impl.make_block_pool(KVCacheSpec(num_blocks=10, block_size=4,
                                               enable_caching=caching, profile=kv_profile))


def test_t1_caching_off_free_order(kv_impl: ImplHandle, kv_profile: str) -> None:
    """T1: blocks [1,2,3] freed in reverse with caching off."""
    pool = _pool(kv_impl, kv_profile, caching=False)
    blocks = pool.get_new_blocks(3)
    assert blocks == [1, 2, 3], f"first get_new_blocks(3) returned {blocks}"
    pool.free_blocks(blocks[::-1])
    assert pool.free_block_ids() == GOLDEN[kv_profile]["t1_queue"]
    assert pool.get_new_blocks(3) == GOLDEN[kv_profile]["t1_next"]


def _t2(kv_impl: ImplHandle, kv_profile: str) -> tuple[BlockPoolAdapter, list[int], list[int]]:
    pool = _pool(kv_impl, kv_profile)
    a = RequestView("A", tuple(range(10)))
    b = RequestView("B", tuple(range(100, 106)))
    blocks_a, blocks_b = pool.get_new_blocks(3), pool.get_new_blocks(2)
    pool.cache_full_blocks(a, blocks_a, 0, 2)
    pool.cache_full_blocks(b, blocks_b, 0, 1)
    pool.free_blocks(blocks_a[::-1])
    after_a = pool.free_block_ids()
    pool.free_blocks(blocks_b[::-1])
    return pool, after_a, pool.free_block_ids()


def test_t2_hashed_to_tail(kv_impl: ImplHandle, kv_profile: str) -> None:
    """T2: hashed blocks to the tail, unhashed to the head (0.33) / everything to the tail."""
    _, after_a, after_b = _t2(kv_impl, kv_profile)
    assert (after_a, after_b) == (GOLDEN[kv_profile]["t2_after_a"],
                                  GOLDEN[kv_profile]["t2_after_b"])


def test_t3_touch_then_free_refreshes_lru(kv_impl: ImplHandle, kv_profile: str,
                                          kv_reference: ImplHandle) -> None:
    """T3: get_cached_block has no side effect; touch removes; free appends at the tail."""
    pool, _, after_b = _t2(kv_impl, kv_profile)
    ref = kv_reference.make_manager(KVCacheSpec(num_blocks=10, block_size=4, profile=kv_profile))
    ref.allocate_slots(RequestView("A", tuple(range(10))), 10)
    block_hash = ref.block_hashes("A")[0]
    hit = pool.get_cached_block(block_hash)
    assert hit == 1, f"get_cached_block(hash of A's block 0) = {hit}, expected block 1"
    assert pool.free_block_ids() == after_b, "get_cached_block must not change the queue"
    pool.touch([hit])
    assert pool.free_block_ids() == GOLDEN[kv_profile]["t3_touch"]
    pool.free_blocks([hit])
    assert pool.free_block_ids() == GOLDEN[kv_profile]["t3_free"]


def test_t4_allocate_all_in_queue_order_evicts(kv_impl: ImplHandle, kv_profile: str,
                                               kv_reference: ImplHandle) -> None:
    """T4: taking every free block returns them in queue order and empties the cache."""
    pool, _, after_b = _t2(kv_impl, kv_profile)
    assert pool.get_new_blocks(pool.num_free_blocks()) == after_b
    ref = kv_reference.make_manager(KVCacheSpec(num_blocks=10, block_size=4, profile=kv_profile))
    ref.allocate_slots(RequestView("A", tuple(range(10))), 10)
    assert pool.get_cached_block(ref.block_hashes("A")[0]) is None


def test_t5_duplicates_first_inserted_wins(kv_impl: ImplHandle, kv_profile: str,
                                           kv_reference: ImplHandle) -> None:
    """T5: two blocks cached under one key; lookups return the first."""
    pool = _pool(kv_impl, kv_profile)
    r1, r2 = RequestView("r1", (1, 2, 3, 4)), RequestView("r2", (1, 2, 3, 4))
    b1, b2 = pool.get_new_blocks(1), pool.get_new_blocks(1)
    pool.cache_full_blocks(r1, b1, 0, 1)
    pool.cache_full_blocks(r2, b2, 0, 1)
    pool.free_blocks(b1)
    pool.free_blocks(b2)
    ref = kv_reference.make_manager(KVCacheSpec(8, 4, profile=kv_profile))
    ref.allocate_slots(r1, 4)
    assert pool.get_cached_block(ref.block_hashes("r1")[0]) == 1, (
        "a key cached by blocks 1 then 2 must resolve to block 1 (first inserted)")
