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
    def get_computed_blocks(self, request: Request,
                            ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        if not self.enable_caching:  # BUG: or request.skip_reading_prefix_cache
            return self.coordinator.empty_blocks(), 0
        return self.coordinator.find_longest_cache_hit(request, request.num_tokens - 1)


IMPL_INFO, make_kv_cache_manager, make_block_pool = build(
    "mut_skip_read_ignored", manager_cls=ReadsAnywayManager)
