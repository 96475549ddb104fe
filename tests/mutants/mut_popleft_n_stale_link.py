"""Bug (free_block_queue.py): ``popleft_n`` re-links the head sentinel to the new first
block but leaves that block's back link pointing at the last block popped.

The list is then inconsistent: removing the new head (a prefix hit on the head of the free
queue) writes its successor into a block that is no longer queued, and the sentinel keeps
pointing at the removed block, which stays reachable from the head while it is in use. It is
the corrupted-list class of vllm#42571 (peer-systems §4 #1: ``prev_free_block`` of the
sentinel asserting) and vllm#42085 (#10: ``popleft_n`` running dry).
"""

from __future__ import annotations

from typing import Any

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.errors import KVCacheMisuseError
from kvcheck.reference_impl.free_block_queue import FreeKVCacheBlockQueue


class StaleLinkQueue(FreeKVCacheBlockQueue):
    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n < 0 or n > self.num_free_blocks:
            raise KVCacheMisuseError(
                f"popleft_n({n}) on a queue holding {self.num_free_blocks} free blocks")
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
        # BUG: missing `curr.prev_free_block = self.fake_free_list_head`
        self.num_free_blocks -= n
        return out


class StaleLinkPool(BlockPool):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.free_block_queue.__class__ = StaleLinkQueue


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_popleft_n_stale_link", pool_cls=StaleLinkPool)
