"""FreeKVCacheBlockQueue: vLLM's test_kv_cache_utils cases (docs/semantics.md#the-free-queue)."""

from __future__ import annotations

import pytest

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.free_block_queue import FreeKVCacheBlockQueue


def _blocks(n: int) -> list[KVCacheBlock]:
    return [KVCacheBlock(block_id=i) for i in range(n)]


def _ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def test_initial_order_is_given_order() -> None:
    """The queue starts in the order the blocks are given."""
    blocks = _blocks(5)
    queue = FreeKVCacheBlockQueue([blocks[i] for i in (3, 1, 4, 0, 2)])
    assert _ids(queue) == [3, 1, 4, 0, 2]
    assert queue.num_free_blocks == 5


def test_popleft_drains_cleanly_and_raises_when_empty() -> None:
    """popleft returns head first; draining leaves the sentinels linked; empty raises."""
    blocks = _blocks(3)
    queue = FreeKVCacheBlockQueue(blocks)
    assert [queue.popleft().block_id for _ in range(3)] == [0, 1, 2]
    assert queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks)
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()
    queue.append_n(blocks[::-1])  # refilling works
    assert _ids(queue) == [2, 1, 0]


def test_popleft_n() -> None:
    """popleft_n returns the n head blocks in order, clears links; 0 gives []."""
    blocks = _blocks(6)
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft_n(0) == []
    got = queue.popleft_n(4)
    assert [b.block_id for b in got] == [0, 1, 2, 3]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
    assert _ids(queue) == [4, 5]
    assert queue.fake_free_list_head.next_free_block is blocks[4]
    assert blocks[4].prev_free_block is queue.fake_free_list_head
    with pytest.raises(ValueError, match=r"popleft_n\(3\) on a queue holding 2 free blocks"):
        queue.popleft_n(3)
    assert _ids(queue) == [4, 5]


def test_remove_from_middle_head_and_tail() -> None:
    """remove unlinks in O(1) from anywhere; removing a free-listed block twice raises."""
    blocks = _blocks(5)
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert _ids(queue) == [1, 3]
    assert queue.num_free_blocks == 2
    with pytest.raises(RuntimeError, match=r"remove\(\) called on block 2, which is not") as info:
        queue.remove(blocks[2])
    # vLLM raises RuntimeError here; the reference's error is also a kvcheck misuse error.
    assert isinstance(info.value, KVCacheMisuseError)


def test_append_and_append_n_keep_order() -> None:
    blocks = _blocks(6)
    queue = FreeKVCacheBlockQueue(blocks[:2])
    queue.append(blocks[5])
    queue.append_n([blocks[4], blocks[2]])
    assert _ids(queue) == [0, 1, 5, 4, 2]
    queue.append_n([])
    assert queue.num_free_blocks == 5


def test_prepend_n_keeps_order_and_goes_before_earlier_prepends() -> None:
    """list[0] becomes the head; a second prepend_n goes in front of the first."""
    blocks = _blocks(8)
    queue = FreeKVCacheBlockQueue(blocks[:2])
    queue.prepend_n([blocks[5], blocks[4]])
    assert _ids(queue) == [5, 4, 0, 1]
    queue.prepend_n([blocks[7], blocks[6]])
    assert _ids(queue) == [7, 6, 5, 4, 0, 1]
    assert queue.num_free_blocks == 6
    empty = FreeKVCacheBlockQueue([])
    empty.prepend_n([blocks[2], blocks[3]])
    assert _ids(empty) == [2, 3]


def test_enqueueing_a_queued_block_is_refused_without_changes() -> None:
    """A double enqueue (vllm#42571's corruption) raises and leaves the queue intact."""
    blocks = _blocks(4)
    queue = FreeKVCacheBlockQueue(blocks[:2])
    with pytest.raises(RuntimeError, match="already in the free queue"):
        queue.append_n([blocks[2], blocks[1]])
    with pytest.raises(RuntimeError, match="listed twice"):
        queue.prepend_n([blocks[3], blocks[3]])
    assert _ids(queue) == [0, 1]
    assert queue.num_free_blocks == 2
    assert blocks[2].next_free_block is None
