"""``check_invariants``: the laws every vLLM-style block pool keeps after every operation.

1. Conservation: ``free + evictable + referenced == total - reserved`` where *free* are queued
   blocks without a hash, *evictable* queued blocks with one, *referenced* blocks with
   ``ref_cnt > 0`` and *reserved* the null block.
2. ``ref_cnt >= 0`` for every non-null block.
3. A non-null block is in the free queue iff ``ref_cnt == 0``; the null block is never queued
   and never cached.
4. ``num_free_blocks`` equals the queue length, and the queue's links are consistent.
5. The map and the blocks agree: every map entry points at a block carrying that key (as its
   primary or a secondary key), and every key a block carries is in the map under it; only
   a block with a primary key has secondary keys.
6. (With the manager) each non-null block's ``ref_cnt`` equals the number of block-table
   entries holding it, over every KV-cache group, plus the copy-on-write copies not taken
   yet that retain it (each pending ``(src, dst)`` holds one reference on each); a held block
   belongs to one group and a cache key on it names that group; a full-attention table never
   holds the null block, and under ``vllm-0.33`` the null block keeps ``ref_cnt`` 0 (0.10.2
   counts null hits on it).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Protocol

from kvcheck.reference_impl.block import get_group_id
from kvcheck.reference_impl.errors import InvariantViolation
from kvcheck.reference_impl.kv_cache_interface import FullAttentionSpec

if TYPE_CHECKING:
    from kvcheck.reference_impl.block_pool import BlockPool
    from kvcheck.reference_impl.kv_cache_coordinator import KVCacheCoordinator

__all__ = ["InvariantViolation", "check_invariants", "check_manager_invariants"]


class ManagerState(Protocol):
    """What ``check_manager_invariants`` reads of a ``KVCacheManager`` (its pool and the
    coordinator holding the per-group block tables)."""

    @property
    def block_pool(self) -> BlockPool: ...

    @property
    def coordinator(self) -> KVCacheCoordinator: ...


def check_invariants(pool: BlockPool) -> None:
    """Raise ``InvariantViolation`` listing every broken law of ``pool`` (O(num_blocks))."""
    problems: list[str] = []
    queue = pool.free_block_queue

    # 4. walk the list, checking back links, and count it
    queued_ids: list[int] = []
    prev = queue.fake_free_list_head
    curr = prev.next_free_block
    while curr is not None and curr is not queue.fake_free_list_tail:
        if curr.prev_free_block is not prev:
            problems.append(f"free queue link broken at block {curr.block_id}")
            break
        queued_ids.append(curr.block_id)
        if len(queued_ids) > pool.num_gpu_blocks:
            problems.append("free queue has a cycle (more entries than blocks)")
            break
        prev, curr = curr, curr.next_free_block
    if len(queued_ids) != queue.num_free_blocks:
        problems.append(
            f"num_free_blocks counter is {queue.num_free_blocks} but the queue holds "
            f"{len(queued_ids)} blocks"
        )
    dup = [b for b, n in Counter(queued_ids).items() if n > 1]
    if dup:
        problems.append(f"blocks {dup} are in the free queue more than once")
    queued = set(queued_ids)

    # 2, 3
    null = pool.null_block
    if null.block_id in queued:
        problems.append(f"null block {null.block_id} is in the free queue")
    if null.block_hash is not None:
        problems.append(f"null block {null.block_id} carries a cache key")
    num_free = num_evictable = num_referenced = 0
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.ref_cnt < 0:
            problems.append(f"block {block.block_id} has ref_cnt {block.ref_cnt} < 0")
        in_queue = block.block_id in queued
        if in_queue != (block.ref_cnt == 0):
            problems.append(
                f"block {block.block_id}: ref_cnt={block.ref_cnt} but "
                f"{'in' if in_queue else 'not in'} the free queue (free <=> ref_cnt == 0)"
            )
        if in_queue:
            if block.block_hash is None:
                num_free += 1
            else:
                num_evictable += 1
        elif block.ref_cnt > 0:
            num_referenced += 1

    # 1
    total, reserved = pool.num_gpu_blocks, 1
    if num_free + num_evictable + num_referenced != total - reserved:
        problems.append(
            f"conservation: free ({num_free}) + evictable ({num_evictable}) + referenced "
            f"({num_referenced}) = {num_free + num_evictable + num_referenced} != "
            f"total ({total}) - reserved ({reserved}) = {total - reserved}"
        )

    # 5
    in_map: set[tuple[bytes, int]] = set()
    for key, blocks in pool.cached_block_hash_to_block.items():
        for block in blocks:
            in_map.add((key, block.block_id))
            if key not in pool.cache_keys_of(block):
                problems.append(
                    f"map key {key.hex()[:16]}... points at block {block.block_id}, which "
                    f"carries {None if block.block_hash is None else block.block_hash.hex()[:16]}"
                )
    problems.extend(
        f"block {block.block_id} carries key {key.hex()[:16]}... but the map does not list it"
        for block in pool.blocks
        for key in pool.cache_keys_of(block)
        if (key, block.block_id) not in in_map
    )
    problems.extend(
        f"block {block_id} has secondary cache keys but no primary key"
        for block_id in pool.cached_block_hashes_by_block
        if pool.blocks[block_id].block_hash is None
    )
    if problems:
        raise InvariantViolation("; ".join(problems))


def check_manager_invariants(manager: ManagerState) -> None:
    """``check_invariants`` on the manager's pool, plus law 6 over every group's block tables
    (see the module docstring); raises ``InvariantViolation`` listing every broken law."""
    pool = manager.block_pool
    check_invariants(pool)
    problems: list[str] = []
    holders: Counter[int] = Counter()
    owner: dict[int, int] = {}
    coordinator = manager.coordinator
    for group_id, group in enumerate(coordinator.single_type_managers):
        full = isinstance(group.kv_cache_spec, FullAttentionSpec)
        for request_id, blocks in group.req_to_blocks.items():
            for block in blocks:
                if block.is_null:
                    if full:
                        problems.append(f"request {request_id!r} holds the null block in "
                                        f"full-attention group {group_id}")
                    continue
                holders[block.block_id] += 1
                first = owner.setdefault(block.block_id, group_id)
                if first != group_id:
                    problems.append(f"one group per block: block {block.block_id} is held by "
                                    f"groups {first} and {group_id} (request {request_id!r})")
        for pair in group._pending_cow_copies:
            for block in pair:
                holders[block.block_id] += 1
                first = owner.setdefault(block.block_id, group_id)
                if first != group_id:
                    problems.append(f"one group per block: block {block.block_id} is retained "
                                    f"by a copy of group {group_id} and held by group {first}")
    for block in pool.blocks:
        if block.is_null:
            continue
        if block.ref_cnt != holders[block.block_id]:
            problems.append(
                f"block {block.block_id}: ref_cnt={block.ref_cnt} but "
                f"{holders[block.block_id]} block-table entries reference it"
            )
        key = block.block_hash
        if key is not None and block.block_id in owner and get_group_id(key) != owner[
                block.block_id]:
            problems.append(f"cache key group: block {block.block_id} of group "
                            f"{owner[block.block_id]} is cached under group {get_group_id(key)}")
    if not pool.profile.touch_null_ref_cnt and pool.null_block.ref_cnt != 0:
        problems.append(f"null block ref_cnt {pool.null_block.ref_cnt} (0.33 never touches it)")
    if problems:
        raise InvariantViolation("; ".join(problems))
