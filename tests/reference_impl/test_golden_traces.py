"""Golden free-queue traces T1-T7, test_prefill, test_evict (docs/semantics.md#golden-traces).

Every expected list below is copied from that table, which was produced by running
vLLM 0.33.0's and 0.10.2's own BlockPool / KVCacheManager.
"""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.block_hasher import RequestBlockHasher
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.hashing import resolve_none_hash
from kvcheck.reference_impl.invariants import check_invariants, check_manager_invariants
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request

V033, V010 = "vllm-0.33", "vllm-0.10"


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def pool_request(profile: str, request_id: str, tokens: list[int], block_size: int = 4) -> Request:
    none_hash = resolve_none_hash("sha256", profile, pythonhashseed="0")
    hasher = RequestBlockHasher(block_size, "sha256", profile=profile, none_hash=none_hash)
    return Request(request_id, tokens, block_hasher=hasher)


@pytest.mark.parametrize(
    ("profile", "queue_after", "next3"),
    [
        (V033, [3, 2, 1, 4, 5, 6, 7, 8, 9], [3, 2, 1]),
        (V010, [4, 5, 6, 7, 8, 9, 3, 2, 1], [4, 5, 6]),
    ],
)
def test_t1_caching_off_free_reversed(profile: str, queue_after: list[int],
                                      next3: list[int]) -> None:
    """T1: caching off; unhashed frees go to the head (0.33) or the tail (0.10)."""
    pool = BlockPool(10, enable_caching=False, profile=profile)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [1, 2, 3]
    pool.free_blocks(reversed(blocks))
    assert queue_ids(pool) == queue_after
    assert [b.block_id for b in pool.get_new_blocks(3)] == next3
    check_invariants(pool)


def _t2(profile: str) -> tuple[BlockPool, Request, list[list[int]]]:
    pool = BlockPool(10, enable_caching=True, profile=profile)
    a = pool_request(profile, "A", list(range(10)))
    b = pool_request(profile, "B", list(range(100, 106)))
    blocks_a = pool.get_new_blocks(3)
    blocks_b = pool.get_new_blocks(2)
    pool.cache_full_blocks(a, blocks_a, 0, 2, 4)
    pool.cache_full_blocks(b, blocks_b, 0, 1, 4)
    assert [x.block_id for x in blocks_a] == [1, 2, 3]
    assert [x.block_id for x in blocks_b] == [4, 5]
    seen = []
    pool.free_blocks(reversed(blocks_a))
    seen.append(queue_ids(pool))
    pool.free_blocks(reversed(blocks_b))
    seen.append(queue_ids(pool))
    check_invariants(pool)
    return pool, a, seen


@pytest.mark.parametrize(
    ("profile", "after_a", "after_b"),
    [
        (V033, [3, 6, 7, 8, 9, 2, 1], [5, 3, 6, 7, 8, 9, 2, 1, 4]),
        (V010, [6, 7, 8, 9, 3, 2, 1], [6, 7, 8, 9, 3, 2, 1, 5, 4]),
    ],
)
def test_t2_head_tail_split(profile: str, after_a: list[int], after_b: list[int]) -> None:
    """T2: hashed frees go to the tail, unhashed to the head (0.33) / all to the tail (0.10)."""
    _, _, seen = _t2(profile)
    assert seen == [after_a, after_b]


@pytest.mark.parametrize(
    ("profile", "after_touch", "after_free"),
    [
        (V033, [5, 3, 6, 7, 8, 9, 2, 4], [5, 3, 6, 7, 8, 9, 2, 4, 1]),
        (V010, [6, 7, 8, 9, 3, 2, 5, 4], [6, 7, 8, 9, 3, 2, 5, 4, 1]),
    ],
)
def test_t3_hit_touch_free_refreshes_lru(profile: str, after_touch: list[int],
                                         after_free: list[int]) -> None:
    """T3: a hit on a free cached block leaves the queue on touch and returns at the tail."""
    pool, a, seen = _t2(profile)
    hit = pool.get_cached_block(a.block_hashes[0], [0])
    assert hit is not None and [b.block_id for b in hit] == [1]
    assert queue_ids(pool) == seen[-1] and hit[0].ref_cnt == 0  # a lookup has no side effect
    pool.touch(hit)
    assert queue_ids(pool) == after_touch
    assert hit[0].ref_cnt == 1
    pool.free_blocks(hit)
    assert queue_ids(pool) == after_free
    check_invariants(pool)


@pytest.mark.parametrize("profile", [V033, V010])
def test_t4_allocate_all_in_queue_order_empties_map(profile: str) -> None:
    """T4: allocating every free block returns them in queue order and evicts every key."""
    pool, _, _ = _t2(profile)
    order = queue_ids(pool)
    assert len(pool.cached_block_hash_to_block) == 3
    got = pool.get_new_blocks(pool.get_num_free_blocks())
    assert [b.block_id for b in got] == order
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in pool.blocks)
    check_invariants(pool)


