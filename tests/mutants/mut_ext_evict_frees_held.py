"""Bug (block_pool.py): ``evict_blocks`` also releases the blocks it evicts.

The scheduler evicts the blocks of a failed KV load while their request still holds them;
releasing them drops a reference the request still owns (ref_cnt too low, the block back in
the free queue), so the next allocation hands a live block to another request. vLLM drops
only the hash-map entries and keeps ``ref_cnt`` and the queue as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

from _mutant_base import build

from kvcheck.reference_impl.block_pool import BlockPool


class EvictFrees(BlockPool):
    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        ids = list(block_ids)
        super().evict_blocks(ids)
        held = [self.blocks[i] for i in ids if self.blocks[i].ref_cnt > 0]
        self.free_blocks(held)  # BUG: the request still holds them


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_ext_evict_frees_held", pool_cls=EvictFrees)
