"""``FreeKVCacheBlockQueue``: free and evictable blocks, in eviction order.

An intrusive doubly linked list threaded through ``KVCacheBlock.prev_free_block`` /
``next_free_block`` between two sentinel nodes. The head is the next block to be allocated
(and, if it is cached, evicted). A ``deque`` cannot do the one operation prefix caching needs
constantly, O(1) removal from the middle when a cached free block is hit (``touch``), which is
why vLLM (and this reference) use an intrusive list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.errors import FreeQueueMisuseError, KVCacheMisuseError

# Neighbour getters for the batch check; a KVCacheBlock is always truthy (no __len__ or
# __bool__), so any(map(_PREV, blocks)) is "some block has a previous neighbour".
_PREV = attrgetter("prev_free_block")
_NEXT = attrgetter("next_free_block")

__all__ = ["FreeKVCacheBlockQueue"]


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks; every operation is O(1) per block.

    Invariants: ``num_free_blocks`` equals the number of linked blocks; a block is linked iff
    both its links are non-None; draining leaves the two sentinels linked to each other.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` in the given order (head = ``blocks[0]``)."""
        # Sentinels: never handed out, never counted. block_id -1 marks them in reprs.
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.num_free_blocks = 0
        self.append_n(blocks)

    def __len__(self) -> int:
        return self.num_free_blocks

    @staticmethod
    def is_linked(block: KVCacheBlock) -> bool:
        """True iff ``block`` is currently in a free queue."""
        return block.prev_free_block is not None and block.next_free_block is not None

    def popleft(self) -> KVCacheBlock:
        """Remove and return the head block.

        Raises:
            KVCacheMisuseError: ``"No free blocks available"`` on an empty queue (vLLM's message).
        """
        first = self.fake_free_list_head.next_free_block
        if first is None or first is self.fake_free_list_tail:
            raise KVCacheMisuseError("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the ``n`` head blocks in queue order; ``popleft_n(0) == []``.

        Raises:
            KVCacheMisuseError: if fewer than ``n`` blocks are free, or ``n < 0``; the queue is then
                unchanged.
        """
        if n < 0 or n > self.num_free_blocks:
            raise KVCacheMisuseError(
                f"popleft_n({n}) on a queue holding {self.num_free_blocks} free blocks"
            )
        out: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr is not None
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            out.append(curr)
            curr = nxt
        assert curr is not None
        self.fake_free_list_head.next_free_block = curr
        curr.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the queue.

        Raises:
            FreeQueueMisuseError: if ``block`` is not in the queue (a ``RuntimeError``, the
                type vLLM raises).
        """
        if not self.is_linked(block):
            raise FreeQueueMisuseError(
                f"remove() called on block {block.block_id}, which is not free")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` at the tail (evicted last)."""
        self.append_n((block,))

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the tail, keeping their order (the last one becomes the tail)."""
        blocks = self._check_unlinked(blocks)
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
        last.next_free_block = tail
        tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Splice ``blocks`` in front of the head keeping their order: ``blocks[0]`` becomes
        the head. A later ``prepend_n`` goes in front of this one (vLLM 0.33)."""
        blocks = self._check_unlinked(blocks)
        if not blocks:
            return
        head = self.fake_free_list_head
        first = head.next_free_block
        assert first is not None
        prev = head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Head to tail."""
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            yield curr
            curr = curr.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks, head to tail (the order they will be allocated in)."""
        return list(self)

    def _unlink(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        assert prev is not None and nxt is not None
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    @staticmethod
    def _check_unlinked(blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
        """Validate a batch before linking any of it, so a bad batch changes nothing."""
        blocks = list(blocks)
        # The common case, checked at C speed (map / set over the batch): no block is linked
        # (a linked block has both neighbours, sentinels included) and none is listed twice.
        # Only a bad batch takes the loop below, which names the offending block.
        if (not any(map(_PREV, blocks)) and not any(map(_NEXT, blocks))
                and len(set(map(id, blocks))) == len(blocks)):
            return blocks
        seen: set[int] = set()
        for block in blocks:
            # vLLM would silently corrupt the list here (vllm#42571); the reference refuses.
            if block.prev_free_block is not None or block.next_free_block is not None:
                raise FreeQueueMisuseError(
                    f"block {block.block_id} is already in the free queue; enqueuing it "
                    "twice would corrupt the list (double free?)"
                )
            if id(block) in seen:
                raise FreeQueueMisuseError(
                    f"block {block.block_id} listed twice in one enqueue")
            seen.add(id(block))
        raise AssertionError("unreachable: the fast check found a problem the loop did not")