@pytest.mark.parametrize("profile", [V033, V010])
def test_t5_duplicates_are_not_merged(profile: str) -> None:
    """T5: identical content cached twice: one key, two blocks, lookups return the first."""
    pool = BlockPool(10, enable_caching=True, profile=profile)
    r1 = pool_request(profile, "r1", [1, 2, 3, 4])
    r2 = pool_request(profile, "r2", [1, 2, 3, 4])
    b1 = pool.get_new_blocks(1)
    b2 = pool.get_new_blocks(1)
    pool.cache_full_blocks(r1, b1, 0, 1, 4)
    pool.cache_full_blocks(r2, b2, 0, 1, 4)
    assert len(pool.cached_block_hash_to_block) == 1
    hit = pool.get_cached_block(r1.block_hashes[0], [0])
    assert hit is not None and hit[0].block_id == 1
    key = b1[0].block_hash
    assert key is not None and b2[0].block_hash == key
    assert [b.block_id for b in pool.cached_block_hash_to_block.blocks_of(key)] == [1, 2]
    check_invariants(pool)


def _manager(profile: str, num_blocks: int, caching: bool = True) -> KVCacheManager:
    return KVCacheManager(
        num_blocks, 16, enable_caching=caching, profile=profile, pythonhashseed="0"
    )


def _schedule_prefill(mgr: KVCacheManager, req: Request) -> tuple[list[int], int, list[int]]:
    """get_computed_blocks + allocate_slots for the whole prompt, like the scheduler."""
    hits, num_hit_tokens = mgr.get_computed_blocks(req)
    new = mgr.allocate_slots(req, req.num_tokens - num_hit_tokens, num_hit_tokens, hits)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return [b.block_id for b in hits[0]], num_hit_tokens, [b.block_id for b in new[0]]


@pytest.mark.parametrize(
    ("profile", "after_r0", "after_r1", "r2_new"),
    [
        (V033, [6, 10, 5, 4, 3, 2, 1], [6, 10, 5, 4, 3, 2, 1, 9, 8, 7], [6]),
        (V010, [10, 6, 5, 4, 3, 2, 1], [10, 6, 5, 4, 3, 2, 1, 9, 8, 7], [10]),
    ],
)
def test_t6_test_evict(profile: str, after_r0: list[int], after_r1: list[int],
                       r2_new: list[int]) -> None:
    """T6 (vLLM test_evict): chain-tail-first eviction order and a 2-block hit."""
    mgr = _manager(profile, 11)
    last = 5 * 16 + 7
    r0 = mgr.make_request("0", list(range(last)))
    r1 = mgr.make_request("1", list(range(last, last + 3 * 16)))
    assert _schedule_prefill(mgr, r0) == ([], 0, [1, 2, 3, 4, 5, 6])
    assert _schedule_prefill(mgr, r1) == ([], 0, [7, 8, 9])
    mgr.free(r0)
    assert queue_ids(mgr.block_pool) == after_r0
    mgr.free(r1)
    assert queue_ids(mgr.block_pool) == after_r1
    r2 = mgr.make_request("2", list(range(2 * 16 + 3)))
    assert _schedule_prefill(mgr, r2) == ([1, 2], 32, r2_new)
    assert mgr.num_free_blocks == 7
    check_manager_invariants(mgr)


@pytest.mark.parametrize(
    ("profile", "after_free"), [(V033, [3, 2, 1, 4, 5]), (V010, [4, 5, 3, 2, 1])]
)
def test_t7_manager_caching_off(profile: str, after_free: list[int]) -> None:
    """T7: manager with caching off, 40 tokens on 3 blocks, then free."""
    mgr = _manager(profile, 6, caching=False)
    req = mgr.make_request("r", list(range(40)))
    assert _schedule_prefill(mgr, req) == ([], 0, [1, 2, 3])
    mgr.free(req)
    assert queue_ids(mgr.block_pool) == after_free
    check_manager_invariants(mgr)


@pytest.mark.parametrize(
    ("profile", "final_queue"),
    [(V033, [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]), (V010, [6, 7, 8, 9, 10, 4, 5, 3, 2, 1])],
)
def test_prefill_golden(profile: str, final_queue: list[int]) -> None:
    """vLLM test_prefill: shared 3-block prefix, ref_cnt 2, then the free order."""
    mgr = _manager(profile, 11)
    common = list(range(3 * 16))
    r0 = mgr.make_request("0", common + [1000 + i for i in range(7)])
    assert _schedule_prefill(mgr, r0) == ([], 0, [1, 2, 3, 4])
    for i, block in enumerate(mgr.get_blocks("0")[0]):
        # Full blocks are hashed with group 0; the partial last block is not.
        if i < 3:
            assert block.block_hash == r0.block_hashes[i] + b"\x00\x00\x00\x00"
        else:
            assert block.block_hash is None
        assert block.ref_cnt == 1
    free_before = mgr.num_free_blocks
    r1 = mgr.make_request("1", common + [2000 + i for i in range(5)])
    assert _schedule_prefill(mgr, r1) == ([1, 2, 3], 48, [5])
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 2, 2]
    assert mgr.num_free_blocks == free_before - 1
    check_manager_invariants(mgr)
    mgr.free(r0)
    mgr.free(r1)
    assert queue_ids(mgr.block_pool) == final_queue
    got = mgr.block_pool.get_new_blocks(10)
    assert [b.block_id for b in got] == final_queue
    check_invariants(mgr.block_pool)
