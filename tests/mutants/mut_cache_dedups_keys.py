"""Bug (block_pool.py): ``cache_full_blocks`` skips a block whose key is already cached by
another block (deduplication), leaving it unhashed.

vLLM never deduplicates: a block-aligned prompt recomputes its last block, and that second
copy is cached under the same key too. Leaving it unhashed changes where it goes when freed
(the head of the free queue, reused first, instead of the tail), so the eviction order drifts
from vLLM's, and its ``BlockStored`` event is never sent. Radix-tree engines (SGLang) do
deduplicate: that is a different design, not the vLLM profile.
"""

from __future__ import annotations

from collections.abc import Sequence

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock, make_block_hash_with_group_id
from kvcheck.reference_impl.block_pool import BlockPool
from kvcheck.reference_impl.request import Request


class DedupPool(BlockPool):
    def cache_full_blocks(self, request: Request, blocks: Sequence[KVCacheBlock],
                          num_cached_blocks: int, num_full_blocks: int, block_size: int,
                          kv_cache_group_id: int = 0) -> None:
        # BUG: blocks whose key is already in the map are left out (not cached, no event)
        keep = list(blocks)
        for i in range(num_cached_blocks, min(num_full_blocks, len(request.block_hashes))):
            key = make_block_hash_with_group_id(request.block_hashes[i], kv_cache_group_id)
            if key in self.cached_block_hash_to_block and blocks[i].block_hash != key:
                keep[i] = self.null_block  # the reference skips null blocks
        super().cache_full_blocks(request, keep, num_cached_blocks, num_full_blocks,
                                  block_size, kv_cache_group_id)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_cache_dedups_keys", pool_cls=DedupPool)
