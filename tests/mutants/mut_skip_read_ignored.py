"""Bug (kv_cache_manager.py): ``get_computed_blocks`` ignores ``skip_reading_prefix_cache``.

A request that asks for prompt logprobs needs every prompt token computed, so vLLM marks it
``skip_reading_prefix_cache`` (no hits, but its blocks are still cached). Reading the cache
anyway skips the computation of the cached prompt tokens and their logprobs come back missing
or wrong.
"""

from __future__ import annotations

from _mutant_base import build

from kvcheck.reference_impl.block import KVCacheBlock
from kvcheck.reference_impl.kv_cache_manager import KVCacheManager
from kvcheck.reference_impl.request import Request


class ReadsAnywayManager(KVCacheManager):
    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        if not self.enable_caching:  # BUG: or request.skip_reading_prefix_cache
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        computed: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            hit = self.block_pool.get_cached_block(block_hash, (0,))
            if hit is None:
                break
            computed.append(hit[0])
        return computed, len(computed) * self.block_size


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_skip_read_ignored", manager_cls=ReadsAnywayManager)
